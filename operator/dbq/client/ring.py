"""Client of a ring queue (PostgreSQL or SQL Server): every operation is one routine call.

Thread-safe: a `Queue` keeps a small pool of connections and each call borrows one, so threads
may share a Queue; a `Message` may be acked from any thread. Smart batching (on unless
`smart_batching=False`): push(), pop(), acquire() and ack() calls made by more threads than the
pool has connections share round trips (push_many, pop_many or acquire_many of exactly as many
messages as callers wait, ack_many; `dbq.client.coalescing`); a call with a free connection
goes at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg
import pyodbc

from dbq.api.limits import MAX_RING_BODY_BYTES
from dbq.client.coalescing import ByOptions, Coalescer, ack_coalescer, take_coalescer, take_one
from dbq.client.notify import FALLBACK_S, POLL_FIRST_S, WAIT_MARK_S, Notifications
from dbq.client.stats import ArchivedMessage, DeadLetter, HistorySample, QueueStats
from dbq.client.waiting import Deadline, check_bodies, count_arg, seconds_arg, take_until
from dbq.connection import ConnectionSettings, odbc, postgres
from dbq.contract import headers as header_codec
from dbq.contract.access import right_of
from dbq.contract.headers import HeaderLimits, Headers, HeaderValue, StoredHeaders
from dbq.contract.ring import (
    CALL_ARGS,
    HEADER_ENCODING,
    HOLE_GRACE_S,
    MESSAGE,
    NOT_WRITTEN,
    RING_SCHEMA_VERSION,
    Record,
    archive_query,
    call_statement,
    dead_letter_queue_query,
    dead_letters_query,
    history_bound,
    history_query,
    message_limits_query,
    peek_query,
    recorded_query,
    records,
)
from dbq.errors import (
    DbqError,
    LeaseLost,
    QueueError,
    QueueFull,
    QueueNotFound,
    QueueUnavailable,
)
from dbq.names import QueueNames

if TYPE_CHECKING:
    from dbq.client.consume import ConsumeStats

SMART_BATCH_LIMIT = 500  # at most this many waiting calls share one round trip
# Idle connections past pool_size are kept while the load may come back for them: closed once
# unused this long. Closing them at once made threads that take turns (waiting in a shared round
# trip, then calling alone) open a connection a call.
IDLE_KEEP_S = 30.0


# A connection to PostgreSQL (psycopg, binary protocol) or SQL Server (pyodbc); both take `?`
# placeholders and parameters as arguments (`dbq.connection.postgres`).
Connection: TypeAlias = postgres.Connection | pyodbc.Connection
Cursor: TypeAlias = postgres.Cursor | pyodbc.Cursor


class _Session:
    """A connection with one cursor per statement: a cursor keeps its statement prepared, so a
    call costs one round trip instead of a prepare and an execute."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._cursors: dict[str, Cursor] = {}
        self.idle_since = 0.0  # monotonic: when it last came back to the pool

    def cursor(self, statement: str) -> Cursor:
        cur = self._cursors.get(statement)
        if cur is None:
            cur = self._cursors[statement] = self.conn.cursor()
        return cur


@dataclass(frozen=True)
class RepairResult:
    expired_leases: int
    orphans: int
    expired: int
    gaps_purged: int
    holes: int = 0
    dead_lettered: int = 0  # expired leases of messages acquired spec.deadLetter.maxAttempts times

    @classmethod
    def of_rows(cls, repaired: Sequence[Any], voided: Sequence[Any]) -> RepairResult:
        """From the rows of the repair and void_holes routines."""
        leases, orphans, expired, purged, dead = (int(v or 0) for v in repaired)
        return cls(leases, orphans, expired, purged, int(voided[0] or 0), dead)


