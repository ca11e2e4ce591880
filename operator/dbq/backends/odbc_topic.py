"""A topic on PostgreSQL: makes or changes its publish routine and counters from its
subscriptions, and drops them. Each change is one transaction holding the schema's lock and the
topic's lock exclusively, so publishes see the old rules or the new ones, never a mix
(`dbq.contract.topics`)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pyodbc

from dbq.backends.odbc import OdbcBackend
from dbq.backends.postgres.access import ensure_helper
from dbq.backends.topic_sql import PgTopic
from dbq.connection import ConnectionSettings
from dbq.contract.topics import Route, TopicCounts, TopicTarget
from dbq.errors import InvalidSpec
from dbq.names import QueueNames

TOPIC_LOCK = "SELECT pg_advisory_xact_lock(hashtext(?))"


def numbered(routes: tuple[Route, ...], known: dict[str, int]) -> tuple[Route, ...]:
    """The routes with their ordinals: a subscription keeps the one it has (`known`: by name),
    a new one takes the next free number (its counters start anew)."""
    taken = set(known.values())
    out = []
    for route in sorted(routes, key=lambda r: r.subscription):
        ordinal = known.get(route.subscription)
        if ordinal is None:
            ordinal = max(taken, default=0) + 1
            taken.add(ordinal)
        out.append(replace(route, ordinal=ordinal))
    return tuple(out)


def _sized(cur: pyodbc.Cursor, route: Route) -> Route:
    """The route with its queue's ring size; InvalidSpec naming the subscription when the queue is
    not a provisioned ring of this database."""
    queue = route.queue
    size = None
    if int(cur.execute(PgTopic.has_meta(queue)).fetchval()):
        size = cur.execute(PgTopic.ring_size(queue), queue.queue).fetchval()
    if size is None:
        raise InvalidSpec(
            f"subscription {route.subscription}: queue {queue.qualified} is not a ring queue of this database:"
            " create it (a Queue with the topic's backend and Secret), or bind the subscription to another"
        )
    return replace(route, ring_size=int(size))


def _ordinals(recorded: list[Any]) -> list[tuple[str, int]]:
    """(subscription, ordinal) of each row of `PgTopic.recorded_rules`."""
    return [(str(row[0]), int(row[1])) for row in recorded]


def _canonical(flt: object) -> str:
    return json.dumps(flt, sort_keys=True)


class OdbcTopic(OdbcBackend):
    def __init__(self, settings: ConnectionSettings, target: TopicTarget) -> None:
        if settings.backend != "postgres":
            raise InvalidSpec(f"topics on {settings.backend} are not provisioned yet: use postgres")
        # The schema's lock, and a seat in the operator's pool by the topic's name.
        super().__init__(settings, QueueNames(target.names.schema, target.names.topic))
        self.target = target
        # What the last apply left in force: the rules version and (subscription, ordinal) of each
        # route, so that counts() after it reads the counters alone.
        self._applied: tuple[int, list[tuple[str, int]]] | None = None

    def _sql(self, target: TopicTarget) -> PgTopic:
        return PgTopic(target, self.settings.database)

    def advisory_lock(self) -> str:
        return TOPIC_LOCK

    def apply(self) -> int:
        """Make the topic's routine match its subscriptions; the rules version now in force. A
        first look takes no lock: rules already in force (what a periodic check finds, mostly)
        cost no transaction and keep their version."""
        names, sql = self.target.names, self._sql(self.target)

        def in_force() -> tuple[int | None, list[Any]]:
            with self._errors():
                return self._in_force(self.conn.cursor(), sql)

        version, recorded = self._first_look(in_force) or (None, [])
        if version is not None:
            self._applied = version, _ordinals(recorded)
            return version
        with self._locked_transaction() as cur:
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {sql.schema}")
            for statement in sql.tables():
                cur.execute(statement)
            cur.execute(TOPIC_LOCK, names.lock)  # publishes in flight end first; new ones wait
            version, recorded = self._in_force(cur, sql)
            if version is not None:  # made meanwhile, by another operator
                self._applied = version, _ordinals(recorded)
                return version
            known = dict(_ordinals(recorded))
            version = int(cur.execute(sql.rules_version(), names.topic).fetchval() or 0) + 1
            routes = tuple(_sized(cur, r) for r in numbered(self.target.routes, known))
            made = self._sql(replace(self.target, routes=routes))
            for statement in made.statements(version):
                cur.execute(statement)
            for statement, params in made.rows(version):
                cur.execute(statement, *params)
            ensure_helper(cur, self.settings.database, self.settings.username)
            for statement in made.secure([r.ordinal for r in routes]):
                cur.execute(statement)
        self._applied = version, [(r.subscription, r.ordinal) for r in routes]
        return version

    def _in_force(self, cur: pyodbc.Cursor, sql: PgTopic) -> tuple[int | None, list[Any]]:
        """The rules version when the recorded rules are the target's and its routine exists (else
        None), and the recorded rules (`PgTopic.recorded_rules` rows; none before the topic is made)."""
        names = self.target.names
        if not int(cur.execute(sql.has_current_tables(), names.schema, names.schema).fetchval()):
            return None, []
        found = cur.execute(sql.recorded_topic(), names.topic).fetchone()
        if found is None:
            return None, []
        version, unrouted, routine = found
        rows = cur.execute(sql.recorded_rules(), names.topic).fetchall()
        recorded = {(str(s), str(q), _canonical(json.loads(f)), str(o), str(n)) for s, _, q, f, o, n in rows}
        wanted = {
            (r.subscription, r.queue.qualified, _canonical(r.filter.wire()), r.on_full, r.label)
            for r in self.target.routes
        }
        same_unrouted = (unrouted or None) == (
            self.target.unrouted.qualified if self.target.unrouted else None
        )
        return (int(version) if routine and same_unrouted and recorded == wanted else None), rows

    def counts(self) -> TopicCounts | None:
        """The topic's counters as its recorded rules name them (as the last `apply` left them,
        when it made one); None when it is not made."""
        names, sql = self.target.names, self._sql(self.target)
        with self._errors():
            cur = self.conn.cursor()
            if self._applied is not None:
                version, rules = self._applied
            else:
                if not int(cur.execute(sql.has_tables(), names.schema).fetchval()):
                    return None
                found = cur.execute(sql.rules_version(), names.topic).fetchval()
                if found is None:
                    return None
                version = int(found)
                rules = _ordinals(cur.execute(sql.recorded_rules(), names.topic).fetchall())
            values = [int(v) for v in cur.execute(sql.counters([o for _, o in rules])).fetchone()]
        each = values[2:]
        return TopicCounts(
            rules_version=version,
            published=values[0],
            unrouted=values[1],
            routed={name: each[2 * i] for i, (name, _) in enumerate(rules)},
            dropped={name: each[2 * i + 1] for i, (name, _) in enumerate(rules)},
        )

    def teardown(self) -> None:
        names = self.target.names
        self._applied = None
        with self._locked_transaction() as cur:
            sql = self._sql(self.target)
            if not cur.execute(sql.has_tables(), names.schema).fetchval():
                return
            cur.execute(TOPIC_LOCK, names.lock)
            ordinals = [int(row[1]) for row in cur.execute(sql.recorded_rules(), names.topic).fetchall()]
            for statement, params in sql.drop(ordinals):
                cur.execute(statement, *params)
            ensure_helper(cur, self.settings.database, self.settings.username)
            cur.execute(sql.drop_group())
