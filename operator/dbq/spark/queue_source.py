"""`dbq`: a queue itself as a DataFrame, read and written, on every design.

Batch read, `spark.read.format("dbq").option("queue", "orders")`:
- `mode=peek` (the default): a snapshot of at most `limit` waiting messages (default 10000),
  nothing removed or leased. One task.
- `mode=drain`: takes at most `limit` messages (required) off the queue, split over `partitions`
  tasks, each one consumer popping `batch` at a time. At most once: a message is removed when a
  task pops it (a batch read has no later point at which Spark confirms its output is durable),
  so if a task fails after popping, those messages are lost and Spark's retry pops other ones.

Streaming read, `spark.readStream.format("dbq").option("queue", "orders")`: at least once, none
lost. Each micro-batch's offsets are planned on the driver by moving messages off the queue
into the queue's staging table (`<queue>_staged`, stage `read:<stream>`, one seq per message),
`partitions` movers at once, `batch` messages a move:
- ring: one transaction pops the messages and stores them, so a message is on the queue or
  staged, never both and never neither. Should the driver die inside a move, the transaction
  rolls back and its messages come again once repair finds them (spec.timeouts.stalledAfter).
- pipes: acquire, store, ack. Should the driver die between storing and acking, the leases run
  out (spec.timeouts.visibility) and those messages come again: delivered twice.
An offset range (after, upto] is thereby a fixed set of rows that tasks, retried tasks and a
restarted query read identically; the rows go only in the reader's `commit`, which Spark calls
once the batch's output is durable (it lags a batch). While Spark runs a batch, the driver
stages the next one, so the next plan finds it ready; when the query stops, rows staged ahead
that Spark never got go back onto the queue (as new messages). A restarted query replays the
batches its checkpoint did not commit, and first hands out any rows staged beyond its
checkpoint (by a driver that died) before taking new ones. `maxMessagesPerTrigger` (default
10000) bounds a micro-batch: larger batches spread Spark's fixed cost of a batch (its offset
and commit logs and its tasks' start: most of a second here) over more messages, smaller ones
arrive sooner. Under
`Trigger.AvailableNow` a batch takes what is waiting. Two queries reading one queue at once need
different `stream` names.

Write, `df.write.format("dbq").option("queue", "orders").mode("append").save()` and
`df.writeStream.format("dbq")...`: each row's `body` (binary, or a string sent as UTF-8) becomes
a message. A task stores its rows in the staging table under its own random tag; the driver's
commit pushes exactly the tags of the tasks that succeeded (push_many, `batch` at a time) and
drops the stage, so a failed or retried task pushes nothing twice. A streaming write records
each published micro-batch (stage `published:<sink>`, seq = batch id): a batch replayed after a
restart is not pushed again. It needs a `sink` name, unique among the queries writing to the
queue. A crash of the driver inside the commit, between pushing and recording, duplicates that
batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from dbq.client import BrokerQueue, PipesQueue, Queue, connect_resource
from dbq.contract import headers as header_codec
from dbq.contract.headers import HeaderValue, StoredHeaders
from dbq.errors import InvalidSpec
from dbq.kube import Kube, current_namespace
from dbq.spark.options import Options, Source, SourceReader
from dbq.spark.staging import Staged, staging_of

log = logging.getLogger(__name__)

QUEUE_SCHEMA = (
    "namespace string, queue string, id string, body binary, attempts int, headers map<string,string>"
)
ARROW_NAMES = ["namespace", "queue", "id", "body", "attempts", "headers"]
HEADERS_TYPE = pa.map_(pa.string(), pa.string())
QUEUE_OPTIONS = {
    "queue": "the Queue resource's name (required)",
    "namespace": "its namespace (default: the current one)",
    "kubeconfig": "path of a kubeconfig (default: the pod's service account, else KUBECONFIG)",
    "mode": "batch read: peek (default; nothing removed) or drain (at most once)",
    "limit": "batch read: at most this many messages (peek default 10000; required for drain)",
    "partitions": "tasks at once: drain consumers, or streaming tasks per micro-batch (default 2)",
    "batch": "messages per pop_many, acquire_many or push_many call (default 500)",
    "stream": "streaming read: this query's stage name (default 'default'; one per concurrent query)",
    "maxMessagesPerTrigger": "streaming read: at most this many messages per micro-batch (default 10000)",
    "sink": "streaming write: a name unique among the queries writing to the queue (required)",
}
PEEK_LIMIT = 10_000
MAX_PER_TRIGGER = 10_000
READ_PAGE = 5_000  # seqs a streaming task reads at once (the blocks that hold them)
PUBLISHED_KEPT = 100  # published micro-batch ids remembered per sink
# The designs Spark reads and writes (a Service Broker queue has no staging table and no peek).
AnyQueue = Queue | PipesQueue
TASK_CLIENTS: dict[tuple[str | None, str, str], AnyQueue] = {}  # see QueueOptions.task_client


class QueueOptions:
    """The options every part of the `dbq` source reads: which queue, and how to reach it."""

    def __init__(self, options: Options) -> None:
        self.queue = options.text("queue")
        if not self.queue:
            raise InvalidSpec('dbq: option queue is required: .option("queue", "<Queue resource name>")')
        self.namespace = options.text("namespace") or current_namespace()
        self.kubeconfig = options.text("kubeconfig")
        self.tasks = options.count("partitions", 2)
        self.batch = options.count("batch", 500)

    def connect(self) -> AnyQueue:
        """A client of the queue; called where it is used (driver, or each task: they run from a
        pickled copy, so connections are opened there)."""
        api = Kube.for_kubeconfig(self.kubeconfig).api_client
        queue = connect_resource(self.queue, self.namespace, api_client=api)
        if isinstance(queue, BrokerQueue):
            queue.close()
            raise InvalidSpec(
                f"dbq: queue {self.queue} is a Service Broker queue: Spark reads and writes ring and pipes"
                " queues (its statistics are in the dbq-stats source)"
            )
        return queue

    def task_client(self) -> AnyQueue:
        """The client a task uses. Spark reuses a Python worker for later tasks, so each worker
        keeps one client per queue instead of reading the Queue and its Secret, and logging in,
        every task."""
        key = (self.kubeconfig, self.namespace, self.queue)
        client = TASK_CLIENTS.get(key)
        if client is None:
            client = TASK_CLIENTS[key] = self.connect()
        return client

    def rows(self, messages: Sequence[Any]) -> pa.RecordBatch:
        """Client messages as rows of QUEUE_SCHEMA: an Arrow batch, which Spark takes many times
        faster than tuples."""
        return self.queue_rows(
            pa.array([str(m.id) for m in messages], pa.string()),
            pa.array([m.body for m in messages], pa.binary()),
            pa.array([m.attempts for m in messages], pa.int32()),
            headers_column([m.headers for m in messages]),
        )

    def staged_rows(self, block: pa.RecordBatch) -> pa.RecordBatch:
        """A block of staged messages (dbq.spark.staging.BLOCK_SCHEMA) as rows of QUEUE_SCHEMA."""
        stored = block.column("headers")
        headers = (
            pa.array([[]] * len(stored), HEADERS_TYPE)
            if stored.null_count == len(stored)
            else headers_column([header_codec.decode(h) for h in stored.to_pylist()])
        )
        return self.queue_rows(block.column("id"), block.column("body"), block.column("attempts"), headers)

    def queue_rows(
        self, ids: pa.Array, bodies: pa.Array, attempts: pa.Array, headers: pa.Array
    ) -> pa.RecordBatch:
        n = len(ids)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([self.namespace] * n, pa.string()),
                pa.array([self.queue] * n, pa.string()),
                ids,
                bodies,
                attempts,
                headers,
            ],
            names=ARROW_NAMES,
        )


def headers_column(headers: Sequence[Mapping[str, HeaderValue]]) -> pa.Array:
    """Messages' headers as the `headers` column: a map of names to text (`header_codec.as_text`)."""
    return pa.array([list(header_codec.as_text(h).items()) for h in headers], HEADERS_TYPE)


