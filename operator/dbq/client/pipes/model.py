"""What the pipes client hands out and keeps: messages, statistics, repair results, and its own
records of pipes (a pipe's state row, a popper's lease, a pusher's pipe)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cassandra.query import UNSET_VALUE

from dbq.client.pipes import tuning
from dbq.client.stats import DeadLetter, QueueStats
from dbq.contract import headers as header_codec
from dbq.contract.headers import HeaderValue
from dbq.errors import QueueError

# How long a take leases its messages: None (a pop), seconds for them all, or each message's own
# in take order (smart batching's acquires, each caller with its visibility).
Visibility = float | Sequence[float] | None


class MessageOwner(Protocol):
    """The client a taken message is acked and nacked through (`PipesQueue`)."""

    def ack(self, message: PipeMessage) -> None: ...

    def _nack(self, m: PipeMessage, delay: float, error: str | None, *, handled: bool = True) -> bool: ...


@dataclass
class PipeMessage:
    id: uuid.UUID
    body: bytes
    attempts: int
    lease: uuid.UUID | None  # the lease token of an acquired message; None when popped
    pipe: uuid.UUID
    key: uuid.UUID  # the row's clustering key in its pipe
    headers: dict[str, HeaderValue] = field(default_factory=dict)
    stored_headers: str | None = field(default=None, repr=False, compare=False)  # as stored (pushed again so)
    _queue: MessageOwner | None = field(default=None, repr=False, compare=False)
    chunked: bool = field(default=False, repr=False, compare=False)  # its body is in the content table

    @property
    def stored_body(self) -> bytes | None:
        """The body as the message's row holds it: None when it is in chunks (under its id)."""
        return None if self.chunked else self.body

    def ack(self) -> None:
        """Done with it: never delivered again. Raises LeaseLost if the lease had expired."""
        self._leased().ack(self)

    def nack(self, delay: float = 0.0, error: str | None = None) -> bool:
        """Give it back: delivered again now, or after `delay` s (at the first repair after it).
        With spec.deadLetter, a message acquired maxAttempts times goes to the dead letters
        instead, with `error`: then True."""
        return self._leased()._nack(self, delay, error)

    def give_back(self) -> None:
        """Return it unhandled (a consumer stopping): delivered again at once, and this delivery
        does not count as an attempt."""
        self._leased()._nack(self, 0.0, None, handled=False)

    def fail(self, delay: float, error: str | None) -> bool:
        """A handler failed on it (`dbq.client.consume`): nack with the delay and the error;
        whether it was dead-lettered."""
        return self.nack(delay, error)

    def _leased(self) -> MessageOwner:
        if self.lease is None or self._queue is None:
            raise QueueError(f"message {self.id} was popped (at-most-once): there is nothing to ack or nack")
        return self._queue


@dataclass(frozen=True)
class PipeStat:
    pipe: str
    status: str
    pushed: int
    requeued: int
    taken: int
    depth: int
    in_flight: int
    owner: str | None


@dataclass(frozen=True)
class PipesStats(QueueStats):
    requeued: int = 0
    retired_pipes: int = 0
    pipes: tuple[PipeStat, ...] = ()


@dataclass(frozen=True)
class PipesRepair:
    finished_pipes: int  # pushers vanished: their pipes marked finished
    rolled_back: int  # pending messages past their deadline, pushed again (or dead-lettered)
    drained_pipes: int  # finished pipes with nothing left to read
    retired_pipes: int  # drained pipes removed (partitions dropped, totals kept)
    dead_lettered: int = 0  # of those rolled back: acquired deadLetter.maxAttempts times
    delayed_due: int = 0  # delayed messages come due, moved to a pipe
    ended: int = 0  # large bodies a client left half-stored or half-deleted, deleted


@dataclass
class Pusher:
    """One thread's pipe for pushing."""

    pipe: uuid.UUID | None = None
    opened: float = 0.0  # monotonic
    pushed: int = 0
    requeued: int = 0
    broken: bool = False


@dataclass
class PipeState:
    """A pipe's row in the state table, as read."""

    pipe: uuid.UUID
    created: int
    finished: bool
    owner: str | None
    lease_until: int | None
    cursor: uuid.UUID | None
    pushed: int
    requeued: int
    popped: int
    acquired: int
    expired: int

    @property
    def remaining(self) -> int:
        return self.pushed + self.requeued - self.popped - self.acquired - self.expired

    def done_pushing(self, max_push_time_ms: int, at: int) -> bool:
        return self.finished or at > self.created + max_push_time_ms + tuning.FINISH_GRACE_S * 1000

    @classmethod
    def of_row(cls, pipe: uuid.UUID, row: Sequence[Any]) -> PipeState:
        created, finished, owner, lease_until, cursor, *counters = row
        return cls(
            pipe, int(created or 0), bool(finished), owner, None if lease_until is None else int(lease_until),
            cursor, *(int(v or 0) for v in counters),
        )  # fmt: skip

    @classmethod
    def never_opened(cls, pipe: uuid.UUID) -> PipeState:
        """A pipe listed whose state row was never written (its pusher is gone, or opening it)."""
        return cls(pipe, tuning.uuid_ms(pipe), False, None, None, None, 0, 0, 0, 0, 0)


@dataclass
class Lease:
    """A pipe this thread leases for taking messages."""

    owner: str
    state: PipeState
    until: float  # monotonic: this thread stops using the lease then
    renew_at: float
    scan_after: float = 0.0  # monotonic: when to look for a pipe with messages again
    rollback_after: float = 0.0  # monotonic: when to roll back its overdue messages again
    # Rows read past the cursor and not taken yet. Only the lessee takes from its pipe, and its
    # pusher only appends, so they stay the pipe's next rows while the lease lasts.
    ahead: list[Any] = field(default_factory=list)


def unset(value: Any) -> Any:
    """A missing value is left unset, not written as null: a null is a tombstone cell, and every
    read of the row would count it."""
    return UNSET_VALUE if value is None else value


def dead_letter_of_row(row: Sequence[Any], body: bytes) -> DeadLetter:
    """A dead letter from (id, attempts, error, dead_at ms, body, moving_until, source, headers)
    and its body (the row's, or its chunks); pushed when its id was made."""
    return DeadLetter(
        row[0],
        int(row[1] or 0),
        row[2],
        tuning.uuid_ms(row[0]) / 1000,
        (row[3] or 0) / 1000,
        body,
        row[6] or "",
        header_codec.decode(row[7]),
    )


def overdue(pending: list[Any], at: int) -> list[Any]:
    """The pending rows whose deadline passed (by more than the clock allowance) at `at` (ms)."""
    return [r for r in pending if r[5] is not None and r[5] < at - tuning.SKEW_S * 1000]
