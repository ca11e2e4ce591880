"""Client of a topic (PostgreSQL): `publish` routes a message, in one round trip and one
transaction, into the queue of every subscription whose filter matches it (`dbq.contract.topics`);
`publish_many` routes several in one. Each subscriber consumes its own queue with
`dbq.client.connect`.

Thread-safe: calls borrow connections from a small pool, as `dbq.client.ring.Queue` does, and
single publishes made at once by several threads share one publish_many round trip (smart
batching, `dbq.client.coalescing`; on unless `smart_batching=False`). Should a batch fail because
a Reject subscription's queue is full, its messages are published again one by one, so each
caller gets the answer its own publish would have had.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from dbq.api.limits import CONTROL
from dbq.client.coalescing import ByOptions, Coalescer
from dbq.client.waiting import Deadline, seconds_arg
from dbq.connection import ConnectionSettings, odbc, postgres
from dbq.contract import headers as header_codec
from dbq.contract.headers import SUBJECT, HeaderLimits, Headers
from dbq.contract.topics import FULL_STATE, TopicNames, publish_many_statement, publish_statement, routed_ids
from dbq.errors import DbqError, QueueError, QueueFull, QueueUnavailable

MAX_SUBJECT = 256  # characters of a subject (a filter's subject clauses compare up to 256)
# The widest headers any queue allows (spec.messages): each subscription's queue checks its own
# limits when the routine pushes the copy, and a copy it refuses fails the publish.
WIDEST = HeaderLimits(header_bytes=65_536, max_headers=256)
SMART_BATCH_LIMIT = 500  # at most this many waiting publishes share one round trip
Publish = tuple[bytes, str | None, str | None]  # body, stored headers, subject


class Topic:
    def __init__(
        self,
        settings: ConnectionSettings,
        names: TopicNames,
        *,
        ttl: float = 0.0,
        timeout: float = 5.0,
        pool_size: int = 4,
        smart_batching: bool = True,
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
        self._many_statement = publish_many_statement(names)
        self._in_statement = self._statement.replace("?", "%s")  # psycopg's own placeholders
        self._idle: list[postgres.Connection] = []
        self._publishes: ByOptions[int, Publish, dict[str, int]] | None = None
        if smart_batching:
            self._publishes = ByOptions(
                lambda ttl_ms: Coalescer(
                    lambda items: self._batch(items, ttl_ms), SMART_BATCH_LIMIT, max(pool_size, 1)
                )
            )

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
        item = (body_bytes(body), stored_headers(headers, subject), subject)
        ttl_ms = int(seconds_arg(ttl, "ttl", self.ttl) * 1000)
        if self._publishes is not None:
            return self._publishes(ttl_ms, item)
        return routed_ids(self._call(self._statement, *item, ttl_ms))

    def publish_many(
        self,
        bodies: Sequence[bytes],
        *,
        headers: Headers | Sequence[Headers | None] | None = None,
        subjects: str | Sequence[str | None] | None = None,
        ttl: float | None = None,
    ) -> list[dict[str, int]]:
        """Route several messages in one round trip and one transaction: for each, what
        `publish` answers. `headers` and `subjects`: one for every message, or one per message."""
        return self._many(publishes(bodies, headers, subjects), int(seconds_arg(ttl, "ttl", self.ttl) * 1000))

    def publish_in(
        self,
        conn: psycopg.Connection[Any],
        body: bytes,
        *,
        headers: Headers | None = None,
        subject: str | None = None,
        ttl: float | None = None,
    ) -> dict[str, int]:
        """Publish inside the caller's own transaction on `conn`, a psycopg connection to the
        topic's database: the copies commit, or roll back, with the caller's own writes (an
        outbox without the outbox table). Answers as `publish`. A publish refused because the
        subscriptions changed under it (SQLSTATE 40001) leaves that transaction aborted: the
        caller rolls back and makes it again."""
        item = (body_bytes(body), stored_headers(headers, subject), subject)
        ttl_ms = int(seconds_arg(ttl, "ttl", self.ttl) * 1000)
        try:
            row = conn.execute(self._in_statement, (*item, ttl_ms)).fetchone()
        except psycopg.Error as e:
            raise self._translate(e) from None
        return routed_ids(None if row is None or row[0] is None else str(row[0]))

    def _many(self, items: list[Publish], ttl_ms: int) -> list[dict[str, int]]:
        if not items:
            return []
        stored = [h for _, h, _ in items]
        subjects = [s for _, _, s in items]
        answer = self._call(
            self._many_statement,
            b"".join(b for b, _, _ in items),
            ",".join(str(len(b)) for b, _, _ in items),
            None if all(h is None for h in stored) else "[" + ",".join(h or "null" for h in stored) + "]",
            None if all(s is None for s in subjects) else json.dumps(subjects, ensure_ascii=False),
            ttl_ms,
        )
        return [routed_ids(part) for part in (answer or "").split(";")]  # one part a message

    def _batch(self, items: list[Publish], ttl_ms: int) -> list[dict[str, int] | BaseException]:
        """The single publishes of several threads in one round trip (smart batching)."""
        if len(items) == 1:
            return [routed_ids(self._call(self._statement, *items[0], ttl_ms))]
        try:
            return list(self._many(items, ttl_ms))
        except QueueFull:  # whose? publish them one by one: each caller gets its own answer
            out: list[dict[str, int] | BaseException] = []
            for item in items:
                try:
                    out.append(routed_ids(self._call(self._statement, *item, ttl_ms)))
                except QueueFull as e:
                    out.append(e)
            return out

    def _call(self, statement: str, *args: object) -> str | None:
        """One call of the routine. One refused because the subscriptions changed while it
        waited (or a deadlock) changed nothing: it is made again, for up to `timeout` seconds."""
        deadline = Deadline(self.timeout)
        while True:
            conn = self._checkout()
            try:
                answer = conn.cursor().execute(statement, *args).fetchval()
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
        return odbc.translate(e, self.settings, f"topic {self.names.schema}.{self.names.topic}", "publish")

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


def publishes(
    bodies: Sequence[bytes],
    headers: Headers | Sequence[Headers | None] | None,
    subjects: str | Sequence[str | None] | None,
) -> list[Publish]:
    """What `publish_many` was given, checked: each message's body, stored headers and subject."""
    count = len(bodies)
    each_headers = each_of(headers, count, "headers", Mapping)
    each_subject = each_of(subjects, count, "subjects", str)
    return [
        (body_bytes(b), stored_headers(h, s), s)
        for b, h, s in zip(bodies, each_headers, each_subject, strict=True)
    ]


def body_bytes(body: object) -> bytes:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"a body is bytes, not {type(body).__name__}")
    return bytes(body)


def each_of(value: object, count: int, name: str, single: type) -> list[Any]:
    """`value` for each of `count` messages: one for all (or None), or a sequence of one each."""
    if value is None or isinstance(value, single):
        return [value] * count
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise TypeError(f"{name} is one value for every message, or a list of one (or None) per message")
    if len(value) != count:
        raise ValueError(
            f"{name} has {len(value)} values for {count} messages: give one per message, or one for all"
        )
    return list(value)


def stored_headers(headers: Headers | None, subject: str | None) -> str | None:
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
