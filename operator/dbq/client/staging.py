"""A queue's staging area (`<queue>_staged`): rows keyed by (stage, seq) in the queue's own
database, where messages wait between the queue and a Spark job (`dbq.spark`).

- A streaming read (stage `read:<stream>`) moves messages off the queue into its stage, one seq
  per message: an offset range (after, upto] is then a fixed set of rows that any task, and a
  restarted query, reads again identically, until the query commits it and the rows go.
- A write (stage `write:...`) collects a task's rows before the driver publishes them, so a
  failed task attempt publishes nothing.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dbq.client.pipes import PipesQueue
from dbq.client.ring import Queue
from dbq.contract.staging import StagingStatements
from dbq.errors import LeaseLost

log = logging.getLogger(__name__)

PACKED_ROWS_PER_INSERT = 2000  # PostgreSQL
SQL_ROWS_PER_INSERT = 400  # 5 parameters a row: SQL Server takes at most 2100 parameters
CQL_IN_FLIGHT = 128  # concurrent inserts on Cassandra
GIVE_BACK_BATCH = 500  # messages per push_many when staged rows go back to the queue


@dataclass(frozen=True, slots=True)
class Staged:
    seq: int
    id: str
    body: bytes
    attempts: int

    def params(self, stage: str) -> tuple[Any, ...]:
        return (stage, self.seq, self.id, self.body, self.attempts)


class Staging(ABC):
    def __init__(self, statements: StagingStatements, queue: Queue | PipesQueue) -> None:
        self.sql = statements
        self.queue = queue

    @abstractmethod
    def put(self, stage: str, rows: Sequence[Staged]) -> None:
        """Store rows in `stage`. SQL refuses a seq already there (a second writer of one stage
        fails); Cassandra overwrites it."""

    @abstractmethod
    def take(self, stage: str, after: int, n: int) -> int:
        """Move up to n waiting messages off the queue into `stage`, as seqs after+1, after+2, ...;
        how many. Not one is lost if the process dies half-way (see each design)."""

    @abstractmethod
    def _query(self, statement: str, *params: Any) -> list[Any]: ...

    def rows(self, stage: str, after: int, upto: int) -> list[Staged]:
        """The rows of `stage` with after < seq <= upto, in seq order."""
        found = self._query(self.sql.rows, stage, after, upto)
        return [Staged(int(r[0]), str(r[1]), bytes(r[2]), int(r[3])) for r in found]

    def last(self, stage: str, after: int = -1) -> int | None:
        """The highest seq in `stage` above `after`, if any."""
        found = self._query(self.sql.last, stage, after)
        return int(found[0][0]) if found and found[0][0] is not None else None

    def give_back(self, stage: str, after: int) -> int:
        """Push the rows of `stage` above seq `after` back onto the queue (as new messages), then
        remove them; how many. A crash in between leaves them in both (at least once)."""
        last = self.last(stage, after)
        if last is None:
            return 0
        bodies = [r.body for r in self.rows(stage, after, last)]
        for start in range(0, len(bodies), GIVE_BACK_BATCH):
            self.queue.push_many(bodies[start : start + GIVE_BACK_BATCH])
        self._query(self.sql.delete_after, stage, after)
        return len(bodies)

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
            rows = [Staged(after + i, str(m.id), m.body, m.attempts) for i, m in enumerate(messages, 1)]
            self._insert(cur, stage, rows)
        return len(rows)

    def _insert(self, cur: Any, stage: str, rows: Sequence[Staged]) -> None:
        if self.queue.settings.backend == "postgres":
            packed = self.sql.insert_packed()
            for start in range(0, len(rows), PACKED_ROWS_PER_INSERT):
                chunk = rows[start : start + PACKED_ROWS_PER_INSERT]
                cur.execute(
                    packed,
                    stage,
                    b"".join(r.body for r in chunk),
                    ",".join(str(r.seq) for r in chunk),
                    ",".join(r.id for r in chunk),
                    ",".join(str(r.attempts) for r in chunk),
                    ",".join(str(len(r.body)) for r in chunk),
                )
            return
        for start in range(0, len(rows), SQL_ROWS_PER_INSERT):
            chunk = rows[start : start + SQL_ROWS_PER_INSERT]
            cur.execute(self.sql.insert_many(len(chunk)), *(v for r in chunk for v in r.params(stage)))

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
        for start in range(0, len(rows), CQL_IN_FLIGHT):
            self.queue._many(self.sql.insert, [r.params(stage) for r in rows[start : start + CQL_IN_FLIGHT]])

    def take(self, stage: str, after: int, n: int) -> int:
        """Acquire, store, then ack: should the process die before the ack, the leases run out
        and the messages come again (at least once)."""
        messages = self.queue.acquire_many(n, timeout=0)
        self.put(stage, [Staged(after + i, str(m.id), m.body, m.attempts) for i, m in enumerate(messages, 1)])
        try:
            self.queue.ack_many(messages)
        except LeaseLost as e:  # staged all the same: they will come again (at least once)
            log.warning("dbq staging %s: %s", stage, e)
        return len(messages)

    def _query(self, statement: str, *params: Any) -> list[Any]:
        return self.queue._x(statement, *params)


def staging_of(queue: Queue | PipesQueue) -> Staging:
    return SqlStaging(queue) if isinstance(queue, Queue) else CqlStaging(queue)
