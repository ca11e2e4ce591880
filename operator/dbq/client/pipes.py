"""Client of Cassandra "pipes" queues: the same operations as the ring, on a design without locks.

How it works (see `backends/cassandra/cql.py` for the tables):
- Each pushing thread writes to a pipe of its own: one single-partition batch per push or batch
  (rows plus the pipe's pushed count), no read, no lock. After `maxPushesPerPipe` messages or
  `maxPushTime` it marks the pipe finished and opens a new one.
- A popping thread leases one pipe at a time with a lightweight transaction (5 s, renewed while
  used) and reads it from its cursor; with smart batching (the default), the client's threads
  take through one lease, one at a time. A take deletes what it read as one range behind the cursor
  and moves the counters (and, for acquire, copies the rows to `pending`) in one single-partition
  batch, so reads at the head never meet tombstones. Poppers prefer the oldest pipe with
  messages, which gives the seed's "mostly FIFO": messages come out in push order per pipe, and
  pipes are served oldest first, so nothing starves.
- ack checks the lease token and deadline, then deletes the pending row. nack(0) pushes the
  message again (same id, to this client's pipe) and deletes the pending row in one logged
  batch; nack(delay) moves the deadline; once it passes, the deferring client's next take (or
  the pipe's lessee, every OWN_ROLLBACK_S) pushes the message again.
- `repair()` (the operator's cleanup) finishes pipes whose pusher vanished (past maxPushTime),
  rolls back pending messages past their deadline (holding that pipe's lease, so one rollback
  per message), marks pipes drained, and retires the drained pipes at the head: their totals
  move to the queue row and the watermark in one conditional update, then their partitions go.

Semantics: pop is at-most-once; acquire/ack is at-least-once. Both rely on leases timed with
wall clocks: keep clocks within `SKEW_S` of each other (NTP), as Cassandra itself requires.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cassandra.cluster import Cluster, ResponseFuture, Session
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement

from dbq.client.coalescing import ByOptions, Coalescer, ack_coalescer, take_coalescer, take_one
from dbq.client.stats import ArchivedMessage, DeadLetter, HistorySample, QueueStats
from dbq.client.waiting import Deadline, count_arg, seconds_arg, take_until
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import open_session, translate
from dbq.contract.pipes import PIPES_SCHEMA_VERSION, PipesStatements
from dbq.errors import LeaseLost, MessageTooLarge, QueueError, QueueNotFound, QueueUnavailable
from dbq.names import QueueNames

if TYPE_CHECKING:
    from dbq.client.consume import ConsumeStats

PIPE_LEASE_S = 5.0  # a popper owns a pipe this long unless it renews
RENEW_AFTER_S = 2.0  # ...and renews it when the lease is this old
SKEW_S = 1.0  # clocks of clients and nodes agree within this
# A pipe past maxPushTime + this is finished, whatever its pusher says: longer than a request
# can take, so a write sent before maxPushTime has landed by then.
FINISH_GRACE_S = 15.0
# A rollback (or nack) that took a lease over and then failed to push the message again is
# retried only after this long: its logged batch may still be applied by Cassandra's batchlog
# replay, and pushing again before that would leave two copies.
RETAKE_AFTER_S = 60.0
MAX_BODY_BYTES = 1 << 20
BATCH_MAX_MESSAGES = 500
BATCH_MAX_BYTES = 4 << 20
LOGGED_MAX_MESSAGES = 50  # a requeue's logged batch (rows plus the pending rows they replace)
LOGGED_MAX_BYTES = 24 << 10
MOVE_SCAN_S = 0.05
# A popper rolls back the overdue messages of the pipe it leases (nacked with a delay, or whose
# visibility timeout passed) at most this often: while it holds the lease, no repair can.
OWN_ROLLBACK_S = 1.0  # also how often a pipe of deferred messages leased by another is tried
STATE_READ_WINDOW = 16  # pipe states read concurrently when looking for work
# Statements prepared on a session, by text: every client on the session (the operator's, Spark
# tasks') prepares a statement once.
_PREPARED: weakref.WeakKeyDictionary[Session, dict[str, PreparedStatement]] = weakref.WeakKeyDictionary()
DUE_BATCHES = 40  # delayed messages moved per repair: at most this many logged batches of them
LEASE_EXPIRED = "lease expired (visibility timeout)"  # a dead letter's error when repair moved it
READ_AHEAD = 16  # rows a take reads at least, so most single pops are one round trip (the batch)
# How long a take leases its messages: None (a pop), seconds for them all, or each message's own
# in take order (smart batching's acquires, each caller with its visibility).
Visibility = float | Sequence[float] | None


LOG = logging.getLogger("dbq.pipes")


def now_ms() -> int:
    return int(time.time() * 1000)


def _unset(value: Any) -> Any:
    """A missing value is left unset, not written as null: a null is a tombstone cell, and every
    read of the row would count it."""
    return UNSET_VALUE if value is None else value


def _dead_letter(row: Sequence[Any]) -> DeadLetter:
    """A dead letter from (id, attempts, error, dead_at ms, body, moving_until, source); pushed
    when its id was made."""
    return DeadLetter(
        row[0],
        int(row[1] or 0),
        row[2],
        uuid_ms(row[0]) / 1000,
        (row[3] or 0) / 1000,
        bytes(row[4]),
        row[6] or "",
    )


def _overdue(pending: list[Any], at: int) -> list[Any]:
    """The pending rows whose deadline passed (by more than the clock allowance) at `at` (ms)."""
    return [r for r in pending if r[5] is not None and r[5] < at - SKEW_S * 1000]


def uuid_ms(value: uuid.UUID) -> int:
    """Milliseconds since the epoch of a version-1 (time) UUID."""
    return (value.time - 0x01B21DD213814000) // 10_000


@dataclass
class PipeMessage:
    id: uuid.UUID
    body: bytes
    attempts: int
    lease: uuid.UUID | None  # the lease token of an acquired message; None when popped
    pipe: uuid.UUID
    key: uuid.UUID  # the row's clustering key in its pipe
    _queue: PipesQueue | None = field(default=None, repr=False, compare=False)

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

    def _leased(self) -> PipesQueue:
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


@dataclass
class _Pusher:
    """One thread's pipe for pushing."""

    pipe: uuid.UUID | None = None
    opened: float = 0.0  # monotonic
    pushed: int = 0
    requeued: int = 0
    broken: bool = False


@dataclass
class _State:
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
        return self.finished or at > self.created + max_push_time_ms + FINISH_GRACE_S * 1000


