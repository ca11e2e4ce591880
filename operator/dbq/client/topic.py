"""Client of a topic (PostgreSQL): `publish` routes a message, in one round trip and one
transaction, into the queue of every subscription whose filter matches it (`dbq.contract.topics`).
Each subscriber consumes its own queue with `dbq.client.connect`.

Thread-safe: calls borrow connections from a small pool, as `dbq.client.ring.Queue` does.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from dbq.api.limits import CONTROL
from dbq.client.waiting import Deadline, seconds_arg
from dbq.connection import ConnectionSettings, odbc, postgres
from dbq.contract import headers as header_codec
from dbq.contract.headers import SUBJECT, HeaderLimits, Headers
from dbq.contract.topics import FULL_STATE, TopicNames, publish_statement, routed_ids
from dbq.errors import DbqError, QueueError, QueueFull, QueueUnavailable

MAX_SUBJECT = 256  # characters of a subject (a filter's subject clauses compare up to 256)
# The widest headers any queue allows (spec.messages): each subscription's queue checks its own
# limits when the routine pushes the copy, and a copy it refuses fails the publish.
WIDEST = HeaderLimits(header_bytes=65_536, max_headers=256)


class Topic:
    def __init__(
        self,
        settings: ConnectionSettings,
        names: TopicNames,
        *,
        ttl: float = 0.0,
        timeout: float = 5.0,
        pool_size: int = 4,
    ) -> None:
        """`ttl`: the copies' default time to live; `timeout`: how long a publish is made again
        while the subscriptions change under it."""
        if settings.backend != "postgres":
            raise QueueError(f"{settings.backend} has no topics yet: connect with a postgresql:// url")
        self.settings = settings
        self.names = names
        self.ttl = seconds_arg(ttl, "ttl", 0.0)
        self.timeout = seconds_arg(timeout, "timeout", 0.0)
        self.pool_size = pool_size
        self._statement = publish_statement(names)
        self._idle: list[postgres.Connection] = []

    def publish(
        self,
        body: bytes,
        *,
        headers: Headers | None = None,
        subject: str | None = None,
        ttl: float | None = None,
    ) -> dict[str, int]:
        """Route one message: its id in each subscription's queue that got a copy, by
        subscription ('' for the topic's queue of unrouted messages). A subscription whose queue
        is full and says onFull: Reject fails it whole (QueueFull; no queue got a copy)."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(f"body is bytes, not {type(body).__name__}")
        stored = _stored_headers(headers, subject)
        ttl_ms = int(seconds_arg(ttl, "ttl", self.ttl) * 1000)
        return routed_ids(self._call(bytes(body), stored, subject, ttl_ms))

    def _call(self, *args: object) -> str | None:
        """One call of the routine. One refused because the subscriptions changed while it
        waited (or a deadlock) changed nothing: it is made again, for up to `timeout` seconds."""
        deadline = Deadline(self.timeout)
        while True:
            conn = self._checkout()
            try:
                answer = conn.cursor().execute(self._statement, *args).fetchval()
            except psycopg.Error as e:
                if not odbc.rolled_back(e):
                    conn.close()
                    raise self._translate(e) from None
                self._checkin(conn)
                if not deadline.wait():
                    raise QueueUnavailable(
                        f"{self.settings.endpoint}: publish to topic {self.names.topic} kept being rolled back"
                        f" for {self.timeout:g}s: {odbc.driver_error(e, self.settings)[1].splitlines()[0]}"
                    ) from None
                continue
            except BaseException:
                conn.close()
                raise
            self._checkin(conn)
            return None if answer is None else str(answer)

    def _translate(self, e: psycopg.Error) -> DbqError:
        if odbc.sql_state(e) == FULL_STATE:
            return QueueFull(odbc.driver_error(e, self.settings)[1].splitlines()[0], [None])
        return odbc.translate(e, self.settings)

    def _checkout(self) -> postgres.Connection:
        try:
            return self._idle.pop()
        except IndexError:
            try:
                return postgres.Connection.open(self.settings)
            except psycopg.Error as e:
                raise odbc.translate(e, self.settings) from None

    def _checkin(self, conn: postgres.Connection) -> None:
        if len(self._idle) < self.pool_size:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def __enter__(self) -> Topic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stored_headers(headers: Headers | None, subject: str | None) -> str | None:
    """The headers the copies carry: the caller's (checked as a push checks them), and the
    subject as `dbq-subject`."""
    checked = header_codec.encode(headers, WIDEST)  # refuses dbq's own keys, bad names and values
    if subject is None:
        return checked
    if not isinstance(subject, str) or not 0 < len(subject) <= MAX_SUBJECT or CONTROL.search(subject):
        raise ValueError(
            f"subject {subject!r} is not valid: give text of 1 to {MAX_SUBJECT} characters without control characters"
        )
    with_subject: Mapping[str, header_codec.HeaderValue] = {**(headers or {}), SUBJECT: subject}
    return header_codec.encode(with_subject, WIDEST, reserved=True)
