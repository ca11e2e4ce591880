"""A queue's staging area (`<queue>_staged`) in the queue's own database, where messages wait
between the queue and a Spark job. Each message has a seq in its stage; messages are stored in
blocks: one row holds those with seqs first_seq..seq as an Arrow record batch (IPC stream
format), so a batch costs one row to store, and a task reads it as Arrow with no work per
message.

- A streaming read (stage `read:<stream>`) moves messages off the queue into its stage: an
  offset range (after, upto] is then a fixed set of messages that any task, and a restarted
  query, reads again identically, until the query commits it and the blocks go.
- A write (stage `write:...`) collects a task's rows before the driver publishes them, so a
  failed task attempt publishes nothing.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dbq.client.pipes import PipesQueue
from dbq.client.ring import Queue
from dbq.contract import headers as header_codec
from dbq.contract.headers import StoredHeaders
from dbq.contract.staging import StagingStatements
from dbq.errors import LeaseLost

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 20  # a block holds messages up to about this many bytes (Cassandra's mutation limit)
LAST_SEQ = 2**63 - 1  # no seq is above it
GIVE_BACK_BATCH = 500  # messages per push_many when staged messages go back to the queue
BLOCK_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()), ("id", pa.string()), ("body", pa.binary()), ("attempts", pa.int32()),
        ("headers", pa.string()),  # JSON text, null for none (blocks staged before headers lack it)
    ]
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Staged:
    seq: int
    id: str
    body: bytes
    attempts: int
    headers: str | None = None  # as stored: JSON text (`dbq.contract.headers`)


def staged(messages: Sequence[Any], after: int) -> list[Staged]:
    """Client messages as staged rows with seqs after+1, after+2, ..."""
    return [
        Staged(after + i, str(m.id), m.body, m.attempts, header_codec.text(m.headers))
        for i, m in enumerate(messages, 1)
    ]


def pack(rows: Sequence[Staged]) -> bytes:
    """Rows as one block's value: an Arrow IPC stream of one record batch (BLOCK_SCHEMA)."""
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([r.seq for r in rows], pa.int64()),
            pa.array([r.id for r in rows], pa.string()),
            pa.array([r.body for r in rows], pa.binary()),
            pa.array([r.attempts for r in rows], pa.int32()),
            pa.array([r.headers for r in rows], pa.string()),
        ],
        schema=BLOCK_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, BLOCK_SCHEMA) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


def unpack(packed: bytes, after: int, upto: int) -> pa.RecordBatch:
    """The messages of a block with after < seq <= upto."""
    batch = pa.ipc.open_stream(packed).read_next_batch()
    if batch.num_columns < len(BLOCK_SCHEMA):  # staged before headers: none
        batch = batch.append_column("headers", pa.nulls(batch.num_rows, pa.string()))
    seqs = batch.column(0)
    if pc.min(seqs).as_py() > after and pc.max(seqs).as_py() <= upto:
        return batch
    return batch.filter(pc.and_(pc.greater(seqs, after), pc.less_equal(seqs, upto)))


def blocks(rows: Sequence[Staged]) -> Iterator[tuple[int, int, bytes]]:
    """Rows (in seq order) as blocks: (last seq, first seq, packed), each about BLOCK_BYTES at most."""
    start, size = 0, 0
    for i, r in enumerate(rows):
        size += len(r.id) + len(r.body) + (len(r.headers.encode()) if r.headers else 0) + 16
        if size >= BLOCK_BYTES or i == len(rows) - 1:
            yield rows[i].seq, rows[start].seq, pack(rows[start : i + 1])
            start, size = i + 1, 0