def _state(pipe: uuid.UUID, row: Sequence[Any]) -> _State:
    created, finished, owner, lease_until, cursor, *counters = row
    return _State(
        pipe, int(created or 0), bool(finished), owner, None if lease_until is None else int(lease_until),
        cursor, *(int(v or 0) for v in counters),
    )  # fmt: skip


@dataclass
class _Lease:
    """A pipe this thread leases for taking messages."""

    owner: str
    state: _State
    until: float  # monotonic: this thread stops using the lease then
    renew_at: float
    scan_after: float = 0.0  # monotonic: when to look for a pipe with messages again
    rollback_after: float = 0.0  # monotonic: when to roll back its overdue messages again
    # Rows read past the cursor and not taken yet. Only the lessee takes from its pipe, and its
    # pusher only appends, so they stay the pipe's next rows while the lease lasts.
    ahead: list[Any] = field(default_factory=list)


class PipesQueue:
    def __init__(
        self,
        settings: ConnectionSettings,
        names: QueueNames,
        *,
        visibility: float = 30.0,
        push_timeout: float = 5.0,
        pop_timeout: float = 1.0,
        ttl: float = 0.0,
        session: Session | None = None,
        smart_batching: bool = True,
    ) -> None:
        if settings.backend != "cassandra":
            raise QueueError(f"{settings.backend} has no pipes queues: connect with a cassandra:// url")
        self.settings = settings
        self.names = names
        self.visibility = seconds_arg(visibility, "visibility", 0.0, positive=True)
        # Pipes never turn a writer away; kept for symmetry with the ring.
        self.push_timeout = seconds_arg(push_timeout, "push_timeout", 0.0)
        self.pop_timeout = seconds_arg(pop_timeout, "pop_timeout", 0.0)
        self.ttl = seconds_arg(ttl, "ttl", 0.0)
        self.cql = PipesStatements(names)
        self._cluster: Cluster | None = None
        if session is None:
            self._cluster, session = open_session(settings)
        self.session = session
        self._prepared = _PREPARED.setdefault(session, {})  # shared by the clients of a session
        self._local = threading.local()
        self._threads_lock = threading.Lock()
        self._pushers: list[_Pusher] = []
        self._leases: list[_Lease] = []
        # With smart batching, every take of this client goes through one lease, one thread at a
        # time: the leader of a coalesced take changes, a pipe has one lessee, and a thread's
        # single and batch takes must not lease different pipes (one popper: strict FIFO).
        self._together_lock = threading.Lock()
        self._shared_lease: _Lease | None = None
        # Pipes holding messages this client nacked with a delay, and when the last is due
        # (monotonic): its takes push them again then, without waiting for a repair.
        self._deferred: dict[uuid.UUID, float] = {}
        self._identity = f"{socket.gethostname()}/{os.getpid()}"
        # Single calls made at once by several threads share round trips (smart batching).
        # Pushes by ttl and delay; acquires all together, each message leased for its caller's visibility.
        self._pushes: ByOptions[tuple[float, float | None], bytes, uuid.UUID] | None = None
        self._pops: Coalescer[None, PipeMessage | None] | None = None
        self._acquires: Coalescer[float, PipeMessage | None] | None = None
        self._acks: Coalescer[PipeMessage, None] | None = None
        if smart_batching:
            self._pushes = ByOptions(
                lambda o: Coalescer(
                    lambda bodies: self.push_many(bodies, ttl=o[0], delay=o[1]), BATCH_MAX_MESSAGES
                )
            )
            self._pops = take_coalescer(
                lambda calls: self._take_together(len(calls), None), BATCH_MAX_MESSAGES
            )
            self._acquires = take_coalescer(
                lambda visibilities: self._take_together(len(visibilities), visibilities), BATCH_MAX_MESSAGES
            )
            self._acks = ack_coalescer(self.ack_many, BATCH_MAX_MESSAGES)
        try:
            meta = self._check_meta()
        except Exception:
            self.close()  # a cluster this client opened must not outlive the failed connect
            raise
        self.max_pushes_per_pipe = int(meta[2])
        self.max_push_time_ms = int(meta[3])
        # spec.deadLetter.maxAttempts (0: none), how long archived rows live (0: no archive), and
        # the queue whose dead table keeps this queue's dead letters ('': its own)
        max_attempts, archive_ttl_s, kept_by = self._x(self.cql.read_settings, names.queue)[0]
        self.max_attempts, self.archive_ttl_s = int(max_attempts or 0), int(archive_ttl_s or 0)
        self.dead_letter_keeper = QueueNames.of_qualified(kept_by) if kept_by else names
        if kept_by:
            self.cql = PipesStatements(names, self.dead_letter_keeper)

    def _check_meta(self) -> list[Any]:
        """The queue's metadata row, once it is known to be a pipes queue this client speaks."""
        names = self.names
        try:
            meta = self._meta()
        except QueueUnavailable:
            if self.session.cluster.metadata.keyspaces.get(names.schema) is not None:
                raise
            meta = None  # no such keyspace
        if meta is None:
            raise QueueNotFound(
                f"queue {names.queue} is not provisioned in keyspace {names.schema} at {self.settings.endpoint}:"
                " apply a Queue resource for it, or pass the keyspace it lives in"
            )
        if meta[0] != "pipes" or meta[1] != PIPES_SCHEMA_VERSION:
            raise QueueError(
                f"queue {names.queue} has design {meta[0]} version {meta[1]}, this client speaks pipes"
                f" version {PIPES_SCHEMA_VERSION}: upgrade the operator and the client together"
            )
        return meta

    @classmethod
    def over(cls, session: Session, settings: ConnectionSettings, names: QueueNames) -> PipesQueue:
        """A client on an open session (the operator's), which it does not close."""
        return cls(settings, names, session=session)

    # --- plumbing -------------------------------------------------------------------------
    def _statement(self, text: str) -> PreparedStatement:
        prepared = self._prepared.get(text)
        if prepared is None:
            try:
                prepared = self._prepared[text] = self.session.prepare(text)
            except Exception as e:  # e.g. a table dropped behind our back
                raise self._error(e) from None
        return prepared

    def _error(self, e: Exception) -> QueueError:
        return translate(e, self.settings)

    def _x(self, text: str, *params: Any) -> list[Any]:
        try:
            return list(self.session.execute(self._statement(text), params))
        except Exception as e:
            raise self._error(e) from None

    def _cas(self, text: str, *params: Any) -> bool:
        """Run a lightweight transaction; whether it applied."""
        try:
            return bool(self.session.execute(self._statement(text), params).was_applied)
        except Exception as e:
            raise self._error(e) from None

    @staticmethod
    def _retake_at() -> int:
        return now_ms() + int(RETAKE_AFTER_S * 1000)

    def _batch(
        self, parts: Iterable[tuple[str, tuple[Any, ...]]], logged: bool = False, conditional: bool = False
    ) -> bool:
        """Run statements as one batch; whether it applied. That is always so without
        conditions. A conditional batch (a lightweight transaction on one partition of one table,
        logged) applies whole when every condition holds, else not at all."""
        logged = logged or conditional
        batch = BatchStatement(batch_type=BatchType.LOGGED if logged else BatchType.UNLOGGED)
        for text, params in parts:
            batch.add(self._statement(text), params)
        try:
            result = self.session.execute(batch)
        except Exception as e:
            raise self._error(e) from None
        return bool(result.was_applied) if conditional else True

    def _many(self, text: str, params: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
        """Run one statement for many parameter tuples concurrently; rows per tuple, in order."""
        statement = self._statement(text)
        try:
            futures: list[ResponseFuture] = [self.session.execute_async(statement, p) for p in params]
            return [list(f.result()) for f in futures]
        except Exception as e:
            raise self._error(e) from None

    def _meta(self) -> list[Any] | None:
        rows = self._x(self.cql.read_meta, self.names.queue)
        return list(rows[0]) if rows and rows[0][0] is not None else None

    def close_pushers(self) -> None:
        """Mark the pipes this client pushes to finished (the next push opens new ones)."""
        with self._threads_lock:
            pushers = list(self._pushers)
        for pusher in pushers:
            self._finish(pusher)

    def close(self) -> None:
        """Finish this client's pipes and give back its leases, then disconnect."""
        self.close_pushers()
        with self._threads_lock:
            leases = list(self._leases)
        for lease in leases:
            self._release(lease)
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    def __enter__(self) -> PipesQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- push -----------------------------------------------------------------------------
    def _pusher(self) -> _Pusher:
        pusher: _Pusher | None = getattr(self._local, "pusher", None)
        if pusher is None:
            pusher = self._local.pusher = _Pusher()
            with self._threads_lock:
                self._pushers.append(pusher)
        return pusher

    def _push_room(self, pusher: _Pusher) -> int:
        """Messages the thread's pipe still takes; opens a new pipe when it is full or old."""
        age_ms = (time.monotonic() - pusher.opened) * 1000
        if (
            pusher.pipe is None
            or pusher.broken
            or pusher.pushed + pusher.requeued >= self.max_pushes_per_pipe
            or age_ms >= self.max_push_time_ms
        ):
            self._finish(pusher)
            pipe, at = uuid.uuid1(), now_ms()
            self._x(self.cql.add_pipe, pipe, self._identity, at)
            self._x(self.cql.open_pipe, pipe, self._identity, at)
            pusher.pipe, pusher.opened, pusher.pushed, pusher.requeued = pipe, time.monotonic(), 0, 0
            pusher.broken = False
        return self.max_pushes_per_pipe - pusher.pushed - pusher.requeued

    def _finish(self, pusher: _Pusher) -> None:
        """Mark the pipe finished, unless it is so old that poppers already treat it so (it may be
        retired: a write now would leave a stray row behind)."""
        if pusher.pipe is None:
            return
        pipe, pusher.pipe = pusher.pipe, None
        if (time.monotonic() - pusher.opened) * 1000 >= self.max_push_time_ms + FINISH_GRACE_S * 1000 / 2:
            return
        try:
            self._x(self.cql.finish_pipe, pipe)
            self._x(self.cql.set_status, "finished", now_ms(), pipe)
        except QueueError:
            pass  # poppers treat it as finished after maxPushTime anyway

    def _chunks(self, bodies: list[bytes], room: int, logged: bool = False) -> int:
        """How many of `bodies` go in the next batch. A logged batch spans partitions, and
        Cassandra refuses one past batch_size_fail_threshold (50 KiB by default): it stays small."""
        most, most_bytes = (
            (LOGGED_MAX_MESSAGES, LOGGED_MAX_BYTES) if logged else (BATCH_MAX_MESSAGES, BATCH_MAX_BYTES)
        )
        total = 0
        for i, body in enumerate(bodies[: min(room, most)]):
            total += len(body)
            if total > most_bytes and i > 0:
                return i
        return min(room, most, len(bodies))

    def _write(
        self,
        bodies: list[bytes],
        *,
        ids: list[uuid.UUID] | None = None,
        attempts: list[int] | None = None,
        expires: list[int | None] | None = None,
        also: list[tuple[str, tuple[Any, ...]]] | None = None,
        requeue: bool = True,
    ) -> list[uuid.UUID]:
        """Append messages to this thread's pipe. `ids` given: a requeue (ids kept, counted as
        requeued unless `requeue` is False: delayed messages come due, counted as pushed);
        `also` joins the (then logged) batch, e.g. the pending rows being requeued."""
        pusher = self._pusher()
        out: list[uuid.UUID] = []
        i = 0
        while i < len(bodies):
            n = self._chunks(bodies[i:], self._push_room(pusher), logged=bool(also))
            keys = [uuid.uuid1() for _ in range(n)]
            new_ids = ids[i : i + n] if ids else keys
            again = bool(ids) and requeue
            pushed = pusher.pushed + (0 if again else n)
            requeued = pusher.requeued + (n if again else 0)
            parts: list[tuple[str, tuple[Any, ...]]] = [
                (
                    self.cql.push,
                    (
                        pusher.pipe,
                        keys[j],
                        new_ids[j],
                        bodies[i + j],
                        attempts[i + j] if attempts else 0,
                        _unset(expires[i + j] if expires else None),
                    ),
                )
                for j in range(n)
            ]
            parts.append((self.cql.count_pushes, (pushed, requeued, pusher.pipe)))
            extra = also[i : i + n] if also else []
            try:
                self._batch([*parts, *extra], logged=bool(extra))
            except QueueError:
                pusher.broken = True  # its counters may be off by this batch: start a new pipe
                raise
            pusher.pushed, pusher.requeued = pushed, requeued
            out.extend(new_ids)
            i += n
        return out

    def _check_sizes(self, bodies: list[bytes]) -> None:
        for body in bodies:
            if not isinstance(body, bytes | bytearray | memoryview):
                raise TypeError(f"a message body is bytes, not {type(body).__name__}: encode it first")
            if len(body) > MAX_BODY_BYTES:
                raise MessageTooLarge(
                    f"a body of {len(body)} bytes is larger than {MAX_BODY_BYTES} bytes, the most a pipes"
                    " queue stores: store large payloads elsewhere and push a reference"
                )

    def push(
        self,
        body: bytes,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
    ) -> uuid.UUID:
        """Store one message; its id (a time UUID). Never waits: a pipe has no size limit. With
        `delay` (seconds), it is delivered no earlier than that from now."""
        if self._pushes is None:
            return self.push_many([body], timeout=timeout, ttl=ttl, delay=delay)[0]
        self._check_sizes([body])
        seconds_arg(timeout, "timeout", self.push_timeout)
        options = (
            seconds_arg(ttl, "ttl", self.ttl),
            None if delay is None else seconds_arg(delay, "delay", 0.0),
        )
        return self._pushes(options, bytes(body))

    def push_many(
        self,
        bodies: Iterable[bytes],
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
    ) -> list[uuid.UUID]:
        """Store messages in one batch per pipe (a pipe change splits a batch); their ids in order.
        With `delay`, they wait in the delayed table until due, and the first repair after that
        (the operator's cleanup) moves them to a pipe, with their ids."""
        batch = list(bodies)
        self._check_sizes(batch)
        batch = [bytes(b) for b in batch]
        seconds_arg(timeout, "timeout", self.push_timeout)
        seconds = seconds_arg(ttl, "ttl", self.ttl)
        wait_ms = int(seconds_arg(delay, "delay", 0.0) * 1000)
        due = now_ms() + wait_ms
        expiry = due + int(seconds * 1000) if seconds > 0 else None
        if delay is not None:
            ids = [uuid.uuid1() for _ in batch]
            rows = [(due, i, body, _unset(expiry)) for i, body in zip(ids, batch, strict=True)]
            start = 0
            while start < len(rows):  # one partition: unlogged batches
                n = self._chunks(batch[start:], len(batch) - start)
                self._batch((self.cql.delay, row) for row in rows[start : start + n])
                start += n
            return ids
        return self._write(batch, expires=[expiry] * len(batch) if expiry else None)

    # --- pop / acquire --------------------------------------------------------------------
    def pop(self, timeout: float | None = None) -> PipeMessage | None:
        """At-most-once: the message is gone from the queue when this returns."""
        if (pops := self._pops) is not None:
            return take_one(lambda: pops(None), seconds_arg(timeout, "timeout", self.pop_timeout))
        got = self._take(1, timeout, None)
        return got[0] if got else None

    def pop_many(self, n: int, timeout: float | None = None) -> list[PipeMessage]:
        return self._take(n, timeout, None)

    def acquire(self, timeout: float | None = None, visibility: float | None = None) -> PipeMessage | None:
        """At-least-once: ack() within `visibility` s, or the message is delivered again."""
        seconds = seconds_arg(visibility, "visibility", self.visibility, positive=True)
        if (acquires := self._acquires) is not None:
            wait = seconds_arg(timeout, "timeout", self.pop_timeout)
            return take_one(lambda: acquires(seconds), wait)
        got = self._take(1, timeout, seconds)
        return got[0] if got else None

    def acquire_many(
        self, n: int, timeout: float | None = None, visibility: float | None = None
    ) -> list[PipeMessage]:
        return self._take(n, timeout, seconds_arg(visibility, "visibility", self.visibility, positive=True))

    def _take(self, n: int, timeout: float | None, visibility: Visibility) -> list[PipeMessage]:
        count_arg(n, "n")
        deadline = Deadline(seconds_arg(timeout, "timeout", self.pop_timeout))
        if self._pops is not None:  # smart batching: through the client's one lease
            return take_until(lambda: self._take_together(n, visibility), deadline, None, 0.0)
        return self._take_leased(n, deadline, visibility)

    def _take_leased(self, n: int, deadline: Deadline, visibility: Visibility) -> list[PipeMessage]:
        """Up to n messages from the thread's lease (moving on to other pipes as they run dry),
        waiting up to the deadline for the first."""
        while True:
            self._roll_back_deferred()
            lease = self._working_lease()
            if lease is not None:
                self._roll_back_own(lease)
                got = self._take_from(lease, n, visibility)
                if got:
                    return got
                if self._lease() is not lease:
                    continue  # that pipe is done: on to the next at once, whatever the timeout
                if self._move_from(lease) and deadline.remaining > 0:
                    continue  # another pipe has messages: try it at once
            if not deadline.wait():
                return []

    def _take_together(self, n: int, visibility: Visibility) -> list[PipeMessage]:
        """A take on the client's one lease (smart batching), without waiting."""
        with self._client_lease():
            return self._take_leased(n, Deadline(0), visibility)

    @contextlib.contextmanager
    def _client_lease(self) -> Iterator[None]:
        """With smart batching, this thread holds the client's one lease meanwhile (the other
        threads wait for it); without, its own lease stays."""
        if self._pops is None:
            yield
            return
        with self._together_lock:
            self._local.lease = self._shared_lease
            try:
                yield
            finally:
                self._shared_lease, self._local.lease = self._lease(), None

    def _lease(self) -> _Lease | None:
        return getattr(self._local, "lease", None)

    def _set_lease(self, lease: _Lease | None) -> None:
        old = self._lease()
        if old is not None:
            self._forget(old)
        if lease is not None:
            with self._threads_lock:
                self._leases.append(lease)
        self._local.lease = lease

    def _forget(self, lease: _Lease) -> None:
        with self._threads_lock:
            if lease in self._leases:
                self._leases.remove(lease)

    def _working_lease(self) -> _Lease | None:
        """The thread's lease, renewed when due; else a new one on the oldest pipe with messages."""
        lease = self._lease()
        if lease is None:
            lease = self._claim()
            self._set_lease(lease)
            return lease
        now = time.monotonic()
        if now >= lease.renew_at:
            until = now_ms() + int(PIPE_LEASE_S * 1000)
            if self._cas(self.cql.renew, until, lease.state.pipe, lease.owner):
                lease.until, lease.renew_at = now + PIPE_LEASE_S - SKEW_S, now + RENEW_AFTER_S
            else:
                self._set_lease(None)
                return self._working_lease()
        return lease

    def _move_from(self, lease: _Lease) -> bool:
        """Our pipe is empty but still pushed to: lease one that has messages, if any (looked
        for at most every MOVE_SCAN_S, so an idle popper does not flood the cluster)."""
        now = time.monotonic()
        if now < lease.scan_after:
            return False
        lease.scan_after = now + MOVE_SCAN_S
        moved = self._claim(exclude=lease.state.pipe)
        if moved is None:
            return False
        self._release(lease)
        self._set_lease(moved)
        return True

    def _live_pipes(self, meta: list[Any] | None = None) -> list[tuple[uuid.UUID, str]]:
        """The pipes above the watermark, oldest first; `meta` is the queue row if already read."""
        meta = meta or self._meta()
        watermark = meta[4] if meta else None
        if watermark is None:
            return [(r[0], r[1]) for r in self._x(self.cql.list_all_pipes)]
        return [(r[0], r[1]) for r in self._x(self.cql.list_pipes, watermark)]

    def _states(self, pipes: Sequence[uuid.UUID]) -> list[_State | None]:
        rows = self._many(self.cql.pipe_state, [(p,) for p in pipes])
        return [_state(p, r[0]) if r else None for p, r in zip(pipes, rows, strict=True)]

    def _claim(self, exclude: uuid.UUID | None = None) -> _Lease | None:
        """Lease the oldest unleased pipe that has messages; marks exhausted pipes drained."""
        candidates = [p for p, status in self._live_pipes() if status != "drained" and p != exclude]
        for start in range(0, len(candidates), STATE_READ_WINDOW):
            window = candidates[start : start + STATE_READ_WINDOW]
            at = now_ms()
            for state in self._states(window):
                if state is None or (state.lease_until or 0) > at:
                    continue
                if state.remaining <= 0:
                    if state.done_pushing(self.max_push_time_ms, at):
                        self._x(self.cql.set_status, "drained", at, state.pipe)
                    continue
                owner = f"{self._identity}/{uuid.uuid4().hex[:12]}"
                started = time.monotonic()
                until = now_ms() + int(PIPE_LEASE_S * 1000)
                if self._cas(self.cql.claim, owner, until, state.pipe, state.lease_until):
                    # Read the state again now that it is ours: between the first read and the
                    # claim, another popper may have leased it, taken messages and released it.
                    fresh = self._states([state.pipe])[0] or state
                    return _Lease(owner, fresh, started + PIPE_LEASE_S - SKEW_S, started + RENEW_AFTER_S)
        return None

    def _roll_back_own(self, lease: _Lease) -> None:
        """Push the overdue messages of the leased pipe again (at most every OWN_ROLLBACK_S)."""
        now = time.monotonic()
        if now >= lease.rollback_after:
            lease.rollback_after = now + OWN_ROLLBACK_S
            self._roll_back_overdue(lease.state)

    def _roll_back_deferred(self) -> None:
        """Push again the messages this client deferred that are due, pipe by pipe; a pipe
        another client leases is tried again later (its lessee rolls them back meanwhile)."""
        now = time.monotonic()
        for pipe, due in list(self._deferred.items()):
            if due > now:
                continue
            state = self._states([pipe])[0]
            if state is None or self._roll_back_overdue(state) is not None:
                self._deferred.pop(pipe, None)
            else:
                self._deferred[pipe] = now + OWN_ROLLBACK_S

    def _roll_back_overdue(self, state: _State) -> tuple[int, int] | None:
        """Roll back the pipe's overdue pending messages (`_roll_back`); None when another
        client leases the pipe."""
        overdue = _overdue(self._x(self.cql.pending_of, state.pipe), now_ms())
        return self._roll_back(state, overdue) if overdue else (0, 0)

    def _release(self, lease: _Lease) -> None:
        with contextlib.suppress(QueueError):  # else it expires on its own
            self._cas(self.cql.release, lease.state.pipe, lease.owner)
        if self._lease() is lease:
            self._local.lease = None
        self._forget(lease)

    def _take_from(self, lease: _Lease, n: int, visibility: Visibility) -> list[PipeMessage]:
        s = lease.state
        if len(lease.ahead) < n:
            want = max(n, READ_AHEAD)
            if s.cursor is None:
                lease.ahead = self._x(self.cql.read_head, s.pipe, want)
            else:
                lease.ahead = self._x(self.cql.read_after, s.pipe, s.cursor, want)
        found = lease.ahead[:n]
        if not found:
            fresh = self._states([s.pipe])[0]
            if fresh is None:
                return []
            s.created, s.finished, s.pushed, s.requeued = (
                fresh.created,
                fresh.finished,
                fresh.pushed,
                fresh.requeued,
            )
            if s.remaining <= 0 and s.done_pushing(self.max_push_time_ms, now_ms()):
                self._x(self.cql.set_status, "drained", now_ms(), s.pipe)
                self._release(lease)
            return []
        if time.monotonic() >= lease.until:  # too late to use this lease safely
            self._set_lease(None)
            return []
        at = now_ms()
        live = [r for r in found if r[4] is None or r[4] > at]
        last = found[-1][0]
        popped = s.popped + (len(live) if visibility is None else 0)
        acquired = s.acquired + (len(live) if visibility is not None else 0)
        expired = s.expired + len(found) - len(live)
        parts: list[tuple[str, tuple[Any, ...]]] = [
            (self.cql.delete_head, (s.pipe, last))
            if s.cursor is None
            else (self.cql.delete_after, (s.pipe, s.cursor, last)),
            (self.cql.count_takes, (last, popped, acquired, expired, s.pipe)),
        ]
        token = uuid.uuid4() if visibility is not None else None
        if visibility is not None:
            each = [visibility] * len(live) if isinstance(visibility, float) else visibility[: len(live)]
            untils = [at + int(seconds * 1000) for seconds in each]  # fewer rows live when some expired
            parts += [
                (
                    self.cql.lease_message,
                    (s.pipe, r[0], r[1], r[2], int(r[3] or 0) + 1, _unset(r[4]), until, token),
                )
                for r, until in zip(live, untils, strict=True)
            ]
        try:
            self._batch(parts)
        except QueueError:
            # The batch may have been applied all the same (a timeout): this thread's copy of the
            # pipe's cursor and counters is no longer known to be right. Drop the lease; whoever
            # claims the pipe next reads them again (what was taken and not delivered is pending
            # and rolled back after its deadline, or popped: at most once).
            self._set_lease(None)
            raise
        s.cursor, s.popped, s.acquired, s.expired = last, popped, acquired, expired
        del lease.ahead[: len(found)]
        if visibility is None:
            self._keep([(r[1], int(r[3] or 0), bytes(r[2])) for r in live])
        return [
            PipeMessage(
                id=r[1],
                body=bytes(r[2]),
                attempts=int(r[3] or 0) + 1,
                lease=token,
                pipe=s.pipe,
                key=r[0],
                _queue=self,
            )
            for r in live
        ]

    def peek(self, n: int) -> list[PipeMessage]:
        """Up to n waiting messages, oldest pipe first and in push order within a pipe, none
        taken or leased: a snapshot for looking, while pushes and takes go on."""
        count_arg(n, "n")
        found: list[PipeMessage] = []
        pipes = [p for p, status in self._live_pipes() if status != "drained"]
        for start in range(0, len(pipes), STATE_READ_WINDOW):
            for s in self._states(pipes[start : start + STATE_READ_WINDOW]):
                if len(found) >= n:
                    return found
                if s is None:
                    continue
                want = n - len(found)
                if s.cursor is None:
                    rows = self._x(self.cql.read_head, s.pipe, want)
                else:
                    rows = self._x(self.cql.read_after, s.pipe, s.cursor, want)
                at = now_ms()
                found += [
                    PipeMessage(
                        id=r[1], body=bytes(r[2]), attempts=int(r[3] or 0), lease=None, pipe=s.pipe, key=r[0]
                    )
                    for r in rows
                    if r[4] is None or r[4] > at
                ]
        return found

    # --- ack / nack -----------------------------------------------------------------------
    def _check_leases(self, messages: list[PipeMessage]) -> tuple[list[PipeMessage], list[PipeMessage]]:
        """(still leased with time to spare, lost) among `messages`."""
        by_pipe: dict[uuid.UUID, list[PipeMessage]] = {}
        for m in messages:
            m._leased()
            by_pipe.setdefault(m.pipe, []).append(m)
        pipes = list(by_pipe)
        rows = self._many(self.cql.leases_of, [(p, [m.key for m in by_pipe[p]]) for p in pipes])
        margin = now_ms() + int(SKEW_S * 500)
        held = {
            (p, r[0])
            for p, found in zip(pipes, rows, strict=True)
            for r in found
            if r[2] is not None and r[1] > margin
        }
        tokens = {(p, r[0]): r[2] for p, found in zip(pipes, rows, strict=True) for r in found}
        ok = [m for m in messages if (m.pipe, m.key) in held and tokens[(m.pipe, m.key)] == m.lease]
        return ok, [m for m in messages if m not in ok]

    def ack(self, message: PipeMessage) -> None:
        """Acknowledge one leased message (`PipeMessage.ack()`), with the other acks made at once."""
        if self._acks is not None:
            self._acks(message)
        else:
            self.ack_many([message])

    def ack_many(self, messages: Iterable[PipeMessage]) -> None:
        """Acknowledge leased messages. Raises LeaseLost naming those whose lease had expired;
        the others are acknowledged."""
        batch = list(messages)
        if not batch:
            return
        ok, lost = self._check_leases(batch)
        by_pipe: dict[uuid.UUID, list[PipeMessage]] = {}
        for m in ok:
            by_pipe.setdefault(m.pipe, []).append(m)
        for pipe, ms in by_pipe.items():
            # One conditional batch per pipe (one partition of one table): all of them, or, when
            # a rollback took one over meanwhile, none, and then each on its own.
            if not self._batch(((self.cql.settle, (pipe, m.key, m.lease)) for m in ms), conditional=True):
                lost += [m for m in ms if not self._cas(self.cql.settle, pipe, m.key, m.lease)]
        self._keep([(m.id, m.attempts, m.body) for m in ok if m not in lost])
        if lost:
            raise LeaseLost.of_acks(lost, len(batch))

    def _nack(self, m: PipeMessage, delay: float, error: str | None, *, handled: bool = True) -> bool:
        delay = seconds_arg(delay, "delay", 0.0)
        if error is not None and not isinstance(error, str):
            raise TypeError(f"error is the failure's text, not {type(error).__name__}")
        ok, _ = self._check_leases([m])
        if not ok:
            raise LeaseLost.of_nack(m)
        if handled and self.max_attempts and m.attempts >= self.max_attempts:
            # Taken over first, so an ack or a rollback of it cannot also succeed; then the dead
            # letter and the end of the pending row in one logged batch.
            if not self._cas(self.cql.take_over, uuid.uuid4(), self._retake_at(), m.pipe, m.key, m.lease):
                raise LeaseLost.of_nack(m)
            self._batch(self._burial(m.pipe, m.key, m.id, m.attempts, error, m.body), logged=True)
            return True
        if delay > 0:
            until = now_ms() + int(delay * 1000)
            if not self._cas(self.cql.defer, until, uuid.uuid4(), m.pipe, m.key, m.lease):
                raise LeaseLost.of_nack(m)
            due = time.monotonic() + delay + SKEW_S
            self._deferred[m.pipe] = max(due, self._deferred.get(m.pipe, 0.0))
            return False
        if not self._cas(self.cql.take_over, uuid.uuid4(), self._retake_at(), m.pipe, m.key, m.lease):
            raise LeaseLost.of_nack(m)  # a rollback took it over: it is delivered again anyway
        attempts = m.attempts if handled else max(m.attempts - 1, 0)
        self._write([m.body], ids=[m.id], attempts=[attempts], also=[(self.cql.ack, (m.pipe, m.key))])
        return False

    def _burial(
        self,
        pipe: uuid.UUID,
        key: uuid.UUID,
        msg_id: uuid.UUID,
        attempts: int,
        error: str | None,
        body: bytes,
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """The statements that move a pending message (taken over) to the dead letters."""
        text = None if error is None else error[:4000]
        return [
            (self.cql.bury, (msg_id, self.names.qualified, attempts, text, now_ms(), body)),
            (self.cql.ack, (pipe, key)),
        ]

    def consume(self, handler: Callable[..., object], **options: Any) -> ConsumeStats:
        """Run `handler(message)` for each message, acked when it returns and nacked with
        backoff when it raises, holding at most `credit` messages (`dbq.client.consume`)."""
        from dbq.client.consume import consume

        return consume(self, handler, **options)

    # --- repair and statistics ------------------------------------------------------------
    def repair(self) -> PipesRepair:
        """Finish pipes of vanished pushers, roll back expired leases, retire drained pipes.

        Idempotent and safe while clients work: a pipe's pending messages are rolled back only by
        the holder of its lease, and pipes are retired by a conditional update of the watermark.
        """
        meta = self._meta()
        if meta is None:
            raise QueueNotFound(f"queue {self.names.queue} is gone")
        delayed_due = self._deliver_due()
        finished = rolled_back = dead_lettered = drained = 0
        pipes = self._live_pipes(meta)
        states = self._states([p for p, _ in pipes])
        pending = self._many(self.cql.pending_of, [(p,) for p, _ in pipes])
        at = now_ms()
        retirable: list[_State] = []
        prefix = True
        for (pipe, status), found, rows in zip(pipes, states, pending, strict=True):
            state = found or _State(pipe, uuid_ms(pipe), False, None, None, None, 0, 0, 0, 0, 0)
            if found is None and not state.done_pushing(self.max_push_time_ms, at):
                prefix = False  # a pusher is opening it right now
                continue
            # (A pipe listed but never opened, its pusher gone, is finished like any other.)
            if not state.finished and state.done_pushing(self.max_push_time_ms, at):
                self._x(self.cql.finish_pipe, pipe)
                if status == "active":
                    self._x(self.cql.set_status, "finished", at, pipe)
                finished += 1
            overdue = _overdue(rows, at)
            if overdue:
                with self._client_lease():  # the pipe may be this client's own
                    moved, dead = self._roll_back(state, overdue) or (0, 0)
                rolled_back, dead_lettered = rolled_back + moved, dead_lettered + dead
                rows = self._x(self.cql.pending_of, pipe)
            is_drained = state.remaining <= 0 and state.done_pushing(self.max_push_time_ms, at)
            if is_drained and status != "drained":
                self._x(self.cql.set_status, "drained", at, pipe)
                drained += 1
            prefix = prefix and is_drained and not rows
            if prefix:
                retirable.append(state)
        retired = self._retire(meta, retirable) if retirable else 0
        return PipesRepair(finished, rolled_back, drained, retired, dead_lettered, delayed_due)

    def _deliver_due(self) -> int:
        """Move delayed messages that are due to this client's pipe, with their ids (at most
        DUE_BATCHES logged batches per repair). Each is claimed first, so two repairs never
        both move one; a claim whose batch failed is retried only after RETAKE_AFTER_S."""
        moved = 0
        for _ in range(DUE_BATCHES):
            at = now_ms()
            rows = [r for r in self._x(self.cql.due, at, LOGGED_MAX_MESSAGES) if (r[4] or 0) < at]
            if not rows:
                break
            rows = self._claimed(self.cql.claim_delayed, rows, lambda r: (r[0], r[1]), at)
            if rows:
                self._write(
                    [bytes(r[2]) for r in rows], ids=[r[1] for r in rows], expires=[r[3] for r in rows],
                    also=[(self.cql.undelay, (r[0], r[1])) for r in rows], requeue=False,
                )  # fmt: skip
            moved += len(rows)
        return moved

    def _claimed(
        self, claim: str, rows: list[Any], key: Callable[[Any], tuple[Any, ...]], at: int
    ) -> list[Any]:
        """The rows of one partition this client claimed with `claim` (moving_until set to
        RETAKE_AFTER_S from now, if it was before `at`): all in one conditional batch, or, when
        another client claimed one meanwhile, each on its own."""
        until = self._retake_at()
        if not rows or self._batch(((claim, (until, *key(r), at)) for r in rows), conditional=True):
            return rows
        return [r for r in rows if self._cas(claim, until, *key(r), at)]

    def _roll_back(self, state: _State, overdue: list[Any]) -> tuple[int, int] | None:
        """Push overdue pending messages again (or dead-letter them), holding the pipe's lease:
        this thread's own, or one taken for the purpose. How many were rolled back, and how many
        of them dead-lettered; None, having done nothing, while another client leases the pipe."""
        mine = self._lease()
        owner = None
        if mine is None or mine.state.pipe != state.pipe:
            if (state.lease_until or 0) > now_ms():
                return None
            owner = f"{self._identity}/repair/{uuid.uuid4().hex[:8]}"
            until = now_ms() + int(PIPE_LEASE_S * 1000)
            if not self._cas(self.cql.claim, owner, until, state.pipe, state.lease_until):
                return None
        taken: list[Any] = []
        dead: list[Any] = []
        try:
            # Take each lease over first: an ack that lands meanwhile wins, and then the message
            # is not pushed again.
            token = uuid.uuid4()
            retake = self._retake_at()
            taken = [
                r for r in overdue if self._cas(self.cql.take_over, token, retake, state.pipe, r[0], r[6])
            ]
            # Those acquired deadLetter.maxAttempts times go to the dead letters instead.
            dead = [r for r in taken if self.max_attempts and int(r[3] or 0) >= self.max_attempts]
            for r in dead:
                burial = self._burial(state.pipe, r[0], r[1], int(r[3]), LEASE_EXPIRED, bytes(r[2]))
                self._batch(burial, logged=True)
            taken = [r for r in taken if r not in dead]
            if taken:
                self._write(
                    [bytes(r[2]) for r in taken],
                    ids=[r[1] for r in taken],
                    attempts=[int(r[3] or 0) for r in taken],
                    expires=[r[4] for r in taken],
                    also=[(self.cql.ack, (state.pipe, r[0])) for r in taken],
                )
        finally:
            if owner is not None:
                self._cas(self.cql.release, state.pipe, owner)
        return len(taken) + len(dead), len(dead)

    def _retire(self, meta: list[Any], states: list[_State]) -> int:
        """Move the totals of drained head pipes into the queue row, then drop their partitions."""
        totals = [int(v or 0) for v in meta[5:11]]
        for s in states:
            for i, v in enumerate((s.pushed, s.requeued, s.popped, s.acquired, s.expired, 1)):
                totals[i] += v
        last = states[-1].pipe
        if not self._cas(self.cql.retire, last, *totals, self.names.queue, meta[4]):
            return 0  # another repair moved the watermark first
        self._many(self.cql.drop_state, [(s.pipe,) for s in states])
        self._many(self.cql.drop_waiting, [(s.pipe,) for s in states])
        self._many(self.cql.drop_pending, [(s.pipe,) for s in states])
        self._x(self.cql.drop_pipe_rows, last)
        return len(states)

    # --- archive ---------------------------------------------------------------------------
    def _keep(self, taken: list[tuple[uuid.UUID, int, bytes]]) -> None:
        """Archive messages just acked or popped (id, attempts, body), when spec.archive is on:
        one batch per hour partition, each row with the retention as its TTL. Written after the
        take or ack it records (a failure there must not lose the messages), so a client that
        dies between the two leaves that message unarchived; a failure here is logged."""
        if not self.archive_ttl_s or not taken:
            return
        rows = [(uuid.uuid1(), *t) for t in taken]
        try:
            start = 0
            while start < len(rows):
                hour = uuid_ms(rows[start][0]) // 3_600_000
                same = [r for r in rows[start:] if uuid_ms(r[0]) // 3_600_000 == hour]
                n = self._chunks([r[3] for r in same], len(same))
                self._batch((self.cql.keep, (hour, *r, self.archive_ttl_s)) for r in same[:n])
                start += n
        except QueueError as e:
            LOG.warning(
                "queue %s: %d messages were taken but not archived: %s", self.names.queue, len(rows), e
            )

    def archived(self, since: datetime, limit: int = 100) -> list[ArchivedMessage]:
        """Archived messages (spec.archive) acked or popped at or after `since`, oldest first."""
        count_arg(limit, "limit")
        out: list[ArchivedMessage] = []
        hour, last = int(since.timestamp() * 1000) // 3_600_000, now_ms() // 3_600_000
        while hour <= last and len(out) < limit:
            for acked, msg_id, attempts, body in self._x(self.cql.kept_since, hour, since, limit - len(out)):
                out.append(
                    ArchivedMessage(
                        msg_id, int(attempts or 0), uuid_ms(msg_id) / 1000, uuid_ms(acked) / 1000, bytes(body)
                    )
                )
            hour += 1
        return out

    # --- dead letters ---------------------------------------------------------------------
    def dead_letters(self, limit: int = 100, *, held: bool = False) -> list[DeadLetter]:
        """This queue's dead letters, oldest pushed first (at most `limit`), wherever they are
        kept (its own dead table, or spec.deadLetter.queue's). `held`: instead, every dead letter
        this queue's table keeps, its own and other queues' (see DeadLetter.source)."""
        if held:
            return [_dead_letter(r) for r in self._x(self.cql.held_dead_letters, count_arg(limit, "limit"))]
        return [_dead_letter(r) for r in self._dead_rows(None, limit)]

    def _dead_rows(self, ids: Iterable[uuid.UUID] | None, limit: int) -> list[Any]:
        count_arg(limit, "limit")
        if ids is None:
            return self._x(self.cql.dead_letters, self.names.qualified, limit)
        wanted = list(ids)
        if not wanted or not all(isinstance(i, uuid.UUID) for i in wanted):
            raise ValueError("ids are the dead letters' ids (UUIDs), or None for the oldest")
        return self._x(self.cql.dead_letters_by_id, wanted[:limit], self.names.qualified)

    def redrive(self, ids: Iterable[uuid.UUID] | None = None, limit: int = 1_000) -> int:
        """Dead letters back to delivery with their ids and attempts from zero: `ids`, or the
        oldest `limit`. Each is claimed first (so two redrives never both push one), then pushed
        again and removed from the dead letters in one logged batch. How many moved."""
        at = now_ms()
        rows = [r for r in self._dead_rows(ids, limit) if (r[5] or 0) < at]
        rows = self._claimed(self.cql.claim_dead, rows, lambda r: (r[0],), at)
        if rows:
            self._write(
                [bytes(r[4]) for r in rows], ids=[r[0] for r in rows], attempts=[0] * len(rows),
                also=[(self.cql.unbury, (r[0],)) for r in rows],
            )  # fmt: skip
        return len(rows)

    def purge_dead_letters(self, ids: Iterable[uuid.UUID] | None = None, limit: int = 1_000) -> int:
        """Dead letters deleted for good: `ids`, or the oldest `limit`. How many went."""
        rows = self._dead_rows(ids, limit)
        self._many(self.cql.unbury, [(r[0],) for r in rows])
        return len(rows)

    def history(self, since: datetime, until: datetime) -> list[HistorySample]:
        """The operator's statistics samples of this queue taken in [since, until), oldest first."""
        rows = self._x(self.cql.history_range, self.names.queue, since, until)
        return [HistorySample.of_row(row[0] / 1000.0, row[1:]) for row in rows]

    def stats(self) -> PipesStats:
        """Totals, depth, in-flight and oldest age, summed over pipes without any lock; exact
        when nothing moves, a consistent-per-pipe view while clients work."""
        meta = self._meta()
        if meta is None:
            raise QueueNotFound(f"queue {self.names.queue} is gone")
        pushed, requeued, popped, acquired, expired, retired = (int(v or 0) for v in meta[5:11])
        pipes = self._live_pipes(meta)
        states = self._states([p for p, _ in pipes])
        counts = self._many(self.cql.count_pending, [(p,) for p, _ in pipes])
        per_pipe: list[PipeStat] = []
        depth = in_flight = 0
        heads: list[_State] = []
        at = now_ms()
        for (pipe, status), state, count in zip(pipes, states, counts, strict=True):
            if state is None:
                continue
            pending = int(count[0][0]) if count else 0
            pushed, requeued = pushed + state.pushed, requeued + state.requeued
            popped, acquired, expired = (
                popped + state.popped,
                acquired + state.acquired,
                expired + state.expired,
            )
            depth += max(state.remaining, 0)
            in_flight += pending
            if state.remaining > 0 and len(heads) < 4:
                heads.append(state)
            owner = state.owner if (state.lease_until or 0) > at else None
            per_pipe.append(
                PipeStat(str(pipe), status, state.pushed, state.requeued, state.popped + state.acquired,
                         max(state.remaining, 0), pending, owner)
            )  # fmt: skip
        oldest = 0.0
        for rows in self._head_ids(heads):
            if rows:
                oldest = max(oldest, (at - uuid_ms(rows[0][0])) / 1000)
        # Dead letters are few (a count of their one partition); none unless spec.deadLetter.
        dead = int(self._x(self.cql.count_dead, self.names.qualified)[0][0]) if self.max_attempts else 0
        delayed = int(self._x(self.cql.count_delayed)[0][0])
        return PipesStats(
            depth=depth, in_flight=in_flight, pushed=pushed, popped=popped, acquired=acquired,
            expired=expired, oldest_age_seconds=max(oldest, 0.0), dead=dead, delayed=delayed, requeued=requeued,
            retired_pipes=retired, pipes=tuple(per_pipe),
        )  # fmt: skip

    def _head_ids(self, states: list[_State]) -> Iterator[list[Any]]:
        for s in states:
            if s.cursor is None:
                yield self._x(self.cql.head_id_first, s.pipe)
            else:
                yield self._x(self.cql.head_id, s.pipe, s.cursor)