class _Announcing:
    """A ring client's waker: before each wait it renews the queue's waiting mark (so pushes
    notify while it waits) and marks the notifications; a client whose listening fails polls
    from then on."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def mark(self) -> int:
        q = self.queue
        notifications = q._notifications
        if notifications is None:
            return 0
        try:
            count = notifications.mark()
        except DbqError:
            q._notifications = None
            return 0
        now = time.monotonic()
        if now >= q._announced_until:  # the client's mark lapses soon: renew it (once for all its threads)
            q._announced_until = now + WAIT_MARK_S / 2
            q._call("wait", WAIT_MARK_S)
        return count

    def wait(self, mark: int, seconds: float) -> None:
        notifications = self.queue._notifications
        if notifications is None:
            time.sleep(min(seconds, 0.05))
        else:
            notifications.wait(mark, seconds)


@dataclass(slots=True)
class Message:
    id: int
    body: bytes
    attempts: int
    lease: int | None
    headers: dict[str, HeaderValue] = field(default_factory=dict)
    _queue: Queue | None = field(default=None, repr=False, compare=False)

    def ack(self) -> None:
        """Done with it: it is never delivered again. Raises LeaseLost if the lease had expired."""
        self._leased().ack(self)

    def nack(self, delay: float = 0.0, error: str | None = None) -> bool:
        """Give it back: delivered again after `delay` seconds. With spec.deadLetter, a message
        acquired maxAttempts times goes to the dead letters instead, with `error`: then True."""
        queue = self._leased()
        delay_ms = int(seconds_arg(delay, "delay", 0.0) * 1000)
        if error is not None and not isinstance(error, str):
            raise TypeError(f"error is the failure's text, not {type(error).__name__}")
        done = int(queue._call("nack", self.id, self.lease, delay_ms, error)[0][0])
        if done == 0:
            raise LeaseLost.of_nack(self)
        return done == 2

    def give_back(self) -> None:
        """Return it unhandled (a consumer stopping): delivered again at once, and this delivery
        does not count as an attempt. Raises LeaseLost when the lease had expired."""
        if int(self._leased()._call("nack", self.id, self.lease, -1, None)[0][0]) == 0:
            raise LeaseLost.of_nack(self)

    def fail(self, delay: float, error: str | None) -> bool:
        """A handler failed on it (`dbq.client.consume`): nack with the delay and the error;
        whether it was dead-lettered."""
        return self.nack(delay, error)

    def extend(self, visibility: float) -> None:
        """Keep the lease for `visibility` more seconds (a long-running handler). Raises
        LeaseLost when it had expired already."""
        queue = self._leased()
        visibility_ms = int(seconds_arg(visibility, "visibility", 0.0, positive=True) * 1000)
        if int(queue._call("extend", self.id, self.lease, max(visibility_ms, 1))[0][0]) != 1:
            raise LeaseLost.of_nack(self)

    def _leased(self) -> Queue:
        if self.lease is None or self._queue is None:
            raise QueueError(f"message {self.id} was popped (at-most-once): there is nothing to ack or nack")
        return self._queue


# The bodies one call sends at most (a single larger body goes alone): large bodies in a batch go
# in several calls, so no statement carries hundreds of MB.
CALL_BYTES = 16 << 20


class Queue:
    def __init__(
        self,
        settings: ConnectionSettings,
        names: QueueNames,
        *,
        pool_size: int = 4,
        visibility: float = 30.0,
        push_timeout: float = 5.0,
        pop_timeout: float = 1.0,
        ttl: float = 0.0,
        hole_grace: float = HOLE_GRACE_S,
        smart_batching: bool = True,
        connection: Connection | None = None,
        notify: bool = True,
    ) -> None:
        """`connection`: calls go over this one (the operator's, lent by its pool), which
        close() leaves open. `notify` (PostgreSQL): a caller waiting on an empty queue is woken
        by the push that lands on it (LISTEN/NOTIFY, `dbq.client.notify`) instead of polling."""
        if settings.backend not in ("postgres", "sqlserver"):
            raise QueueError(
                f"{settings.backend} has no ring queues: connect with a postgresql:// or mssql:// url"
            )
        self.settings = settings
        self.names = names
        self.visibility = seconds_arg(visibility, "visibility", 0.0, positive=True)
        self.push_timeout = seconds_arg(push_timeout, "push_timeout", 0.0)
        self.pop_timeout = seconds_arg(pop_timeout, "pop_timeout", 0.0)
        self.ttl = seconds_arg(ttl, "ttl", 0.0)
        self.hole_grace = seconds_arg(hole_grace, "hole_grace", 0.0)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise ValueError(f"pool_size must be a whole number >= 0, not {pool_size!r}")
        self.pool_size = pool_size  # idle connections kept for reuse (more while in use: IDLE_KEEP_S)
        self._idle: list[_Session] = []
        self._lent = connection
        if connection is not None:
            self.pool_size = 1
            self._idle.append(_Session(connection))
        not_found = QueueNotFound(
            f"queue {names.queue} is not provisioned in schema {names.schema} at {settings.endpoint}:"
            " apply a Queue resource for it, or pass the schema it lives in"
        )
        # The same string object every call: pyodbc skips the prepare when the text is unchanged.
        self._statements = {verb: call_statement(settings.backend, names, verb) for verb in CALL_ARGS}
        row = self._describe(not_found)
        if not row:
            raise not_found
        version, size, message_bytes = (int(v) for v in row[:3])
        if version != RING_SCHEMA_VERSION:
            raise QueueError(
                f"queue {names.queue} has ring schema version {version}, this client speaks"
                f" {RING_SCHEMA_VERSION}: upgrade the operator (it migrates the queue) and the client together"
            )
        self.size = size
        self.message_bytes = message_bytes
        kept_by, header_bytes, max_headers, max_body_bytes = row[3:]
        self.header_limits = HeaderLimits(int(header_bytes), int(max_headers))  # spec.messages
        self.max_body_bytes = int(max_body_bytes)
        self._header_encoding = HEADER_ENCODING[settings.backend]
        # The queue whose dead-letter table keeps this queue's dead letters (spec.deadLetter.queue).
        self.dead_letter_keeper = QueueNames.of_qualified(kept_by) if kept_by else names
        # Single calls made at once by several threads share round trips (smart batching): pushes
        # by ttl and delay, acquires by lease.
        self._pushes: ByOptions[tuple[int, int | None], tuple[bytes, str | None], int] | None = None
        self._pops: Coalescer[None, Message | None] | None = None
        self._acquires: ByOptions[int, None, Message | None] | None = None
        self._acks: Coalescer[Message, None] | None = None
        if smart_batching:
            at_once = max(self.pool_size, 1)  # calls with a free pooled connection go at once
            self._pushes = ByOptions(
                lambda o: Coalescer(
                    lambda messages: self._store_once(messages, *o), SMART_BATCH_LIMIT, at_once
                )
            )
            self._pops = take_coalescer(
                lambda calls: self._take_now(len(calls), 0), SMART_BATCH_LIMIT, at_once
            )
            self._acquires = ByOptions(
                lambda lease_ms: take_coalescer(
                    lambda calls: self._take_now(len(calls), lease_ms), SMART_BATCH_LIMIT, at_once
                )
            )
            self._acks = ack_coalescer(self.ack_many, SMART_BATCH_LIMIT, at_once)
        self._notifications = (
            Notifications(settings, names) if notify and settings.backend == "postgres" else None
        )
        self._announced_until = 0.0  # monotonic: until when this client's wait mark surely holds

    def _describe(self, not_found: QueueNotFound) -> tuple[Any, ...]:
        """The queue's version, size, message bytes, dead-letter keeper and message limits. On
        PostgreSQL from its describe routine, which any right may call (a queue of a version
        before it answers its version from the metadata row, and the client refuses it); on SQL
        Server from the metadata row."""
        backend, names = self.settings.backend, self.names
        if backend == "postgres":
            try:
                described = tuple(self._call("describe")[0])
            except QueueNotFound:
                described = ()
            if described and described[0] is None:  # the routine is there, the queue's row is not
                raise not_found
            if described:
                return described
        try:
            with self._cursor() as cur:
                row = cur.execute(recorded_query(backend, names), names.queue).fetchone()
                if row is None or int(row[0]) != RING_SCHEMA_VERSION:
                    return (*row, "", 0, 0, 0) if row is not None else ()
                kept_by = cur.execute(dead_letter_queue_query(backend, names), names.queue).fetchval()
                limits = cur.execute(message_limits_query(backend, names), names.queue).fetchone()
        except QueueNotFound:  # no schema, no metadata table
            raise not_found from None
        return (*row, kept_by, *limits)

    # --- connections ----------------------------------------------------------------------
    @contextmanager
    def _cursor(self) -> Iterator[Cursor]:
        """A cursor for ad-hoc statements (tests, metadata)."""
        session = self._checkout()
        try:
            yield session.cursor("")
        except odbc.DRIVER_ERRORS as e:
            session.conn.close()
            raise self._translate(e) from None
        self._checkin(session)

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        """A cursor whose statements commit together when the block ends (roll back if it raises)."""
        session = self._checkout()
        conn = session.conn
        try:
            conn.autocommit = False
            yield conn.cursor()
            conn.commit()
            conn.autocommit = True
        except odbc.DRIVER_ERRORS as e:
            conn.close()
            raise self._translate(e) from None
        except BaseException:
            conn.close()
            raise
        self._checkin(session)

    def _checkout(self) -> _Session:
        try:
            return self._idle.pop()  # list.pop/append are atomic: no lock on the hot path
        except IndexError:
            return self._connect()

    def _checkin(self, session: _Session) -> None:
        now = session.idle_since = time.monotonic()
        self._idle.append(session)
        if len(self._idle) > self.pool_size:
            self._close_unused(now)

    def _close_unused(self, now: float) -> None:
        """Past pool_size, close the least recently used idle connection (the bottom of the
        pool: checkouts take from its top) if the load has not needed it for IDLE_KEEP_S."""
        try:
            oldest = self._idle[0]
        except IndexError:
            return
        if now - oldest.idle_since > IDLE_KEEP_S:
            try:
                self._idle.remove(oldest)
            except ValueError:  # checked out meanwhile
                return
            oldest.conn.close()

    def _call(self, verb: str, *args: Any) -> list[Any]:
        """One routine call, one round trip. A call the database rolled back for a deadlock or a
        serialization failure changed nothing, so it is simply made again."""
        statement = self._statements[verb]

        def once() -> list[Any]:
            session = self._checkout()
            try:
                rows = session.cursor(statement).execute(statement, *args).fetchall()
            except odbc.DRIVER_ERRORS as e:
                if odbc.rolled_back(e):
                    self._checkin(session)
                else:
                    session.conn.close()  # it may be broken: the next call opens a fresh one
                raise
            except BaseException:
                session.conn.close()
                raise
            self._checkin(session)
            return rows

        try:
            return odbc.retried(once)
        except odbc.DRIVER_ERRORS as e:
            if odbc.rolled_back(e):
                raise QueueUnavailable(
                    f"{self.settings.endpoint}: {verb} kept being rolled back: {e.args[-1]}"
                ) from None
            raise self._translate(e, verb) from None

    def _connect(self) -> _Session:
        try:
            if self.settings.backend == "postgres":
                return _Session(postgres.Connection.open(self.settings))
        except psycopg.Error as e:
            raise self._translate(e) from None
        return _Session(odbc.connect(self.settings))

    def _translate(self, e: Exception, verb: str = "") -> DbqError:
        """The error of dbq's family; a refusal names the right `verb` needs."""
        return odbc.translate(e, self.settings, self.names.qualified, str(right_of(verb) or ""))

    def close(self) -> None:
        if self._notifications is not None:
            self._notifications.close()
        while True:
            try:
                session = self._idle.pop()
            except IndexError:
                return
            if session.conn is not self._lent:
                session.conn.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- push -----------------------------------------------------------------------------
    def _check_bodies(self, bodies: Sequence[bytes]) -> None:
        check_bodies(bodies, self.max_body_bytes, self.names.queue, f"{MAX_RING_BODY_BYTES} on a ring")

    def _ttl_ms(self, ttl: float | None) -> int:
        return int(seconds_arg(ttl, "ttl", self.ttl) * 1000)

    @staticmethod
    def _delay_ms(delay: float | None) -> int | None:
        return None if delay is None else int(seconds_arg(delay, "delay", 0.0) * 1000)

    def push(
        self,
        body: bytes,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
        headers: Headers | None = None,
    ) -> int:
        """Store one message; its id. Waits while the ring is full, then raises QueueFull. With
        `delay` (seconds), it is delivered no earlier than that from now; `headers`: names to
        values carried beside the body (`dbq.contract.headers`)."""
        if self._pushes is None:
            return self.push_many([body], timeout=timeout, ttl=ttl, delay=delay, headers=headers)[0]
        self._check_bodies([body])
        stored = header_codec.encode(headers, self.header_limits)
        options = (self._ttl_ms(ttl), self._delay_ms(delay))
        deadline = Deadline(seconds_arg(timeout, "timeout", self.push_timeout))
        # While the ring is full: wait for room.
        while (msg_id := self._pushes(options, (bytes(body), stored))) <= 0:
            if not deadline.wait():
                raise self._full(deadline, 1, [None])
        return msg_id

    def push_many(
        self,
        bodies: Sequence[bytes],
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        delay: float | None = None,
        headers: Headers | Sequence[Headers | StoredHeaders | None] | None = None,
    ) -> list[int]:
        """Store several messages with one round trip (while the ring has room); their ids, in
        order. With `delay`, they wait aside (not in the ring, which never waits for them) and
        are delivered once due, among the ring's messages; `ttl` then counts from that time.
        `headers`: one mapping for every message, or one (or None) per message."""
        self._check_bodies(bodies)
        stored = header_codec.encode_each(headers, len(bodies), self.header_limits)
        messages = [(bytes(b), h) for b, h in zip(bodies, stored, strict=True)]
        ttl_ms, delay_ms = self._ttl_ms(ttl), self._delay_ms(delay)
        deadline = Deadline(seconds_arg(timeout, "timeout", self.push_timeout))
        if delay_ms is not None:
            return self._store_once(messages, ttl_ms, delay_ms)
        ids: list[int | None] = [None] * len(bodies)
        todo = list(range(len(bodies)))
        while todo:
            got = self._store_once([messages[i] for i in todo], ttl_ms, None)
            left = []
            for i, msg_id in zip(todo, got, strict=True):
                if msg_id > 0:
                    ids[i] = msg_id
                else:
                    left.append(i)
            if len(left) < len(todo):
                deadline.restart()
            todo = left
            if todo and not deadline.wait():
                raise self._full(deadline, len(bodies), ids)
        return [i for i in ids if i is not None]

    def _full(self, deadline: Deadline, total: int, ids: list[int | None]) -> QueueFull:
        left = sum(i is None for i in ids)
        return QueueFull(
            f"queue {self.names.queue} stayed full ({self.size} slots) for {deadline.timeout:g}s:"
            f" {left} of {total} messages not stored; add consumers, or raise"
            " spec.ring.size (resized online) or spec.timeouts.pushWait",
            ids,
        )

    def _store_once(
        self, messages: list[tuple[bytes, str | None]], ttl_ms: int, delay_ms: int | None
    ) -> list[int]:
        """One round trip per CALL_BYTES of bodies (one, unless they are large): the ids of the
        (body, stored headers) messages, in order, 0 for each the full ring did not take (push,
        push_many), or, with a delay, ids for them all (defer: they wait aside)."""
        out: list[int] = []
        start = 0
        while start < len(messages):
            end, size = start, 0
            while end < len(messages) and (end == start or size + len(messages[end][0]) <= CALL_BYTES):
                size += len(messages[end][0])
                end += 1
            out += self._store_call(messages[start:end], ttl_ms, delay_ms)
            start = end
        return out

    def _store_call(
        self, messages: list[tuple[bytes, str | None]], ttl_ms: int, delay_ms: int | None
    ) -> list[int]:
        """One round trip of `_store_once`."""
        if delay_ms is None and len(messages) == 1:
            body, headers = messages[0]
            return [int(self._call("push", body, ttl_ms, headers)[0][0])]
        bodies = b"".join(body for body, _ in messages)
        lengths = ",".join(str(len(body)) for body, _ in messages)
        headers = _header_list([h for _, h in messages])
        if delay_ms is None:
            text = self._call("push_many", bodies, lengths, ttl_ms, headers)[0][0]
        else:
            text = self._call("defer", bodies, lengths, ttl_ms, delay_ms, headers)[0][0]
        return [int(v) for v in text.split(",")] if text else []

    # --- pop / acquire --------------------------------------------------------------------
    def pop(self, timeout: float | None = None) -> Message | None:
        """At-most-once: the message is gone from the queue once returned. None if none came in time."""
        pops = self._pops
        return self._take_one(None if pops is None else lambda: pops(None), 0, timeout)

    def pop_many(self, n: int, timeout: float | None = None) -> list[Message]:
        return self._take(n, timeout, lease_ms=0)

    def acquire(self, timeout: float | None = None, visibility: float | None = None) -> Message | None:
        """At-least-once: the message is leased for `visibility` seconds; ack() it, or it comes back."""
        lease_ms, acquires = self._lease_ms(visibility), self._acquires
        return self._take_one(
            None if acquires is None else lambda: acquires(lease_ms, None), lease_ms, timeout
        )

    def acquire_many(
        self, n: int, timeout: float | None = None, visibility: float | None = None
    ) -> list[Message]:
        return self._take(n, timeout, lease_ms=self._lease_ms(visibility))

    def _take_one(
        self, together: Callable[[], Message | None] | None, lease_ms: int, timeout: float | None
    ) -> Message | None:
        """One message, taken with the other callers waiting at once when `together` (a call of
        a take coalescer) is given."""
        if together is not None:
            return take_one(
                together,
                seconds_arg(timeout, "timeout", self.pop_timeout),
                self._waker(),
                FALLBACK_S,
                POLL_FIRST_S,
            )
        got = self._take(1, timeout, lease_ms)
        return got[0] if got else None

    def _take(self, n: int, timeout: float | None, lease_ms: int) -> list[Message]:
        """Pop/acquire up to n, waiting up to the timeout for the first."""
        count_arg(n, "n")
        deadline = Deadline(seconds_arg(timeout, "timeout", self.pop_timeout))
        return take_until(
            lambda: self._take_now(n, lease_ms), deadline, self._waker(), FALLBACK_S, POLL_FIRST_S
        )

    def _waker(self) -> _Announcing | None:
        """How a waiting caller is woken: by notifications (PostgreSQL), announcing its wait so
        that pushes send them; None (poll) elsewhere, or once listening failed."""
        return None if self._notifications is None else _Announcing(self)

    def _take_now(self, n: int, lease_ms: int) -> list[Message]:
        """Up to n messages, with one pop round trip (plus one for each drawn position whose
        message is still being written)."""
        found = self._records("pop", lease_ms) if n == 1 else self._records("pop_many", n, lease_ms)
        return self._messages(found, lease_ms, self._call)

    def pop_many_in(self, cur: Cursor, n: int) -> list[Message]:
        """Pop up to n waiting messages inside the caller's transaction (`_transaction()`),
        without waiting for more: they leave the queue only if it commits. Should it roll back,
        or its process die, the messages stay; their spent positions make them orphans, which
        repair delivers again (the popped total, a sequence, counts them once more)."""
        count_arg(n, "n")

        def call(verb: str, *args: Any) -> list[Any]:
            return cur.execute(self._statements[verb], *args).fetchall()

        found = records(b"".join(r[0] for r in call("pop_many", n, 0)), self._header_encoding)
        return self._messages(list(found), 0, call)

    def _messages(self, found: list[Record], lease_ms: int, call: Callable[..., list[Any]]) -> list[Message]:
        """The messages a pop found. A position it drew whose message is still being written (its
        pusher drew it and has not committed yet) is taken once written, waited for up to
        `hole_grace`; then its pusher is taken for dead and the position released (whoever finds
        it later delivers the message, should it come)."""
        messages = [self._message(r) for r in found if r[0] == MESSAGE]
        since = time.monotonic()
        for position in (r[1] for r in found if r[0] == NOT_WRITTEN):
            while True:
                record = next(records(call("take", position, lease_ms)[0][0], self._header_encoding))
                if record[0] == MESSAGE:
                    messages.append(self._message(record))
                elif record[0] == NOT_WRITTEN and time.monotonic() - since < self.hole_grace:
                    time.sleep(0.0005)
                    continue
                elif record[0] == NOT_WRITTEN:
                    call("release", str(position))
                break
        return messages

    def _lease_ms(self, visibility: float | None) -> int:
        lease_ms = int(seconds_arg(visibility, "visibility", self.visibility, positive=True) * 1000)
        if lease_ms < 1:
            raise ValueError("visibility must be positive: it is how long the consumer may hold a message")
        return lease_ms

    def _records(self, verb: str, *args: Any) -> list[Record]:
        """Call take/pop/pop_many; the records it answered with."""
        rows = self._call(verb, *args)
        blob = rows[0][0] if len(rows) == 1 else b"".join(r[0] for r in rows)
        return list(records(blob, self._header_encoding))

    def _message(self, record: Record) -> Message:
        _, msg_id, lease, attempts, headers, body = record
        return Message(
            id=msg_id, body=body, attempts=attempts, lease=lease or None,
            headers=header_codec.decode(headers), _queue=self,
        )  # fmt: skip

    def ack(self, message: Message) -> None:
        """Acknowledge one leased message (`Message.ack()`), with the other acks made at once."""
        if self._acks is not None:
            self._acks(message)
        else:
            self.ack_many([message])

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge several leased messages in one round trip. Raises LeaseLost, whose
        `messages` are those whose lease had expired; the others are acknowledged."""
        batch = list(messages)
        for m in batch:
            m._leased()
        if not batch:
            return
        if len(batch) == 1:
            one = batch[0]
            acked = {one.id} if int(self._call("ack", one.id, one.lease)[0][0]) == 1 else set()
        else:
            ids = ",".join(str(m.id) for m in batch)
            leases = ",".join(str(m.lease) for m in batch)
            text = self._call("ack_many", ids, leases)[0][0]
            acked = {int(v) for v in text.split(",")} if text else set()
        lost = [m for m in batch if m.id not in acked]
        if lost:
            raise LeaseLost.of_acks(lost, len(batch))

    def peek(self, n: int) -> list[Message]:
        """Up to n waiting messages in id order, none taken or leased: a snapshot for looking,
        while pushes and takes go on."""
        count_arg(n, "n")
        rows = self._read("peek", lambda b: (peek_query(b, self.names), n), n)
        return [
            Message(
                id=int(r[0]),
                body=bytes(r[1]),
                attempts=int(r[2]),
                lease=None,
                headers=header_codec.decode(r[3]),
            )
            for r in rows
        ]

    def consume(self, handler: Callable[..., object], **options: Any) -> ConsumeStats:
        """Run `handler(message)` for each message, acked when it returns and nacked with
        backoff when it raises, holding at most `credit` messages (`dbq.client.consume`)."""
        from dbq.client.consume import consume

        return consume(self, handler, **options)

    def _read(self, verb: str, query: Callable[[str], tuple[Any, ...]], *args: Any) -> list[Any]:
        """Rows a login reads: on PostgreSQL from the queue's routine `verb` (called with `args`),
        which its right may call with no grant on a table; on SQL Server by the statement and
        parameters `query(backend)` gives."""
        if self.settings.backend == "postgres":
            return self._call(verb, *args)
        statement, *params = query(self.settings.backend)
        session = self._checkout()
        try:
            rows = session.cursor("").execute(statement, *params).fetchall()
        except odbc.DRIVER_ERRORS as e:
            session.conn.close()
            raise self._translate(e, verb) from None
        self._checkin(session)
        return list(rows)

    # --- state and repair -----------------------------------------------------------------
    def stats(self) -> QueueStats:
        return QueueStats.of_row(self._call("stats")[0])

    def history(self, since: datetime, until: datetime) -> list[HistorySample]:
        """The operator's statistics samples of this queue taken in [since, until), oldest first."""
        bounds = (history_bound(self.settings.backend, since), history_bound(self.settings.backend, until))
        rows = self._read(
            "history", lambda b: (history_query(b, self.names), self.names.queue, *bounds), *bounds
        )
        return [HistorySample.of_row(row[0], row[1:]) for row in rows]

    def repair(self, orphan_grace: float = 5.0) -> RepairResult:
        """Roll back expired leases, rescue orphans drawn over `orphan_grace` s ago, void holes
        (positions drawn and not written) that old, drop expired messages.

        Idempotent and safe while clients work; the operator's cleanup runs it on schedule.
        """
        grace_ms = int(seconds_arg(orphan_grace, "orphan_grace", 5.0) * 1000)
        return RepairResult.of_rows(self._call("repair", grace_ms)[0], self._call("void_holes", grace_ms)[0])

    # --- dead letters ---------------------------------------------------------------------
    def dead_letters(self, limit: int = 100, *, held: bool = False) -> list[DeadLetter]:
        """This queue's dead letters, oldest first (at most `limit`), wherever they are kept (its
        own table, or spec.deadLetter.queue's). `held`: instead, every dead letter this queue's
        table keeps, its own and other queues' (see DeadLetter.source)."""
        n = count_arg(limit, "limit")

        def query(backend: str) -> tuple[Any, ...]:
            if held:
                return dead_letters_query(backend, self.names, False), n
            return dead_letters_query(backend, self.dead_letter_keeper, True), n, self.names.qualified

        rows = self._read("dead_letters", query, held, n)
        return [
            DeadLetter(
                int(r[0]),
                int(r[1]),
                r[2],
                float(r[3]),
                float(r[4]),
                bytes(r[5]),
                str(r[6]),
                header_codec.decode(r[7]),
            )
            for r in rows
        ]

    def redrive(self, ids: Iterable[int] | None = None, limit: int = 10_000) -> int:
        """Dead letters back to delivery with their ids and attempts from zero: `ids`, or the
        oldest `limit`. How many moved."""
        return int(self._call("redrive", _id_list(ids), count_arg(limit, "limit"))[0][0])

    def purge_dead_letters(self, ids: Iterable[int] | None = None, limit: int = 10_000) -> int:
        """Dead letters deleted for good: `ids`, or the oldest `limit`. How many went."""
        return int(self._call("purge_dead", _id_list(ids), count_arg(limit, "limit"))[0][0])

    # --- archive ---------------------------------------------------------------------------
    def archived(self, since: datetime, limit: int = 100) -> list[ArchivedMessage]:
        """Archived messages (spec.archive) acked or popped at or after `since`, oldest first."""
        bound, n = history_bound(self.settings.backend, since), count_arg(limit, "limit")
        rows = self._read("archived", lambda b: (archive_query(b, self.names), bound, n), bound, n)
        return [
            ArchivedMessage(
                int(r[0]), int(r[1]), float(r[2]), float(r[3]), bytes(r[4]), header_codec.decode(r[5])
            )
            for r in rows
        ]

    def scavenge_archive(self, retention: float, limit: int = 5_000) -> int:
        """Remove archived messages acked more than `retention` s ago, at most `limit` in one
        transaction. How many went (fewer than `limit`: none older is left)."""
        retention_ms = int(seconds_arg(retention, "retention", 0.0) * 1000)
        return int(self._call("scavenge", retention_ms, count_arg(limit, "limit"))[0][0])


def _header_list(stored: list[str | None]) -> str | None:
    """Several messages' stored headers as one JSON array (null for a message without), or None
    when none has any: the routine then parses nothing."""
    if all(h is None for h in stored):
        return None
    return "[" + ",".join("null" if h is None else h for h in stored) + "]"


def _id_list(ids: Iterable[int] | None) -> str:
    """Message ids as the routines take them ('' for none given)."""
    if ids is None:
        return ""
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 1:
            raise ValueError(f"a message id is a whole number >= 1, not {i!r}")
        out.append(str(i))
    if not out:
        raise ValueError("ids is empty: give the ids to move, or None for the oldest")
    return ",".join(out)
