"""Client of a Service Broker queue (SQL Server): push, pop, acquire/ack/nack, stats, trace.

The same interface as the ring where Service Broker's semantics allow; the differences:
- push sends on a conversation this client reuses (begun once, ended and replaced after
  `conversation_messages` messages or `conversation_seconds`), so senders leak no endpoints.
  A queue has no size bound: push never waits (no QueueFull) and takes no ttl. Ids are
  `<conversation id>:<sequence number>`, strings.
- one RECEIVE returns messages of one conversation group only: `pop_many(n)` may return fewer
  than n while more wait in other conversations. Order is kept within a conversation, i.e. per
  sender.
- acquire() receives inside a transaction that stays open: `ack()` commits it, `nack()` rolls it
  back (the message is at the head of its conversation again at once: no delay). The lease is
  the transaction: a consumer that dies gives its message back when its session ends, and one
  that holds it past `visibility` has it rolled back by the client. With poison-message handling
  on, five rollbacks of one message in a row disable the queue (the operator reports it), so a
  handler that cannot process a message should ack it and record the failure elsewhere.
- no acquire_many and no smart batching; `attempts` is not counted by Service Broker (always 1).

Not thread-safe per method call like the ring's client: one lock serialises sends (one
conversation keeps them in order), and each pop or acquire uses a connection of its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyodbc

from dbq.client.stats import HistorySample, QueueStats
from dbq.client.waiting import check_bodies, count_arg, seconds_arg
from dbq.connection import ConnectionSettings, odbc
from dbq.contract.broker import CONVERSATION_SECONDS_MAX, BrokerStatements
from dbq.contract.ring import history_bound, history_query
from dbq.errors import LeaseLost, QueueError, QueueNotFound
from dbq.names import QueueNames

if TYPE_CHECKING:
    from dbq.client.consume import ConsumeStats

# SQL Server takes at most 2,100 parameters per statement: sends go in chunks.
SEND_CHUNK = 1000
# Errors that mean "this conversation cannot be sent on any more" (ended by cleanup, or failed):
# the sender begins a new one and sends again (nothing was sent).
DEAD_CONVERSATION = ("8429", "8426", "8437", "8462")


def _no_ttl(ttl: float | None) -> None:
    if seconds_arg(ttl, "ttl", 0.0):
        raise ValueError("ttl must be 0 on Service Broker: its messages have no lifetime (use a ring queue)")


def _no_headers(headers: object) -> None:
    if headers:
        raise ValueError(
            "headers: a Service Broker message is a body alone (SEND carries no properties): put them in"
            " the body (for example a JSON envelope), or use a ring queue on SQL Server, which carries headers"
        )


@dataclass(slots=True)
class BrokerMessage:
    id: str
    body: bytes
    attempts: int = 1
    _held: _Held | None = field(default=None, repr=False, compare=False)
    headers: dict[str, object] = field(default_factory=dict)  # always empty: see _no_headers

    @property
    def lease(self) -> object | None:
        return self._held

    def ack(self) -> None:
        """Commit its receive: it is gone. Raises LeaseLost past its visibility (rolled back)."""
        self._holder().settle(True, self)

    def nack(self, delay: float = 0.0) -> None:
        """Roll its receive back: delivered again at once (`delay` must be 0 on Service Broker)."""
        if seconds_arg(delay, "delay", 0.0):
            raise ValueError(
                "delay must be 0 on Service Broker: a rolled-back message is delivered again at once"
            )
        self._holder().settle(False, self)

    def give_back(self) -> None:
        """Return it unhandled (a consumer stopping): its receive is rolled back."""
        self.nack()

    def fail(self, delay: float, error: str | None) -> bool:
        """A handler failed on it (`dbq.client.consume`): roll its receive back, so it is
        delivered again at once (Service Broker has no delay); no dead letters: False."""
        self.nack()
        return False

    def _holder(self) -> _Held:
        if self._held is None:
            raise QueueError(f"message {self.id} was popped (at-most-once): there is nothing to ack or nack")
        return self._held


class _Held:
    """The connection of an acquired message, its transaction open until ack, nack or the end of
    its visibility (a timer rolls it back then)."""

    def __init__(self, queue: BrokerQueue, conn: pyodbc.Connection, visibility: float) -> None:
        self.queue = queue
        self.conn = conn
        self.lock = threading.Lock()
        self.settled = False
        self.timer = threading.Timer(visibility, self._expire)
        self.timer.daemon = True
        self.timer.start()

    def _expire(self) -> None:
        with self.lock:
            if not self.settled:
                self._end(False)

    def settle(self, commit: bool, message: BrokerMessage) -> None:
        with self.lock:
            if self.settled:
                raise LeaseLost.of_nack(message) if not commit else LeaseLost.of_acks([message], 1)
            self.timer.cancel()
            self._end(commit)

    def _end(self, commit: bool) -> None:
        self.settled = True
        try:
            self.conn.cursor().execute(self.queue.sql.settle(commit))
        except pyodbc.Error as e:
            self.conn.close()
            raise self.queue._translate(e) from None
        self.queue._give(self.conn)


class BrokerQueue:
    def __init__(
        self,
        settings: ConnectionSettings,
        names: QueueNames,
        *,
        visibility: float = 30.0,
        pop_timeout: float = 1.0,
        conversation_messages: int = 10_000,
        conversation_seconds: float = 60.0,
        push_timeout: float = 0.0,
        ttl: float = 0.0,
    ) -> None:
        """`push_timeout` is accepted for the Queue resource's defaults and means nothing here (a
        Service Broker queue has no bound); `ttl` must be 0 (messages have no lifetime)."""
        if settings.backend != "sqlserver":
            raise QueueError(f"{settings.backend} has no Service Broker queues: connect with an mssql:// url")
        self.settings = settings
        self.names = names
        seconds_arg(push_timeout, "push_timeout", 0.0)
        _no_ttl(ttl)
        self.visibility = seconds_arg(visibility, "visibility", 0.0, positive=True)
        self.pop_timeout = seconds_arg(pop_timeout, "pop_timeout", 0.0)
        self.conversation_messages = count_arg(conversation_messages, "conversation_messages")
        self.conversation_seconds = seconds_arg(
            conversation_seconds, "conversation_seconds", 60.0, positive=True
        )
        if self.conversation_seconds > CONVERSATION_SECONDS_MAX:
            raise ValueError(
                f"conversation_seconds must be at most {CONVERSATION_SECONDS_MAX:.0f}, not {conversation_seconds!r}:"
                " the operator's cleanup ends a sender's conversation past twice that"
            )
        self.sql = BrokerStatements(names)
        self._idle: list[pyodbc.Connection] = []
        self._send_lock = threading.Lock()
        self._sender: pyodbc.Connection | None = None
        self._conversation: tuple[str, str] | None = None  # (handle, conversation id)
        self._sent = 0  # on this conversation
        self._begun_at = 0.0
        self._ids: dict[str, str] = {}  # target-side handle -> conversation id
        conn = self._take()
        try:
            found = conn.cursor().execute(self.sql.provisioned()).fetchval()
        except pyodbc.Error as e:
            conn.close()
            raise self._translate(e) from None
        self._give(conn)
        if not found:
            raise QueueNotFound(
                f"Service Broker queue {names.queue} is not provisioned in schema {names.schema} at"
                f" {settings.endpoint}: apply a Queue resource for it (design servicebroker)"
            )

    # --- connections ------------------------------------------------------------------------
    def _take(self) -> pyodbc.Connection:
        try:
            return self._idle.pop()
        except IndexError:
            return odbc.connect(self.settings)

    def _give(self, conn: pyodbc.Connection) -> None:
        if len(self._idle) < 4:
            self._idle.append(conn)
        else:
            conn.close()

    def _translate(self, e: pyodbc.Error) -> QueueError:
        return odbc.translate(e, self.settings)

    def close(self) -> None:
        """Ends this client's conversation (its messages stay deliverable) and closes connections."""
        with self._send_lock:
            self._end_conversation()
            if self._sender is not None:
                self._sender.close()
                self._sender = None
        while self._idle:
            self._idle.pop().close()

    def __enter__(self) -> BrokerQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- push -------------------------------------------------------------------------------
    def push(
        self, body: bytes, *, timeout: float | None = None, ttl: float | None = None, headers: object = None
    ) -> str:
        """Send one message; its id. (`timeout`: a Service Broker queue is never full; `headers`
        are refused: a Service Broker message has none.)"""
        return self.push_many([body], timeout=timeout, ttl=ttl, headers=headers)[0]

    def push_many(
        self,
        bodies: Sequence[bytes],
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        headers: object = None,
    ) -> list[str]:
        """Send the messages on this client's conversation, in order, each chunk in one transaction."""
        seconds_arg(timeout, "timeout", 0.0)
        _no_ttl(ttl)
        _no_headers(headers)
        check_bodies(bodies)  # bytes; their size is SQL Server's to limit (2 GB)
        ids: list[str] = []
        with self._send_lock:
            for start in range(0, len(bodies), SEND_CHUNK):
                ids += self._send([bytes(b) for b in bodies[start : start + SEND_CHUNK]])
        return ids

    def _send(self, chunk: list[bytes]) -> list[str]:
        for attempt in (1, 2):
            handle, conversation_id = self._current()
            assert self._sender is not None
            try:
                self._sender.cursor().execute(self.sql.send(len(chunk)), handle, *chunk)
            except pyodbc.Error as e:
                _, text = odbc.driver_error(e, self.settings)
                self._conversation = None
                if attempt == 1 and any(code in text for code in DEAD_CONVERSATION):
                    continue  # the conversation was ended under us: nothing sent, begin another
                self._sender.close()
                self._sender = None
                raise self._translate(e) from None
            first = self._sent
            self._sent += len(chunk)
            return [f"{conversation_id}:{first + i}" for i in range(len(chunk))]
        raise AssertionError("unreachable")

    def _end_conversation(self) -> None:
        """The sender's end of its conversation: messages sent on it stay deliverable."""
        if self._conversation is not None and self._sender is not None:
            with contextlib.suppress(pyodbc.Error):  # else cleanup ends it once it is stalled
                self._sender.cursor().execute(self.sql.end_dialog(), self._conversation[0])
        self._conversation = None

    def _current(self) -> tuple[str, str]:
        """This client's conversation: begun on first use, replaced when it is old or long."""
        if self._sender is None:
            self._sender = odbc.connect(self.settings)
        stale = (
            self._sent >= self.conversation_messages
            or time.monotonic() - self._begun_at > self.conversation_seconds
        )
        if stale:
            self._end_conversation()
        if self._conversation is None:
            try:
                row = self._sender.cursor().execute(self.sql.begin_dialog()).fetchone()
            except pyodbc.Error as e:
                self._sender.close()
                self._sender = None
                raise self._translate(e) from None
            self._conversation = (str(row[0]), str(row[1]))
            self._sent, self._begun_at = 0, time.monotonic()
        return self._conversation

    # --- pop and acquire ----------------------------------------------------------------------
    def pop(self, timeout: float | None = None) -> BrokerMessage | None:
        got = self.pop_many(1, timeout)
        return got[0] if got else None

    def pop_many(self, n: int, timeout: float | None = None) -> list[BrokerMessage]:
        """Up to n messages of one conversation group, removed as they are returned (at-most-once)."""
        count_arg(n, "n")
        conn = self._take()
        try:
            rows = self._receive(conn, n, seconds_arg(timeout, "timeout", self.pop_timeout), hold=False)
        except BaseException:
            conn.close()
            raise
        self._give(conn)
        return [self._message(conn, row) for row in rows]

    def acquire(self, timeout: float | None = None, visibility: float | None = None) -> BrokerMessage | None:
        """One message leased until ack or nack: its receive's transaction stays open."""
        lease = seconds_arg(visibility, "visibility", self.visibility, positive=True)
        conn = self._take()
        try:
            rows = self._receive(conn, 1, seconds_arg(timeout, "timeout", self.pop_timeout), hold=True)
        except BaseException:
            conn.close()
            raise
        if not rows:
            self._give(conn)
            return None
        message = self._message(conn, rows[0])
        message._held = _Held(self, conn, lease)
        return message

    def _receive(self, conn: pyodbc.Connection, n: int, timeout: float, *, hold: bool) -> list[Any]:
        """Receive until a message (not only end-of-conversation ones) came or the time is up.
        With `hold`, the transaction of the receive that returned a message stays open."""
        deadline = time.monotonic() + timeout
        cur = conn.cursor()
        while True:
            left_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            try:
                rows = [
                    r for r in cur.execute(self.sql.receive(hold), n, left_ms).fetchall() if r[2] == "message"
                ]
                if hold and not rows:
                    cur.execute(self.sql.commit_open())  # the conversations it ended, tracers
            except pyodbc.Error as e:
                raise self._translate(e) from None
            if rows or time.monotonic() >= deadline:
                return rows

    def _message(self, conn: pyodbc.Connection, row: Any) -> BrokerMessage:
        handle, seq, _kind, body = row
        handle = str(handle)
        conversation = self._ids.get(handle)
        if conversation is None:
            found = conn.cursor().execute(self.sql.conversation_ids(), handle).fetchone()
            conversation = self._ids[handle] = str(found[0]) if found else handle
        return BrokerMessage(id=f"{conversation}:{int(seq)}", body=bytes(body or b""))

    def ack(self, message: BrokerMessage) -> None:
        message.ack()

    def ack_many(self, messages: Iterable[BrokerMessage]) -> None:
        """Ack each (each was received in a transaction of its own). Raises LeaseLost naming the
        messages whose visibility had passed; the others are acknowledged."""
        batch = list(messages)
        lost = []
        for m in batch:
            try:
                m.ack()
            except LeaseLost:
                lost.append(m)
        if lost:
            raise LeaseLost.of_acks(lost, len(batch))

    def consume(self, handler: Callable[..., object], **options: Any) -> ConsumeStats:
        """Run `handler(message)` for each message, acked when it returns and nacked with
        backoff when it raises, holding at most `credit` messages (`dbq.client.consume`)."""
        from dbq.client.consume import consume

        return consume(self, handler, **options)

    # --- state ------------------------------------------------------------------------------
    def stats(self) -> QueueStats:
        conn = self._take()
        try:
            row = conn.cursor().execute(self.sql.stats()).fetchone()
        except pyodbc.Error as e:
            conn.close()
            raise self._translate(e) from None
        self._give(conn)
        return QueueStats.of_row(row)

    def history(self, since: datetime, until: datetime) -> list[HistorySample]:
        """The operator's statistics samples of this queue taken in [since, until), oldest first."""
        bounds = (history_bound("sqlserver", since), history_bound("sqlserver", until))
        conn = self._take()
        try:
            rows = (
                conn.cursor()
                .execute(history_query("sqlserver", self.names), self.names.queue, *bounds)
                .fetchall()
            )
        except pyodbc.Error as e:
            conn.close()
            raise self._translate(e) from None
        self._give(conn)
        return [HistorySample.of_row(row[0], row[1:]) for row in rows]

    def trace(self, timeout: float = 5.0) -> float:
        """A tracer token's round trip through the queue's services: the milliseconds from send
        to receive. Raises QueueError with the transmission status when it did not arrive. (A
        consumer receiving at that moment may take the token first, and drops it: try again.)"""
        wait_ms = int(seconds_arg(timeout, "timeout", 5.0, positive=True) * 1000)
        conn = self._take()
        try:
            received, ms, status = conn.cursor().execute(self.sql.trace(), wait_ms).fetchone()
        except pyodbc.Error as e:
            conn.close()
            raise self._translate(e) from None
        self._give(conn)
        if not received:
            raise QueueError(
                f"the tracer token did not arrive in queue {self.names.queue} within {timeout:g} s"
                f" ({status or 'no transmission status: check the checks in the Queue status'})"
            )
        return float(ms)
