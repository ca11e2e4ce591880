"""`PipesQueue`, the client of one pipes queue: its public operations, each handed to the part
of the package that does that work (writing, leasing, taking, settling, repairing, measuring,
the archive and the dead letters)."""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from cassandra.cluster import Cluster, Session

from dbq.api.limits import MAX_PIPES_BODY_BYTES
from dbq.client.coalescing import ByOptions, Coalescer, ack_coalescer, take_coalescer, take_one
from dbq.client.pipes import measuring, tuning
from dbq.client.pipes.archive import PipeArchive
from dbq.client.pipes.dead_letters import PipeDeadLetters
from dbq.client.pipes.leasing import PipeLeases
from dbq.client.pipes.model import PipeMessage, PipesRepair, PipesStats, Visibility
from dbq.client.pipes.repairing import PipeRepairer
from dbq.client.pipes.session import PipesSession
from dbq.client.pipes.settling import PipeSettler
from dbq.client.pipes.taking import PipeReader
from dbq.client.pipes.writing import PipeWriter
from dbq.client.stats import ArchivedMessage, DeadLetter, HistorySample
from dbq.client.waiting import Deadline, check_bodies, count_arg, seconds_arg, take_until
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import open_session
from dbq.contract import headers as header_codec
from dbq.contract.access import Right
from dbq.contract.headers import HeaderLimits, Headers, StoredHeaders
from dbq.contract.pipes import PIPES_SCHEMA_VERSION, PipesStatements
from dbq.errors import LeaseLost, PermissionDenied, QueueError, QueueNotFound, QueueUnavailable
from dbq.names import QueueNames

if TYPE_CHECKING:
    from dbq.client.consume import ConsumeStats

P = ParamSpec("P")
R = TypeVar("R")