class Staging(ABC):
    def __init__(self, statements: StagingStatements, queue: Queue | PipesQueue) -> None:
        self.sql = statements
        self.queue = queue

    @abstractmethod
    def put(self, stage: str, rows: Sequence[Staged]) -> None:
        """Store rows (in seq order, above any seq already in `stage`) in `stage`. SQL refuses
        a block ending on a seq already there (a second writer of one stage fails); Cassandra
        overwrites it."""

    @abstractmethod
    def take(self, stage: str, after: int, n: int) -> int:
        """Move up to n waiting messages off the queue into `stage`, as seqs after+1, after+2, ...;
        how many. Not one is lost if the process dies half-way (see each design)."""

    @abstractmethod
    def _query(self, statement: str, *params: Any) -> list[Any]: ...

    def batches(self, stage: str, after: int, upto: int) -> Iterator[pa.RecordBatch]:
        """The messages of `stage` with after < seq <= upto, in seq order, as Arrow batches
        (BLOCK_SCHEMA)."""
        for (packed,) in self._query(self.sql.blocks, stage, after, upto):
            yield unpack(bytes(packed), after, upto)

    def rows(self, stage: str, after: int, upto: int) -> list[Staged]:
        """The messages of `stage` with after < seq <= upto, in seq order."""
        return [
            Staged(*values)
            for b in self.batches(stage, after, upto)
            for values in zip(*b.to_pydict().values(), strict=True)
        ]

    def last(self, stage: str, after: int = -1) -> int | None:
        """The highest seq in `stage` above `after`, if any."""
        found = self._query(self.sql.last, stage, after)
        return int(found[0][0]) if found and found[0][0] is not None else None

    def give_back(self, stage: str, after: int) -> int:
        """Push the rows of `stage` above seq `after` back onto the queue (as new messages), then
        remove them; how many. A crash in between leaves them in both (at least once)."""
        rows = self.rows(stage, after, LAST_SEQ)
        for start in range(0, len(rows), GIVE_BACK_BATCH):
            some = rows[start : start + GIVE_BACK_BATCH]
            self.queue.push_many([r.body for r in some], headers=[StoredHeaders(r.headers) for r in some])
        self._query(self.sql.delete_after, stage, after)
        return len(rows)

    def drop(self, stage: str, upto: int | None = None) -> None:
        """Remove the rows of `stage` up to seq `upto`, or all of them."""
        if upto is None:
            self._query(self.sql.delete_stage, stage)
        else:
            self._query(self.sql.delete_upto, stage, upto)


class SqlStaging(Staging):
    queue: Queue

    def __init__(self, queue: Queue) -> None:
        super().__init__(StagingStatements(queue.settings.backend, queue.names), queue)

    def put(self, stage: str, rows: Sequence[Staged]) -> None:
        with self.queue._transaction() as cur:  # all or nothing
            self._insert(cur, stage, rows)

    def take(self, stage: str, after: int, n: int) -> int:
        """One transaction pops the messages and stores them: they are either on the queue or
        staged, never both and never neither."""
        with self.queue._transaction() as cur:
            messages = self.queue.pop_many_in(cur, n)
            self._insert(cur, stage, staged(messages, after))
        return len(messages)

    def _insert(self, cur: Any, stage: str, rows: Sequence[Staged]) -> None:
        for last, first, packed in blocks(rows):
            cur.execute(self.sql.insert, stage, last, first, packed)

    def _query(self, statement: str, *params: Any) -> list[Any]:
        with self.queue._cursor() as cur:
            cur.execute(statement, *params)
            return cur.fetchall() if cur.description else []


class CqlStaging(Staging):
    """Cassandra has no transaction across rows: a put that fails half-way leaves some rows
    staged. A streaming read hands them out on restart; their messages, never acked, also come
    again after their lease (at least once)."""

    queue: PipesQueue

    def __init__(self, queue: PipesQueue) -> None:
        super().__init__(StagingStatements("cassandra", queue.names), queue)

    def put(self, stage: str, rows: Sequence[Staged]) -> None:
        self.queue.db.many(self.sql.insert, [(stage, *block) for block in blocks(rows)])

    def take(self, stage: str, after: int, n: int) -> int:
        """Acquire, store, then ack: should the process die before the ack, the leases run out
        and the messages come again (at least once)."""
        messages = self.queue.acquire_many(n, timeout=0)
        self.put(stage, staged(messages, after))
        try:
            self.queue.ack_many(messages)
        except LeaseLost as e:  # staged all the same: they will come again (at least once)
            log.warning("dbq staging %s: %s", stage, e)
        return len(messages)

    def _query(self, statement: str, *params: Any) -> list[Any]:
        return self.queue.db.rows(statement, *params)


def staging_of(queue: Queue | PipesQueue) -> Staging:
    return SqlStaging(queue) if isinstance(queue, Queue) else CqlStaging(queue)
