"""The ring's data-plane contract: the routines a client calls, their arguments, the packed
answer format and the schema version. Provisioning creates routines that keep it; the client
calls them by it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from dbq.api.limits import DEFAULT_MAX_BODY_BYTES
from dbq.contract.headers import DEFAULT_HEADER_BYTES, DEFAULT_MAX_HEADERS
from dbq.names import QUOTE, QueueNames

# The content table's key leads with msg_id % CONTENT_BUCKETS, so concurrent pushes (consecutive
# ids) insert at that many places in its index, not all at its right edge.
CONTENT_BUCKETS = 8

# Version of the objects dbq creates for a ring queue. Bump it when routines or tables change;
# provisioning then re-creates the routines and records the new version, and a client refuses a
# queue of another version.
RING_SCHEMA_VERSION = 25
# Version of the PGMQ facade (schema pgmq, `dbq/backends/postgres/pgmq_facade.sql`), installed
# once per database: bump it when the facade changes, and provisioning installs it again.
PGMQ_FACADE_VERSION = 2

# The routines a client calls, with their parameter markers; the same in every dialect.
CALL_ARGS = {
    "push": "?, ?, ?",
    "push_many": "?, ?, ?, ?",
    "take": "?, ?",
    "pop": "?",
    "pop_many": "?, ?",
    "release": "?",
    "ack": "?, ?",
    "ack_many": "?, ?",
    "nack": "?, ?, ?, ?",
    "repair": "?",
    "void_holes": "?",
    "stats": "",
    "defer": "?, ?, ?, ?, ?",
    "extend": "?, ?, ?",
    "redrive": "?, ?",
    "purge_dead": "?, ?",
    "scavenge": "?, ?",
    # PostgreSQL only (version 20 on): what a login reads, through routines, not tables
    "describe": "",
    "wait": "?",
    "peek": "?",
    "history": "CAST(? AS timestamptz), CAST(? AS timestamptz)",
    "dead_letters": "?, ?",
    "archived": "CAST(? AS timestamptz), ?",
}
# The row contract (read, send, send_batch: version 21 on; delete, archive, set_vt by id: 22 on)
# is for workers in other languages; the Python client calls the packed routines above
# (docs/developers/any-language.md).
# PostgreSQL routines that answer with a row of several columns (the others with one value).
SET_RETURNING = frozenset(
    {"repair", "void_holes", "stats", "describe", "peek", "history", "dead_letters", "archived"}
)

# take, pop and pop_many answer with packed records, so a call returns one value whatever it
# took (no per-row or per-column work in the driver): status (1 byte), id (8), lease (8, 0 for
# none), attempts (4), headers length (4, 0 for none), body length (4), then the headers (JSON
# text: UTF-8 on PostgreSQL, UTF-16LE on SQL Server) and the body; integers big-endian, as both
# PostgreSQL's int*send() and SQL Server's CAST(... AS binary(n)) write them. A dialect may
# answer with several rows of records; the client reads them as one stream.
RECORD = struct.Struct(">bqqiii")
# status, id, lease (0: none), attempts, headers (JSON text, None for none), body
Record = tuple[int, int, int, int, str | None, bytes]
HEADER_ENCODING = {"postgres": "utf-8", "sqlserver": "utf-16-le"}
# Record statuses: a message; the queue is empty; position `id` was drawn but its message is not
# written yet (call take(id) until it arrives, or release it); the position is gone (draw again).
MESSAGE, EMPTY, NOT_WRITTEN, GONE = 0, 1, 2, 3
# A drawn position whose message is still not written after this long belongs to a pusher that
# died between drawing and writing: the popper gives it up (release) and draws again. The
# client's default; the row contract's read waits as long inside the database.
HOLE_GRACE_S = 2.0


@dataclass(frozen=True)
class RingTarget:
    """What a ring queue is declared to be: its names, slots and largest body."""

    names: QueueNames
    size: int
    message_bytes: int
    max_attempts: int = 0  # dead-letter a message acquired this many times and not acked; 0: never
    archive: bool = False  # keep acked and popped messages in the archive table ...
    archive_retention_s: float = 0.0  # ... until this old (cleanup scavenges older ones)
    # The queue whose dead-letter table keeps this queue's dead letters (spec.deadLetter.queue,
    # in the same database); None: its own.
    dead_letter_keeper: QueueNames | None = None
    header_bytes: int = DEFAULT_HEADER_BYTES  # spec.messages: the largest headers of a message ...
    max_headers: int = DEFAULT_MAX_HEADERS  # ... and how many
    # spec.messages.maxBytes: the largest body; one past message_bytes waits in the content table
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # spec.messages.compression (PostgreSQL): lz4, pglz or none; '' for the server's best, which
    # `ring_plan.choose_compression` resolves once the server is known ('' where it offers no choice)
    compression: str = ""
    # The database the queue lives in: its roles' names are derived from it (roles are the
    # server's, not the database's; `dbq.names.owner_role`). The backend sets it from its connection.
    database: str = ""
    # spec.pgmq.name: the PGMQ queue name the database's PGMQ facade maps to this queue ('' for none)
    pgmq_name: str = ""
    # spec.pgmq.topics: the PGMQ topic patterns bound to that name, sorted
    pgmq_topics: tuple[str, ...] = ()
    # The Queue provisioned this ring already: a size other than the ring's is resized online. A
    # Queue new to existing objects of another size is refused instead: they may be
    # another Queue's.
    resize: bool = False
    # spec.ring.autoGrow.maxSize (0: no autoGrow): a ring the upkeep grew to between `size` and
    # this is kept as it is, so a reconcile that read the status before the growth was recorded
    # never shrinks it back.
    grows_to: int = 0

    @property
    def dead_letter_queue(self) -> str:
        """What the metadata row records of dead_letter_keeper: schema.queue, or '' for the queue itself."""
        return self.dead_letter_keeper.qualified if self.dead_letter_keeper is not None else ""


def notify_channel(names: QueueNames) -> str:
    """The PostgreSQL channel a push onto an empty queue notifies (`dbq.client.notify`): at most
    63 characters, letters and digits only, for any schema and queue."""
    return "dbq_" + hashlib.sha1(f"{names.schema}.{names.queue}".encode()).hexdigest()[:24]


def records(blob: bytes, encoding: str = "utf-8") -> Iterator[Record]:
    """(status, id, lease, attempts, headers, body) of each packed record in `blob`; headers
    are decoded from `encoding` (the dialect's, `HEADER_ENCODING`)."""
    view = memoryview(blob)
    at, end = 0, len(blob)
    while at < end:
        status, msg_id, lease, attempts, header_length, length = RECORD.unpack_from(view, at)
        at += RECORD.size
        headers = str(view[at : at + header_length], encoding) if header_length else None
        at += header_length
        yield status, msg_id, lease, attempts, headers, bytes(view[at : at + length])
        at += length


def call_statement(backend: str, names: QueueNames, verb: str) -> str:
    """The statement that calls routine `verb` of the queue: one batch, one round trip, one
    transaction (on SQL Server XACT_ABORT rolls it all back on any error, as a PostgreSQL
    function call does)."""
    quote = QUOTE[backend]
    routine = f"{quote(names.schema)}.{quote(names.routine(verb))}"
    args = CALL_ARGS[verb]
    if backend == "sqlserver":
        return f"SET XACT_ABORT ON; BEGIN TRAN; EXEC {routine} {args}; COMMIT TRAN;".replace(" ;", ";")
    if verb in SET_RETURNING:
        return f"SELECT * FROM {routine}({args})"
    return f"SELECT {routine}({args})"  # one value: a plain call skips the function scan


def stats_of_many(queues: Sequence[QueueNames]) -> str:
    """PostgreSQL: the statistics of many queues in one statement, each row led by the queue's
    index in `queues` (as `stats`' row: no parameter)."""
    quote = QUOTE["postgres"]
    return " UNION ALL ".join(
        f"SELECT {i}, s.* FROM {quote(names.schema)}.{quote(names.routine('stats'))}() s"
        for i, names in enumerate(queues)
    )


def quiet_sequences(names: QueueNames) -> tuple[str, ...]:
    """What tells an empty queue's statistics unchanged: nothing is pushed or delayed without
    drawing a push position, nothing taken without drawing a pop position, and dead letters
    redriven or purged are counted. Sequences, read without a lock on any table."""
    return (names.push_seq, names.pop_seq, names.counter("redriven"), names.counter("purged"))


def positions_of_many(queues: Sequence[QueueNames], oids: Sequence[tuple[int, ...] | None]) -> str:
    """PostgreSQL: the `quiet_sequences` of many queues in one statement, one row a sequence
    (its oid, then its last value, 0 before its first draw), queue after queue in `queues`'
    order (no parameter). A queue's sequences are named, or given by the oids an earlier read
    answered: a name is looked up in the catalog, an oid is not."""
    quote = QUOTE["postgres"]
    regclasses = ", ".join(
        "'" + text.replace("'", "''") + "'"
        for q, known in zip(queues, oids, strict=True)
        for text in (
            [f"{quote(q.schema)}.{quote(seq)}" for seq in quiet_sequences(q)]
            if known is None
            else [str(int(oid)) for oid in known]
        )
    )
    return (
        "SELECT s.c::oid, coalesce(pg_sequence_last_value(s.c), 0)"
        f" FROM unnest(ARRAY[{regclasses}]::regclass[]) WITH ORDINALITY AS s(c, i) ORDER BY s.i"
    )


def recorded_query(backend: str, names: QueueNames) -> str:
    """schema_version, ring_size, message_bytes of a queue, from its metadata row (parameter:
    the queue's name)."""
    quote = QUOTE[backend]
    return (
        f"SELECT schema_version, ring_size, message_bytes FROM {quote(names.schema)}.{quote(names.meta)}"
        " WHERE queue = ?"
    )


def message_limits_query(backend: str, names: QueueNames) -> str:
    """spec.messages' header_bytes, max_headers and max_body_bytes of a queue (version 18 on),
    from its metadata row (parameter: the queue's name)."""
    quote = QUOTE[backend]
    return (
        f"SELECT header_bytes, max_headers, max_body_bytes FROM {quote(names.schema)}.{quote(names.meta)}"
        " WHERE queue = ?"
    )


def dead_letter_queue_query(backend: str, names: QueueNames) -> str:
    """Where a queue's dead letters are kept (version 10 on): schema.queue of the queue whose
    dead-letter table has them, or '' for its own (parameter: the queue's name)."""
    quote = QUOTE[backend]
    return f"SELECT dead_letter_queue FROM {quote(names.schema)}.{quote(names.meta)} WHERE queue = ?"


def dead_letters_query(backend: str, keeper: QueueNames, of_one_source: bool) -> str:
    """The dead letters in the dead-letter table of queue `keeper`, in id order: msg_id,
    attempts, error, pushed_at and dead_at (Unix seconds), body, source, headers (parameters: with
    `of_one_source`, the source queue's schema.queue; then how many)."""
    table = f"{QUOTE[backend](keeper.schema)}.{QUOTE[backend](keeper.dead)}"
    where = " WHERE source = ?" if of_one_source else ""
    if backend == "sqlserver":
        # TOP's parameter comes first in the text: the source is bound after it.
        return (
            "SELECT TOP (?) msg_id, attempts, error, DATEDIFF_BIG(millisecond, '1970-01-01', pushed_at) / 1000.0,"
            f" DATEDIFF_BIG(millisecond, '1970-01-01', dead_at) / 1000.0, body, source, headers FROM {table}{where}"
            " ORDER BY msg_id, source"
        )
    return (
        "SELECT msg_id, attempts, error, extract(epoch FROM pushed_at)::float8, extract(epoch FROM dead_at)::float8,"
        f" body, source, headers FROM {table}{where} ORDER BY msg_id, source LIMIT ?"
    )


def archive_query(backend: str, names: QueueNames) -> str:
    """Archived messages acked or popped at or after a time, oldest first: msg_id, attempts,
    pushed_at and acked_at (Unix seconds), body, headers (parameters: the time as `history_bound`
    writes it, then how many)."""
    table = f"{QUOTE[backend](names.schema)}.{QUOTE[backend](names.archive)}"
    if backend == "sqlserver":
        return (
            "SELECT msg_id, attempts, DATEDIFF_BIG(millisecond, '1970-01-01', pushed_at) / 1000.0,"
            f" DATEDIFF_BIG(millisecond, '1970-01-01', acked_at) / 1000.0, body, headers FROM {table}"
            " WHERE acked_at >= CAST(? AS datetime2(3)) ORDER BY acked_at, msg_id OFFSET 0 ROWS FETCH NEXT ? ROWS ONLY"
        )
    return (
        "SELECT msg_id, attempts, extract(epoch FROM pushed_at)::float8, extract(epoch FROM acked_at)::float8,"
        f" body, headers FROM {table} WHERE acked_at >= CAST(? AS timestamptz) ORDER BY acked_at, msg_id LIMIT ?"
    )


def peek_query(backend: str, names: QueueNames) -> str:
    """Waiting messages (written, visible, not expired, not leased) in id order, read without
    taking them: msg_id, body (from the content table when past a slot), attempts, headers
    (parameter: how many)."""
    quote = QUOTE[backend]
    now = "SYSUTCDATETIME()" if backend == "sqlserver" else "now()"
    waiting = " UNION ALL ".join(
        f"SELECT msg_id, body, attempts, headers FROM {quote(names.schema)}.{quote(table)} WHERE state = 1"
        f" AND (visible_at IS NULL OR visible_at <= {now}) AND (expires_at IS NULL OR expires_at > {now})"
        for table in (names.ring, names.spill)
    )
    content = f"{quote(names.schema)}.{quote(names.content)}"
    body = (
        f"COALESCE(w.body, (SELECT c.body FROM {content} c"
        f" WHERE c.bucket = w.msg_id % {CONTENT_BUCKETS} AND c.msg_id = w.msg_id))"
    )
    if backend == "sqlserver":
        return f"SELECT TOP (?) w.msg_id, {body}, w.attempts, w.headers FROM ({waiting}) w ORDER BY w.msg_id"
    return f"SELECT w.msg_id, {body}, w.attempts, w.headers FROM ({waiting}) w ORDER BY w.msg_id LIMIT ?"


HISTORY_COLUMNS = "depth, in_flight, pushed, popped, acquired, expired, oldest_age_s"


def history_query(backend: str, names: QueueNames) -> str:
    """The queue's statistics samples taken in [since, until), oldest first (parameters: the
    queue's name, then since and until as `history_bound` writes them): the sample's time in
    Unix seconds, then QueueStats' figures in order."""
    table = f"{QUOTE[backend](names.schema)}.{QUOTE[backend](names.history)}"
    if backend == "sqlserver":  # datetime2 holds UTC (SYSUTCDATETIME)
        return (
            f"SELECT DATEDIFF_BIG(millisecond, '1970-01-01', at) / 1000.0, {HISTORY_COLUMNS} FROM {table}"
            " WHERE queue = ? AND at >= CAST(? AS datetime2(3)) AND at < CAST(? AS datetime2(3)) ORDER BY at"
        )
    return (
        f"SELECT extract(epoch FROM at)::float8, {HISTORY_COLUMNS} FROM {table}"
        " WHERE queue = ? AND at >= CAST(? AS timestamptz) AND at < CAST(? AS timestamptz) ORDER BY at"
    )


def history_bound(backend: str, when: datetime) -> str:
    """A time as `history_query` reads it: ISO 8601 in UTC (with its offset for PostgreSQL)."""
    utc = when.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds")
    return utc if backend == "sqlserver" else utc + "+00:00"
