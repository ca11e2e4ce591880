"""One measurement of a queue, the same figures for every design, and the dead letters and the
archived messages it holds.

The client returns it (`Queue.stats()`), the operator records it in the history table, exports
it to Prometheus and writes it to `status.stats` (`dbq.api.status.StatsStatus`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from dbq.contract.headers import HeaderValue


@dataclass(frozen=True)
class QueueStats:
    depth: int  # ready to be taken
    in_flight: int  # leased, not yet acknowledged
    pushed: int  # totals since the queue was created
    popped: int
    acquired: int
    expired: int
    oldest_age_seconds: float  # of the oldest ready message; 0 when none
    dead: int = 0  # dead letters held (ring queues with spec.deadLetter)
    delayed: int = 0  # pushed with a delay, or nacked with one, and not due yet (not in depth)
    archived: int = 0  # acked or popped messages kept in the archive (ring queues with spec.archive)

    @property
    def taken(self) -> int:
        """Messages handed out: popped (at-most-once) and acquired (leased)."""
        return self.popped + self.acquired

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_row(cls, figures: Sequence[Any]) -> QueueStats:
        """From a row of depth, in_flight, pushed, popped, acquired, expired, oldest_age_s[, dead,
        delayed, archived]."""
        depth, in_flight, pushed, popped, acquired, expired = (int(v or 0) for v in figures[:6])
        dead, delayed, archived = (int(v or 0) for v in (*figures[7:10], 0, 0, 0)[:3])
        return cls(
            depth,
            in_flight,
            pushed,
            popped,
            acquired,
            expired,
            float(figures[6] or 0.0),
            dead,
            delayed,
            archived,
        )


@dataclass(frozen=True)
class HistorySample:
    """One row of the queue's statistics history (`dbq_stats_history`): when the operator took
    the measurement (UTC) and what it measured."""

    at: datetime
    stats: QueueStats

    @classmethod
    def of_row(cls, at_unix_seconds: float, figures: Sequence[Any]) -> HistorySample:
        return cls(datetime.fromtimestamp(float(at_unix_seconds), UTC), QueueStats.of_row(figures))


@dataclass(frozen=True)
class DeadLetter:
    """A message that was acquired `deadLetter.maxAttempts` times and not acked: its id, how
    many times it was delivered, the last error given to nack (or why the lease ended), when it
    was pushed and dead-lettered (Unix seconds), its body."""

    id: int | UUID  # an int on the ring, a timeuuid on pipes
    attempts: int
    error: str | None
    pushed_at: float
    dead_at: float
    body: bytes
    source: str = ""  # schema.queue of the queue it came from (a table may keep several queues')
    # Its headers, with dbq's dead-letter keys (`dbq.contract.headers.ERROR`, `ATTEMPTS`) added.
    headers: Mapping[str, HeaderValue] = field(default_factory=dict)


@dataclass(frozen=True)
class ArchivedMessage:
    """A message kept after it was acked or popped (spec.archive): its id, how many times it was
    delivered, when it was pushed and acked (Unix seconds), its body."""

    id: int | UUID  # an int on the ring, a timeuuid on pipes
    attempts: int
    pushed_at: float
    acked_at: float
    body: bytes
    headers: Mapping[str, HeaderValue] = field(default_factory=dict)