def headers_field(schema: StructType) -> int | None:
    """The position of a written DataFrame's `headers` column (a map of names to values), if any."""
    for i, f in enumerate(schema.fields):
        if f.name == "headers":
            if not isinstance(f.dataType, MapType) or not isinstance(f.dataType.keyType, StringType):
                raise InvalidSpec(
                    f"dbq: column headers is {f.dataType.simpleString()}: make it a map<string,string>"
                    " (names to values), or drop it"
                )
            return i
    return None


# --- batch read -----------------------------------------------------------------------------
class BatchReader(SourceReader):
    def __init__(self, options: Options) -> None:
        self.q = QueueOptions(options)
        self.mode = options.text("mode", "peek")
        if self.mode == "drain":
            if "limit" not in options.values:
                raise InvalidSpec('dbq: option limit is required for mode=drain: .option("limit", "10000")')
            self.limit = options.count("limit", 0)
        elif self.mode == "peek":
            self.limit = options.count("limit", PEEK_LIMIT)
        else:
            raise InvalidSpec(f"dbq: option mode={self.mode!r}: write mode=peek or mode=drain")

    def partitions(self) -> list[InputPartition]:
        if self.mode == "peek":
            return [InputPartition(self.limit)]
        share, extra = divmod(self.limit, self.q.tasks)
        return [InputPartition(share + (1 if i < extra else 0)) for i in range(self.q.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        wanted: int = partition.value
        queue = self.q.task_client()
        if self.mode == "peek":
            yield self.q.rows(queue.peek(wanted))
            return
        while wanted > 0:
            messages: Sequence[Any] = queue.pop_many(min(self.q.batch, wanted), timeout=1.0)
            if not messages:
                return  # the queue stayed empty for a second
            wanted -= len(messages)
            yield self.q.rows(messages)


# --- streaming read -------------------------------------------------------------------------
@dataclass(frozen=True)
class SeqRange(InputPartition):
    """Staged rows after < seq <= upto."""

    after: int
    upto: int


def move_in_blocks(
    take: Callable[[int, int], int],
    after: int,
    cap: int | None,
    batch: int,
    pool: ThreadPoolExecutor,
    movers: int,
) -> int:
    """`take(first, want)` moves up to `want` messages as seqs first+1, first+2, ... and says how
    many; run by `movers` threads of `pool` at once (as many as drain consumers), `batch` at a
    time, until `cap` are moved (all that wait if None) or a take finds none. The last seq used.
    Each take reserves its block of seqs first: a block it does not fill leaves unused seqs,
    which an offset range simply does not find. A mover that sees the cap reached while others'
    takes are under way waits for them: one may come back short, and its share is still due."""
    done = threading.Condition()
    moved, asked, last = 0, 0, after  # asked: by takes under way
    next_first = after

    def mover() -> None:
        nonlocal moved, asked, last, next_first
        while True:
            with done:
                while True:
                    want = batch if cap is None else min(batch, cap - moved - asked)
                    if want > 0:
                        break
                    if asked == 0:
                        return
                    done.wait()
                first, next_first = next_first, next_first + want
                asked += want
            got = 0
            try:
                got = take(first, want)
            finally:
                with done:
                    asked -= want
                    moved += got
                    if got:
                        last = max(last, first + got)
                    done.notify_all()
            if not got:
                return  # the queue is empty, for now

    for f in [pool.submit(mover) for _ in range(movers)]:
        f.result()
    return last


class _Threads:
    """The driver's threads: the movers stay the same threads from batch to batch, as a pipes
    client holds its pipe lease per thread; one more stages a batch ahead."""

    def __init__(self, movers: int) -> None:
        self.movers = ThreadPoolExecutor(movers, thread_name_prefix="dbq-mover")
        self.ahead = ThreadPoolExecutor(1, thread_name_prefix="dbq-stage-ahead")

    def shutdown(self) -> None:
        self.ahead.shutdown()
        self.movers.shutdown()


class StreamReader(DataSourceStreamReader):
    def __init__(self, options: Options) -> None:
        self.q = QueueOptions(options)
        if "mode" in options.values or "limit" in options.values:
            raise InvalidSpec(
                "dbq: options mode and limit are for batch reads: a stream takes maxMessagesPerTrigger"
            )
        self.stage = f"read:{options.text('stream', 'default')}"
        self.per_trigger = options.count("maxMessagesPerTrigger", MAX_PER_TRIGGER)
        self._queue: AnyQueue | None = None  # the driver's client, opened on first use
        # Staged rows up to here are gone. commit(end) drops a batch's rows only when the next
        # batch is planned; a query stopped before that drops them when it starts again.
        self._dropped_upto = -1
        # While Spark runs a batch, the next one is staged (in a thread of its own) beyond the
        # last offset handed out: latestOffset then finds it ready.
        self._ahead: Future[int] | None = None
        self._offered: int | None = None
        self._threads_made: _Threads | None = None

    @property
    def _threads(self) -> _Threads:
        if self._threads_made is None:
            self._threads_made = _Threads(self.q.tasks)
        return self._threads_made

    def _driver_queue(self) -> AnyQueue:
        if self._queue is None:
            self._queue = self.q.connect()
        return self._queue

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        after = int(start["seq"])
        if isinstance(limit, ReadMaxRows):
            cap: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            cap = None
        else:
            raise InvalidSpec(
                f"dbq: read limit {type(limit).__name__} is not supported: use maxMessagesPerTrigger"
            )
        staging = staging_of(self._driver_queue())
        if after > self._dropped_upto:  # Spark asks for batch N+1 once batch N is durable
            staging.drop(self.stage, upto=after)
            self._dropped_upto = after
        self._settle()
        # Rows beyond `after`: staged ahead, or by a run that died before Spark logged them.
        end = staging.last(self.stage, after) or after
        if cap is None or end - after < cap:  # top up with what came since
            end = self._stage(end, None if cap is None else after + cap - end)
        self._offered = end
        if cap is not None:
            self._ahead = self._threads.ahead.submit(self._stage, end, cap)
        return {"seq": end}

    def _settle(self) -> None:
        """Wait for the batch being staged ahead, if any."""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            ahead.result()

    def _stage(self, after: int, cap: int | None) -> int:
        """Move up to `cap` messages (all that wait if None) into the stage; the last seq staged."""
        staging = staging_of(self._driver_queue())
        return move_in_blocks(
            lambda first, want: staging.take(self.stage, first, want),
            after,
            cap,
            self.q.batch,
            self._threads.movers,
            self.q.tasks,
        )

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        first, last = int(start["seq"]), int(end["seq"])
        step = max(1, -(-(last - first) // self.q.tasks))
        return [SeqRange(a, min(a + step, last)) for a in range(first, last, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SeqRange)
        staging = staging_of(self.q.task_client())
        for after in range(partition.after, partition.upto, READ_PAGE):
            for block in staging.batches(self.stage, after, min(after + READ_PAGE, partition.upto)):
                yield self.q.staged_rows(block)

    def commit(self, end: dict[str, int]) -> None:
        self._dropped_upto = int(end["seq"])
        staging_of(self._driver_queue()).drop(self.stage, upto=self._dropped_upto)

    def stop(self) -> None:
        """The rows staged ahead, which Spark never got, go back to the queue; rows it got stay
        for a restarted query."""
        try:
            self._settle()
            if self._offered is not None:
                staging_of(self._driver_queue()).give_back(self.stage, after=self._offered)
        finally:
            if self._threads_made is not None:
                self._threads_made.shutdown()
            if self._queue is not None:
                self._queue.close()
                self._queue = None


# --- write ----------------------------------------------------------------------------------
@dataclass
class StagedRows(WriterCommitMessage):
    """What a successful task stored: seq = tag << 32 | row number, rows 1..count."""

    tag: int
    count: int


def body_field(schema: StructType) -> int:
    """The position of the `body` column, which must be binary or string."""
    for i, f in enumerate(schema.fields):
        if f.name == "body":
            if not isinstance(f.dataType, BinaryType | StringType):
                raise InvalidSpec(
                    f"dbq: column body is {f.dataType.simpleString()}: cast it to binary or string"
                )
            return i
    raise InvalidSpec(
        f"dbq: a written DataFrame needs a column body (binary or string); it has {schema.names}"
    )


def row_headers(headers: Mapping[str, str] | None, queue: AnyQueue, row: int) -> str | None:
    """A written row's `headers` as stored, checked against the queue's limits when the row is
    staged, so a refused one fails the task before anything is published."""
    try:
        return header_codec.encode(headers, queue.header_limits)
    except (ValueError, TypeError) as e:
        raise InvalidSpec(f"dbq: column headers of row {row} of this task: {e}") from None


class QueueWriter(DataSourceWriter):
    """Stage in the tasks, publish in the driver's commit."""

    def __init__(self, options: Options, schema: StructType) -> None:
        self.q = QueueOptions(options)
        self.body = body_field(schema)
        self.headers = headers_field(schema)
        self.stage = f"write:{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> StagedRows:
        tag = uuid.uuid4().int >> 97  # 31 bits: this attempt's rows are tag << 32 | 1, 2, ...
        count = 0
        queue = self.q.task_client()
        staging = staging_of(queue)
        chunk: list[Staged] = []
        for row in iterator:
            value = row[self.body]
            body = value.encode() if isinstance(value, str) else bytes(value)
            count += 1
            headers = None if self.headers is None else row_headers(row[self.headers], queue, count)
            chunk.append(Staged(tag << 32 | count, "", body, 0, headers))
            if len(chunk) == self.q.batch:
                staging.put(self.stage, chunk)
                chunk = []
        if chunk:
            staging.put(self.stage, chunk)
        return StagedRows(tag, count)

    def publish(self, queue: AnyQueue, messages: list[WriterCommitMessage | None]) -> None:
        """Push the rows of the tasks that succeeded, in order; drop the stage."""
        staging = staging_of(queue)
        for m in messages:
            if not isinstance(m, StagedRows):
                continue  # a task that failed reports nothing; its rows go with the stage
            base = m.tag << 32
            for after in range(base, base + m.count, self.q.batch):
                rows = staging.rows(self.stage, after, min(after + self.q.batch, base + m.count))
                queue.push_many([r.body for r in rows], headers=[StoredHeaders(r.headers) for r in rows])
        staging.drop(self.stage)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.q.connect() as queue:
            self.publish(queue, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with contextlib.suppress(Exception), self.q.connect() as queue:  # else rows stay staged
            staging_of(queue).drop(self.stage)


class QueueStreamWriter(QueueWriter, DataSourceStreamWriter):
    """A write per micro-batch; a batch already published (a replay after restart) is skipped."""

    def __init__(self, options: Options, schema: StructType) -> None:
        super().__init__(options, schema)
        sink = options.text("sink")
        if not sink:
            raise InvalidSpec(
                'dbq: a streaming write needs option sink: .option("sink", "<name unique per query>")'
            )
        self.published = f"published:{sink}"

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        with self.q.connect() as queue:
            staging = staging_of(queue)
            if staging.rows(self.published, batchId - 1, batchId):
                staging.drop(self.stage)
                log.info("dbq sink %s: batch %d was published before: skipped", self.published, batchId)
                return
            self.publish(queue, messages)
            staging.put(self.published, [Staged(batchId, "", b"", 0)])
            staging.drop(self.published, upto=batchId - PUBLISHED_KEPT)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        super().abort(messages)


class QueueSource(Source):
    """`format("dbq")`: read (peek, drain, stream) and write (batch, stream) a queue; see the
    module docstring for the options and each one's delivery guarantee."""

    NAME = "dbq"
    SCHEMA = QUEUE_SCHEMA
    OPTIONS = QUEUE_OPTIONS
    READER = BatchReader

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.checked_options())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidSpec('dbq: a queue is only appended to: write with .mode("append")')
        return QueueWriter(self.checked_options(), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise InvalidSpec('dbq: a queue is only appended to: write with outputMode("append")')
        return QueueStreamWriter(self.checked_options(), schema)