def needs(
    right: Right | None,
) -> Callable[[Callable[Concatenate[PipesQueue, P], R]], Callable[Concatenate[PipesQueue, P], R]]:
    """A call Cassandra refuses (a login without the table permissions of `right`) raises
    PermissionDenied naming the right and the queue; None: any right would do."""

    def wrap(method: Callable[Concatenate[PipesQueue, P], R]) -> Callable[Concatenate[PipesQueue, P], R]:
        @functools.wraps(method)
        def call(self: PipesQueue, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(self, *args, **kwargs)
            except PermissionDenied as e:
                if e.queue:
                    raise
                s = self.settings
                raise PermissionDenied.lacking(
                    s.endpoint, s.username, self.names.qualified, str(right or ""), str(e).partition(": ")[2]
                ) from None

        return call

    return wrap


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
        self._cluster: Cluster | None = None
        if session is None:
            self._cluster, session = open_session(settings)
        self.session = session
        self.db = PipesSession(session, settings, names)
        try:
            meta = self._check_meta()
            # spec.deadLetter.maxAttempts (0: none), how long archived rows live (0: no
            # archive), the queue whose dead table keeps this queue's dead letters ('': its own),
            # and spec.messages' limits on headers and bodies
            max_attempts, archive_ttl_s, kept_by, header_bytes, max_headers, max_body_bytes = self.db.rows(
                self.db.cql.read_settings, names.queue
            )[0]
        except Exception:
            self._disconnect()  # a cluster this client opened must not outlive the failed connect
            raise
        self.header_limits = HeaderLimits(int(header_bytes), int(max_headers))
        self.max_body_bytes = int(max_body_bytes)
        self.dead_letter_keeper = QueueNames.of_qualified(kept_by) if kept_by else names
        if kept_by:
            self.db.cql = PipesStatements(names, self.dead_letter_keeper)
        identity = f"{socket.gethostname()}/{os.getpid()}"
        max_pushes, max_push_time_ms = int(meta[2]), int(meta[3])
        self.writer = PipeWriter(self.db, identity, max_pushes, max_push_time_ms)
        self.leases = PipeLeases(self.db, identity, max_push_time_ms, together=smart_batching)
        self.settler = PipeSettler(self.db, self.writer, self.leases, int(max_attempts or 0), names.qualified)
        self.archive = PipeArchive(self.db, int(archive_ttl_s or 0))
        self.reader = PipeReader(self.db, self.leases, self.archive, max_push_time_ms, self)
        self.dead = PipeDeadLetters(self.db, self.writer, names.qualified)
        self.repairer = PipeRepairer(self.db, self.writer, self.leases, self.settler)
        # Single calls made at once by several threads share round trips (smart batching).
        # Pushes by ttl and delay; acquires all together, each message leased for its caller's visibility.
        self._pushes: ByOptions[tuple[float, float | None], tuple[bytes, str | None], uuid.UUID] | None = None
        self._pops: Coalescer[None, PipeMessage | None] | None = None
        self._acquires: Coalescer[float, PipeMessage | None] | None = None
        self._acks: Coalescer[PipeMessage, None] | None = None
        if smart_batching:
            self._pushes = ByOptions(
                lambda o: Coalescer(
                    lambda messages: self._store(messages, ttl=o[0], delay=o[1]), tuning.BATCH_MAX_MESSAGES
                )
            )
            # Takes go through the client's shared leases, one take at a time on each.
            self._pops = take_coalescer(
                lambda calls: self._take_together(len(calls), None),
                tuning.BATCH_MAX_MESSAGES,
                parallel=self.leases.takes_at_once,
            )
            self._acquires = take_coalescer(
                lambda visibilities: self._take_together(len(visibilities), visibilities),
                tuning.BATCH_MAX_MESSAGES,
                parallel=self.leases.takes_at_once,
            )
            self._acks = ack_coalescer(self.ack_many, tuning.BATCH_MAX_MESSAGES)

    @needs(None)
    def _check_meta(self) -> list[Any]:
        """The queue's metadata row, once it is known to be a pipes queue this client speaks."""
        names = self.names
        try:
            meta = self.db.meta()
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

    @property
    def max_pushes_per_pipe(self) -> int:
        return self.writer.max_pushes_per_pipe

    @property
    def max_attempts(self) -> int:
        """spec.deadLetter.maxAttempts (0: messages are never dead-lettered)."""
        return self.settler.max_attempts

    def close_pushers(self) -> None:
        """Mark the pipes this client pushes to finished (the next push opens new ones)."""
        self.writer.finish_all()

    def close(self) -> None:
        """Finish this client's pipes and give back its leases, then disconnect."""
        self.writer.finish_all()
        self.leases.release_all()
        self._disconnect()

    def _disconnect(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    def __enter__(self) -> PipesQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- push -----------------------------------------------------------------------------
    def _check_bodies(self, bodies: Sequence[bytes]) -> None:
        check_bodies(bodies, self.max_body_bytes, self.names.queue, f"{MAX_PIPES_BODY_BYTES} on pipes")

    @needs(Right.SEND)
    def push(
        self,
        body: bytes,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
        headers: Headers | None = None,
    ) -> uuid.UUID:
        """Store one message, with `headers` if given; its id (a time UUID). Never waits: a
        pipe has no size limit. With `delay` (seconds), it is delivered no earlier than that from now."""
        if self._pushes is None:
            return self.push_many([body], timeout=timeout, ttl=ttl, delay=delay, headers=headers)[0]
        self._check_bodies([body])
        stored = header_codec.encode(headers, self.header_limits)
        seconds_arg(timeout, "timeout", self.push_timeout)
        options = (
            seconds_arg(ttl, "ttl", self.ttl),
            None if delay is None else seconds_arg(delay, "delay", 0.0),
        )
        return self._pushes(options, (bytes(body), stored))

    @needs(Right.SEND)
    def push_many(
        self,
        bodies: Iterable[bytes],
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
        headers: Headers | Sequence[Headers | StoredHeaders | None] | None = None,
    ) -> list[uuid.UUID]:
        """Store messages in one batch per pipe (a pipe change splits a batch); their ids in order.
        `headers`: one mapping for all, or one (or None) per body. With `delay`, they wait in the
        delayed table until due, and the first repair after that (the operator's cleanup) moves
        them to a pipe, with their ids."""
        batch = list(bodies)
        self._check_bodies(batch)
        stored = header_codec.encode_each(headers, len(batch), self.header_limits)
        return self._store(
            list(zip([bytes(b) for b in batch], stored, strict=True)), timeout=timeout, ttl=ttl, delay=delay
        )

    def _store(
        self,
        messages: list[tuple[bytes, str | None]],
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
    ) -> list[uuid.UUID]:
        """Store checked messages (body, headers as stored); their ids in order."""
        batch = [body for body, _ in messages]
        stored = [h for _, h in messages]
        seconds_arg(timeout, "timeout", self.push_timeout)
        seconds = seconds_arg(ttl, "ttl", self.ttl)
        wait_ms = int(seconds_arg(delay, "delay", 0.0) * 1000)
        due = tuning.now_ms() + wait_ms
        expiry = due + int(seconds * 1000) if seconds > 0 else None
        if delay is not None:
            return self.writer.delay(batch, stored, due, expiry)
        return self.writer.append(batch, expires=[expiry] * len(batch) if expiry else None, headers=stored)

    # --- pop / acquire --------------------------------------------------------------------
    @needs(Right.RECEIVE)
    def pop(self, timeout: float | None = None) -> PipeMessage | None:
        """At-most-once: the message is gone from the queue when this returns."""
        if (pops := self._pops) is not None:
            return take_one(lambda: pops(None), seconds_arg(timeout, "timeout", self.pop_timeout))
        got = self._take(1, timeout, None)
        return got[0] if got else None

    @needs(Right.RECEIVE)
    def pop_many(self, n: int, timeout: float | None = None) -> list[PipeMessage]:
        return self._take(n, timeout, None)

    @needs(Right.RECEIVE)
    def acquire(self, timeout: float | None = None, visibility: float | None = None) -> PipeMessage | None:
        """At-least-once: ack() within `visibility` s, or the message is delivered again."""
        seconds = seconds_arg(visibility, "visibility", self.visibility, positive=True)
        if (acquires := self._acquires) is not None:
            wait = seconds_arg(timeout, "timeout", self.pop_timeout)
            return take_one(lambda: acquires(seconds), wait)
        got = self._take(1, timeout, seconds)
        return got[0] if got else None

    @needs(Right.RECEIVE)
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
        read_late = False  # a pipe claimed once the deadline had passed was read once
        while True:
            self.settler.roll_back_deferred()
            lease = self.leases.working()
            if lease is not None:
                self.settler.roll_back_own(lease)
                got = self.reader.take(lease, n, visibility)
                if got:
                    return got
                if self.leases.current() is not lease:
                    continue  # that pipe is done: on to the next at once, whatever the timeout
                if self.leases.move_from(lease) and (deadline.remaining > 0 or not read_late):
                    # Another pipe has messages: read it at once. Its claim is paid for, so it is
                    # read even when the search used up the wait (a slow server, or a take that
                    # does not wait), once: else the take answers nothing while it holds them.
                    read_late = deadline.remaining <= 0
                    continue
            if not deadline.wait():
                return []

    def _take_together(self, n: int, visibility: Visibility) -> list[PipeMessage]:
        """A take on one of the client's shared leases (smart batching), without waiting. A
        spare lease whose pipe ran dry gives it back, and the take goes to the first lease."""
        with self.leases.client_lease() as spare:
            got = self._take_leased(n, Deadline(0), visibility)
            if got or not spare:
                return got
            if (dry := self.leases.current()) is not None:
                self.leases.release(dry)
        with self.leases.client_lease(spare=False):
            return self._take_leased(n, Deadline(0), visibility)

    @needs(Right.PEEK)
    def peek(self, n: int) -> list[PipeMessage]:
        """Up to n waiting messages, oldest pipe first and in push order within a pipe, none
        taken or leased: a snapshot for looking, while pushes and takes go on."""
        return self.reader.peek(count_arg(n, "n"))

    # --- ack / nack -----------------------------------------------------------------------
    @needs(Right.RECEIVE)
    def ack(self, message: PipeMessage) -> None:
        """Acknowledge one leased message (`PipeMessage.ack()`), with the other acks made at once."""
        if self._acks is not None:
            self._acks(message)
        else:
            self.ack_many([message])

    @needs(Right.RECEIVE)
    def ack_many(self, messages: Iterable[PipeMessage]) -> None:
        """Acknowledge leased messages. Raises LeaseLost naming those whose lease had expired;
        the others are acknowledged."""
        batch = list(messages)
        if not batch:
            return
        acked, lost = self.settler.ack(batch)
        self.archive.keep([(m.id, m.attempts, m.body, m.stored_headers) for m in acked])
        self.settler.finish(acked)
        if lost:
            raise LeaseLost.of_acks(lost, len(batch))

    @needs(Right.RECEIVE)
    def _nack(self, m: PipeMessage, delay: float, error: str | None, *, handled: bool = True) -> bool:
        delay = seconds_arg(delay, "delay", 0.0)
        if error is not None and not isinstance(error, str):
            raise TypeError(f"error is the failure's text, not {type(error).__name__}")
        return self.settler.nack(m, delay, error, handled)

    @needs(Right.RECEIVE)
    def consume(self, handler: Callable[..., object], **options: Any) -> ConsumeStats:
        """Run `handler(message)` for each message, acked when it returns and nacked with
        backoff when it raises, holding at most `credit` messages (`dbq.client.consume`)."""
        from dbq.client.consume import consume

        return consume(self, handler, **options)

    # --- upkeep, records and statistics -----------------------------------------------------
    @needs(Right.MANAGE)
    def repair(self) -> PipesRepair:
        """Finish pipes of vanished pushers, roll back expired leases, retire drained pipes
        (`dbq.client.pipes.repairing`)."""
        return self.repairer.repair()

    @needs(Right.MANAGE)
    def archived(self, since: datetime, limit: int = 100) -> list[ArchivedMessage]:
        """Archived messages (spec.archive) acked or popped at or after `since`, oldest first."""
        return self.archive.since(since, limit)

    @needs(Right.MANAGE)
    def dead_letters(self, limit: int = 100, *, held: bool = False) -> list[DeadLetter]:
        """This queue's dead letters, oldest pushed first (at most `limit`), wherever they are
        kept (its own dead table, or spec.deadLetter.queue's). `held`: instead, every dead letter
        this queue's table keeps, its own and other queues' (see DeadLetter.source)."""
        return self.dead.listed(limit, held)

    @needs(Right.MANAGE)
    def redrive(self, ids: Iterable[uuid.UUID] | None = None, limit: int = 1_000) -> int:
        """Dead letters back to delivery with their ids and attempts from zero: `ids`, or the
        oldest `limit`. How many moved."""
        return self.dead.redrive(ids, limit)

    @needs(Right.MANAGE)
    def purge_dead_letters(self, ids: Iterable[uuid.UUID] | None = None, limit: int = 1_000) -> int:
        """Dead letters deleted for good: `ids`, or the oldest `limit`. How many went."""
        return self.dead.purge(ids, limit)

    @needs(Right.MONITOR)
    def history(self, since: datetime, until: datetime) -> list[HistorySample]:
        """The operator's statistics samples of this queue taken in [since, until), oldest first."""
        return measuring.history(self.db, since, until)

    @needs(Right.MONITOR)
    def stats(self) -> PipesStats:
        """Totals, depth, in-flight and oldest age, summed over pipes without any lock."""
        return measuring.stats(self.db, self.leases, self.names.qualified, bool(self.max_attempts))
