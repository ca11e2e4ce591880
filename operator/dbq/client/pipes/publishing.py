"""Client of a topic on Cassandra (`dbq.contract.pipes_topics`): `publish` reads the topic's rules
(at most every `rules_refresh` seconds), evaluates each subscription's filter here, and writes a
copy into the pipe of every matching queue, all of a message's copies in one batch: logged when
they go to several queues (Cassandra applies all of them or none), one pipe's own otherwise.
`publish_many` writes several messages in as few batches as their size allows, each message's
copies always together. Each subscriber consumes its own queue with `dbq.client.connect`.

Thread-safe: each thread appends to pipes of its own in every queue (as pushes do), and single
publishes made at once by several threads share batches (smart batching; on unless
`smart_batching=False`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from cassandra.cluster import Cluster, ResponseFuture, Session
from cassandra.query import BatchStatement, BatchType

from dbq.api.limits import MAX_PIPES_BODY_BYTES
from dbq.client.coalescing import ByOptions, Coalescer
from dbq.client.pipes import tuning
from dbq.client.pipes.queue import PipesQueue
from dbq.client.pipes.session import PipesSession
from dbq.client.pipes.writing import PipeWriter, Staged
from dbq.client.topic import SMART_BATCH_LIMIT, Publish, body_bytes, publishes, stored_headers
from dbq.client.waiting import check_bodies, seconds_arg
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import open_session
from dbq.contract import headers as header_codec
from dbq.contract.filters import matches
from dbq.contract.headers import HeaderLimits, Headers
from dbq.contract.pipes import INLINE_BODY_BYTES
from dbq.contract.pipes_topics import (
    PIPES_TOPIC_SCHEMA_VERSION,
    PUBLISHED,
    ROUTED,
    UNROUTED,
    PipesRules,
    PipesTopicStatements,
    parse_rules,
)
from dbq.contract.topics import TOPICS_TABLE, TopicNames
from dbq.errors import DbqError, QueueError, TopicNotFound
from dbq.names import QueueNames

LOG = logging.getLogger("dbq.pipes")
# What a logged batch of a publish holds in its rows (bodies and headers, beside ROW_BYTES of
# keys each), well below Cassandra's batch_size_fail_threshold (50 KiB by default). A message
# whose copies would hold more on their own stores each copy's body in its queue's content table.
BATCH_BYTES = 24 << 10
ROW_BYTES = 100
# A publisher adds to the topic's counters this often (they are Cassandra counters: each update
# reads before it writes), with what it counted meanwhile.
COUNT_EVERY_S = 1.0
CLOSE_WAIT_S = 5.0  # how long a closing publisher waits for its last counts to be written


@dataclass
class _Copies:
    """What one batch writes into one queue: its copies, in the order given."""

    bodies: list[bytes] = field(default_factory=list)
    headers: list[str | None] = field(default_factory=list)
    chunked: list[bool] = field(default_factory=list)
    owners: list[tuple[int, str]] = field(default_factory=list)  # (message, route's name) of each


class PipesTopic:
    def __init__(
        self,
        settings: ConnectionSettings,
        names: TopicNames,
        *,
        ttl: float = 0.0,
        rules_refresh: float = 1.0,
        session: Session | None = None,
        smart_batching: bool = True,
    ) -> None:
        """`ttl`: the copies' default time to live (seconds; 0: none). `rules_refresh`: how long
        (seconds) a publish may route by the rules read by an earlier one; 0: each publish (each
        batch of them) reads the rules in force."""
        if settings.backend != "cassandra":
            raise QueueError(f"a pipes topic lives on cassandra, not {settings.backend}")
        self.settings = settings
        self.names = names
        self.ttl = seconds_arg(ttl, "ttl", 0.0)
        self.rules_refresh = seconds_arg(rules_refresh, "rules_refresh", 0.0)
        self._read_at = 0.0  # monotonic: when the rules were last read
        self.cql = PipesTopicStatements(names)
        self._cluster: Cluster | None = None
        if session is None:
            self._cluster, session = open_session(settings)
        self.session = session
        self.db = PipesSession(session, settings, QueueNames(names.schema, names.topic))
        self._queues: dict[QueueNames, PipesQueue] = {}
        self._queues_lock = threading.Lock()
        self._parsed: PipesRules | None = None
        self._counts: dict[str, int] = {}  # counted here, not yet written
        self._counts_lock = threading.Lock()
        self._counted_at = time.monotonic()
        try:
            self.rules()
        except Exception:
            self.close()
            raise
        self._publishes: ByOptions[int, Publish, dict[str, uuid.UUID]] | None = None
        if smart_batching:
            self._publishes = ByOptions(
                lambda ttl_ms: Coalescer(lambda items: self._batch(items, ttl_ms), SMART_BATCH_LIMIT)
            )

    def rules(self) -> PipesRules:
        """The rules to route by: those read less than `rules_refresh` ago, else the rules in
        force, read from the topic's row (parsed again only when they changed)."""
        parsed = self._parsed
        now = time.monotonic()
        if parsed is not None and now - self._read_at < self.rules_refresh:
            return parsed
        names = self.names
        try:
            found = self.db.rows(self.cql.read_rules, names.topic) if self._has_table() else []
        except DbqError:
            # The driver's view of the schema may lag: ask the node whether the table is there.
            if self.db.rows(self.cql.has_topics_table, names.schema, TOPICS_TABLE):
                raise
            found = []  # the topics table went (with the keyspace's last topic) since we looked
        if not found:
            raise TopicNotFound(
                f"topic {names.topic} is not made in keyspace {names.schema} at {self.settings.endpoint}:"
                " apply its Topic resource (backend: cassandra, design: pipes), or pass the keyspace it lives in"
            )
        schema_version, version, text = found[0]
        if schema_version != PIPES_TOPIC_SCHEMA_VERSION:
            raise QueueError(
                f"topic {names.topic} has schema version {schema_version}, this client speaks"
                f" {PIPES_TOPIC_SCHEMA_VERSION}: upgrade the operator and the client together"
            )
        if parsed is None or parsed.version != version:
            parsed = self._parsed = parse_rules(names, int(version), str(text))
        self._read_at = now
        return parsed

    def _has_table(self) -> bool:
        keyspace = self.session.cluster.metadata.keyspaces.get(self.names.schema)
        return keyspace is not None and TOPICS_TABLE in keyspace.tables

    def publish(
        self,
        body: bytes,
        *,
        headers: Headers | None = None,
        subject: str | None = None,
        ttl: float | None = None,
    ) -> dict[str, uuid.UUID]:
        """Route one message: its id in each subscription's queue that got a copy, by
        subscription ('' for the topic's queue of unrouted messages)."""
        item = (body_bytes(body), stored_headers(headers, subject), subject)
        ttl_ms = int(seconds_arg(ttl, "ttl", self.ttl) * 1000)
        if self._publishes is not None:
            return self._publishes(ttl_ms, item)
        return self._publish([item], ttl_ms)[0]

    def publish_many(
        self,
        bodies: Sequence[bytes],
        *,
        headers: Headers | Sequence[Headers | None] | None = None,
        subjects: str | Sequence[str | None] | None = None,
        ttl: float | None = None,
    ) -> list[dict[str, uuid.UUID]]:
        """Route several messages, by the same rules: for each, what `publish` answers. Each
        message's copies are written together; messages too many for one batch take several, and
        should one of them fail, the error is raised with the messages before it routed."""
        return self._publish(
            publishes(bodies, headers, subjects), int(seconds_arg(ttl, "ttl", self.ttl) * 1000)
        )

    def _batch(self, items: list[Publish], ttl_ms: int) -> list[dict[str, uuid.UUID] | BaseException]:
        """The single publishes of several threads together (smart batching): each caller gets
        its own answer, or the error of the batch its message was in (or of a message refused
        for one of its queues: the others are routed without it)."""
        try:
            answers, failure = self._route(items, ttl_ms)
        except (ValueError, TypeError):
            out: list[dict[str, uuid.UUID] | BaseException] = []
            for item in items:
                try:
                    out.append(self._publish([item], ttl_ms)[0])
                except (ValueError, TypeError, QueueError) as e:
                    out.append(e)
            return out
        if failure is None:
            return list(answers)
        error, failed_from = failure
        return [*answers[:failed_from], *([error] * (len(items) - failed_from))]

    def _publish(self, items: list[Publish], ttl_ms: int) -> list[dict[str, uuid.UUID]]:
        answers, failure = self._route(items, ttl_ms)
        if failure is not None:
            raise failure[0]
        return answers

    def _route(
        self, items: list[Publish], ttl_ms: int
    ) -> tuple[list[dict[str, uuid.UUID]], tuple[QueueError, int] | None]:
        """Route checked messages (body, stored headers, subject), every one checked against its
        queues' limits before anything is written (ValueError, TypeError), in as few batches as
        their size allows: the answers, and the error of a batch that failed with the index of its
        first message (those before it are routed, it and those after it are not)."""
        rules = self.rules()
        targets = [self._targets(rules, item) for item in items]
        chunked = [_chunked(item, to) for item, to in zip(items, targets, strict=True)]
        answers: list[dict[str, uuid.UUID]] = [{} for _ in items]
        expires = tuning.now_ms() + ttl_ms if ttl_ms > 0 else None
        start = 0
        while start < len(items):
            end, used = start, 0
            while end < len(items):
                size = _row_bytes(items[end], chunked[end]) * len(targets[end])
                if end > start and used + size > BATCH_BYTES:
                    break
                used += size
                end += 1
            try:
                self._write(items, targets, chunked, start, end, expires, answers)
            except QueueError as e:
                return answers, (e, start)
            self._count(rules, targets[start:end])
            start = end
        return answers, None

    def _targets(self, rules: PipesRules, item: Publish) -> list[tuple[str, PipesQueue]]:
        """The queues a message goes to (by the names the answer gives them), checked to take it."""
        body, stored, subject = item
        found = header_codec.decode(stored)
        routes = [(r.shown, r.queue) for r in rules.routes if matches(r.filter, subject, found)]
        if not routes and rules.unrouted is not None:
            routes = [("", rules.unrouted)]
        out = []
        checked: set[HeaderLimits] = set()  # the headers are encoded once per distinct limits
        for name, queue_names in routes:
            queue = self._queue(queue_names)
            check_bodies([body], queue.max_body_bytes, queue_names.queue, f"{MAX_PIPES_BODY_BYTES} on pipes")
            if queue.header_limits not in checked:
                try:
                    header_codec.encode(found, queue.header_limits, reserved=True)
                except ValueError as e:
                    raise ValueError(
                        f"subscription {name or 'of unrouted messages'}, queue {queue_names.queue}: {e}"
                    ) from None
                checked.add(queue.header_limits)
            out.append((name, queue))
        return out

    def _queue(self, names: QueueNames) -> PipesQueue:
        with self._queues_lock:
            queue = self._queues.get(names)
        if queue is None:
            queue = PipesQueue(self.settings, names, session=self.session, smart_batching=False)
            with self._queues_lock:
                queue = self._queues.setdefault(names, queue)
        return queue

    def _write(self, items: list[Publish], targets: list[list[tuple[str, PipesQueue]]], chunked: list[bool],
               start: int, end: int, expires: int | None, answers: list[dict[str, uuid.UUID]]) -> None:  # fmt: skip
        """Write the copies of messages start..end-1 in one logged batch (`chunked[i]`: message i's
        bodies go to the content tables); their ids into `answers`."""
        by_queue: dict[QueueNames, tuple[PipesQueue, _Copies]] = {}
        for i in range(start, end):
            body, stored, _ = items[i]
            for name, queue in targets[i]:
                copies = by_queue.setdefault(queue.names, (queue, _Copies()))[1]
                copies.bodies.append(body)
                copies.headers.append(stored)
                copies.chunked.append(chunked[i])
                copies.owners.append((i, name))
        if not by_queue:
            return
        staged: list[tuple[Staged, _Copies]] = []
        try:
            for queue, copies in by_queue.values():
                staged.append(
                    (queue.writer.stage(copies.bodies, expires, copies.headers, copies.chunked), copies)
                )
            # One queue's copies are in one pipe: atomic as the push's own batch is (unlogged).
            self.db.batch([part for s, _ in staged for part in s.parts], logged=len(staged) > 1)
        except QueueError:
            for s, _ in staged:
                PipeWriter.lost(s)
            with self._queues_lock:
                self._queues.clear()  # a queue may have been deleted: read them afresh next time
            self._read_at = 0.0  # and the rules
            raise
        for s, copies in staged:
            PipeWriter.landed(s)
            for (i, name), msg_id in zip(copies.owners, s.ids, strict=True):
                answers[i][name] = msg_id

    def _count(self, rules: PipesRules, targets: list[list[tuple[str, PipesQueue]]]) -> None:
        """Add the messages to the counts kept here, written to the topic's counters at most every
        COUNT_EVERY_S (and on close)."""
        shown = {r.shown: r.subscription for r in rules.routes}
        with self._counts_lock:
            counts = self._counts
            counts[PUBLISHED] = counts.get(PUBLISHED, 0) + len(targets)
            for found in targets:
                if not found or found[0][0] == "":
                    counts[UNROUTED] = counts.get(UNROUTED, 0) + 1
                for name, _ in found:
                    if name:
                        key = ROUTED + shown[name]
                        counts[key] = counts.get(key, 0) + 1
            due = time.monotonic() >= self._counted_at + COUNT_EVERY_S
        if due:
            self._flush_counts()

    def _flush_counts(self) -> ResponseFuture | None:
        """Add the counts kept here to the topic's counters, without waiting (the update under
        way, if any): an update that is lost (it timed out, the process died first) leaves them
        short."""
        with self._counts_lock:
            counts, self._counts = self._counts, {}
            self._counted_at = time.monotonic()
        if not counts:
            return None
        try:
            statement = self.db.statement(self.cql.add)
        except QueueError as e:  # the copies are written: the publish stands
            LOG.warning("topic %s: counts not updated: %s", self.names.topic, e)
            return None
        batch = BatchStatement(batch_type=BatchType.COUNTER)
        for name, n in counts.items():
            batch.add(statement, (n, self.names.topic, name))
        future = self.session.execute_async(batch)
        future.add_errback(lambda e: LOG.warning("topic %s: counts not updated: %s", self.names.topic, e))
        return future

    def close(self) -> None:
        """Write the counts kept here (waiting up to CLOSE_WAIT_S for them), finish this client's
        pipes in every queue, then disconnect (a session given is left open)."""
        future = self._flush_counts()
        if future is not None:
            with contextlib.suppress(Exception):  # logged by its errback; the copies are written
                future.result(timeout=CLOSE_WAIT_S)
        with self._queues_lock:
            queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            queue.close_pushers()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    def __enter__(self) -> PipesTopic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunked(item: Publish, targets: list[tuple[str, PipesQueue]]) -> bool:
    """Whether the message's copies keep their bodies in their queues' content tables: it is
    larger than a row holds, or its copies together would make the batch too large."""
    return len(item[0]) > INLINE_BODY_BYTES or len(targets) * _row_bytes(item, False) > BATCH_BYTES


def _row_bytes(item: Publish, chunked: bool) -> int:
    body, stored, _ = item
    return ROW_BYTES + (0 if chunked else len(body)) + (len(stored.encode()) if stored else 0)
