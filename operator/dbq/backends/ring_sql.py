"""What the two SQL dialects of the ring share: qualified names, template rendering, teardown.

Each dialect (`postgres/sql.py`, `sqlserver/sql.py`) subclasses `RingSqlBase` with its own
`quote`, its routine template and one method per planning step.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from dbq.backends.names import COUNTERS, QueueNames
from dbq.backends.ring_plan import RingTarget

# The routines a client calls, with their parameter markers; the same in every dialect.
CALL_ARGS = {
    "push": "?, ?",
    "push_many": "?, ?, ?",
    "take": "?, ?",
    "pop": "?",
    "pop_many": "?, ?",
    "release": "?",
    "ack": "?, ?",
    "ack_many": "?, ?",
    "nack": "?, ?, ?",
    "repair": "?",
    "void_holes": "?",
    "stats": "",
}


# take, pop and pop_many answer with packed records, so a call returns one value whatever it
# took (no per-row or per-column work in the driver): status (1 byte), id (8), lease (8, 0 for
# none), attempts (4), body length (4), then the body; integers big-endian, as both PostgreSQL's
# int*send() and SQL Server's CAST(... AS binary(n)) write them. A dialect may answer with
# several rows of records; the client reads them as one stream.
RECORD = struct.Struct(">bqqii")

# Redeliveries (nacked messages, expired leases, rescued orphans) wait in the spill table. One
# pop in SPILL_SHARE looks there before the ring while the ring has messages, and every pop when
# it has none: so most pops skip that look, and a redelivery still waits only a few pops.
SPILL_SHARE = 8

Record = tuple[int, int, int, int, bytes]  # status, id, lease (0: none), attempts, body


def records(blob: bytes) -> Iterator[Record]:
    """(status, id, lease, attempts, body) of each packed record in `blob`."""
    view = memoryview(blob)
    at, end = 0, len(blob)
    while at < end:
        status, msg_id, lease, attempts, length = RECORD.unpack_from(view, at)
        at += RECORD.size
        yield status, msg_id, lease, attempts, bytes(view[at : at + length])
        at += length


def recorded_query(names: QueueNames, quote: Callable[[str], str]) -> str:
    """schema_version, ring_size, message_bytes of one queue (parameter: queue name)."""
    return (
        f"SELECT schema_version, ring_size, message_bytes FROM {quote(names.schema)}.{quote(names.meta)}"
        " WHERE queue = ?"
    )


class RingSqlBase:
    ROUTINES: tuple[str, ...] = ()
    ROUTINE_KIND = "FUNCTION"  # what DROP ... IF EXISTS calls a routine
    NOW = "now()"  # the database's clock: samples are timed by one clock, whatever the operator's
    TEMPLATE = ""  # the routines, separated by `--;;` lines; placeholders from `_fmt()`

    def __init__(
        self, target: RingTarget, quote: Callable[[str], str], literal: Callable[[str], str]
    ) -> None:
        self.t = target
        self.quote = quote
        self.literal = literal
        n = target.names
        s = self.schema = quote(n.schema)
        self.schema_name = n.schema
        self.meta = f"{s}.{quote(n.meta)}"
        self.history = f"{s}.{quote(n.history)}"
        self.ring = f"{s}.{quote(n.ring)}"
        self.spill = f"{s}.{quote(n.spill)}"
        self.gap = f"{s}.{quote(n.gap)}"
        self.push_seq = f"{s}.{quote(n.push_seq)}"
        self.pop_seq = f"{s}.{quote(n.pop_seq)}"
        self.count = {c: f"{s}.{quote(n.counter(c))}" for c in COUNTERS}
        self.fn = {verb: f"{s}.{quote(n.routine(verb))}" for verb in self.ROUTINES}
        self.size = int(target.size)
        self.message_bytes = int(target.message_bytes)

    @property
    def sequences(self) -> tuple[str, ...]:
        return (self.push_seq, self.pop_seq, *self.count.values())

    def observe_recorded(self) -> str:
        return recorded_query(self.t.names, self.quote)

    def step_sql(self, action: str) -> list[str]:
        """The statements of one planning step (each dialect has a `_<action>` method)."""
        return list(getattr(self, f"_{action}")())

    def _create_routines(self) -> list[str]:
        return [r.strip() for r in self.TEMPLATE.format(**self._fmt()).split("\n--;;\n") if r.strip()]

    def _fmt(self) -> dict[str, object]:
        return {
            "ring": self.ring,
            "spill": self.spill,
            "gap": self.gap,
            "push_seq": self.push_seq,
            "pop_seq": self.pop_seq,
            "size": self.size,
            "max_bytes": self.message_bytes,
            "queue": self.t.names.queue,
            "spill_share": SPILL_SHARE,
            **{f"n_{c}": seq for c, seq in self.count.items()},
            **{f"fn_{verb}": name for verb, name in self.fn.items()},
        }

    # --- statistics history (parameters in the order of HISTORY_COLUMNS) ---------------------
    HISTORY_COLUMNS = ("depth", "in_flight", "pushed", "popped", "acquired", "expired", "oldest_age_s")

    def record_sample(self) -> str:
        """Append one sample of this queue (parameters: the HISTORY_COLUMNS values)."""
        columns = ", ".join(self.HISTORY_COLUMNS)
        marks = ", ".join("?" for _ in self.HISTORY_COLUMNS)
        return (
            f"INSERT INTO {self.history} (queue, at, {columns})"
            f" VALUES ({self.literal(self.t.names.queue)}, {self.NOW}, {marks})"
        )

    def _queue_tables_list(self) -> str:
        """The queue's tables as a list of string literals (for catalog queries)."""
        n = self.t.names
        return ", ".join(self.literal(t) for t in (n.ring, n.spill, n.gap))

    def drop(self) -> list[str]:
        stmts = [f"DROP {self.ROUTINE_KIND} IF EXISTS {name}" for name in self.fn.values()]
        stmts += [f"DROP TABLE IF EXISTS {t}" for t in (self.ring, self.spill, self.gap)]
        stmts += [f"DROP SEQUENCE IF EXISTS {s}" for s in self.sequences]
        stmts.append(f"DELETE FROM {self.meta} WHERE queue = {self.literal(self.t.names.queue)}")
        stmts.append(f"DELETE FROM {self.history} WHERE queue = {self.literal(self.t.names.queue)}")
        return stmts
