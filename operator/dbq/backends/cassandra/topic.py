"""A topic on Cassandra: records its rules in the keyspace's topics table for its publishers
(`dbq.contract.pipes_topics`), reads its counters, and removes both. The same protocol as
`dbq.backends.odbc_topic.OdbcTopic`, which the controller drives alike."""

from __future__ import annotations

from dbq.backends.cassandra.backend import CassandraSession, keyspace_lock
from dbq.connection import ConnectionSettings
from dbq.contract.pipes import PIPES_SCHEMA_VERSION, PipesStatements
from dbq.contract.pipes_topics import (
    PIPES_TOPIC_SCHEMA_VERSION,
    PUBLISHED,
    ROUTED,
    TABLES,
    UNROUTED,
    PipesTopicStatements,
    rules_json,
)
from dbq.contract.topics import TopicCounts, TopicTarget
from dbq.errors import DbqError, InvalidSpec
from dbq.names import QueueNames

CHANGE_TRIES = 5  # rules changed by another operator meanwhile: read them and try again


class CassandraTopic(CassandraSession):
    def __init__(self, settings: ConnectionSettings, target: TopicTarget) -> None:
        if settings.backend != "cassandra":
            raise InvalidSpec(f"a Cassandra topic needs a cassandra connection, not {settings.backend}")
        super().__init__(settings)
        self.target = target
        self.cql = PipesTopicStatements(target.names)

    def _keyspace_exists(self) -> bool:
        return self.session.cluster.metadata.keyspaces.get(self.target.names.schema) is not None

    def apply(self) -> int:
        """Record the target's rules (once each of its queues is found a pipes queue of the
        keyspace); the rules version now in force. Rules already recorded keep their version."""
        names = self.target.names
        if not self._keyspace_exists():
            raise InvalidSpec(
                f"keyspace {names.schema} does not exist at {self.endpoint()}: a topic's queues live there;"
                " create them first (Queues with the topic's backend, Secret and keyspace)"
            )
        with keyspace_lock(self.settings, names.schema):  # not while a teardown empties the keyspace
            for statement in self.cql.create:
                self._run(statement)
        for queue in [r.queue for r in self.target.routes] + [q for q in [self.target.unrouted] if q]:
            self._check_queue(queue)
        wanted = rules_json(self.target)
        for _ in range(CHANGE_TRIES):
            found = self._run(self.cql.read_rules, names.topic)
            if not found:
                if self._run(self.cql.first_rules, names.topic, PIPES_TOPIC_SCHEMA_VERSION, 1, wanted)[0][0]:
                    return 1
                continue
            _, version, rules = found[0]
            if rules == wanted:
                return int(version)
            applied = self._run(
                self.cql.change_rules,
                PIPES_TOPIC_SCHEMA_VERSION,
                int(version) + 1,
                wanted,
                names.topic,
                version,
            )
            if applied[0][0]:
                return int(version) + 1
        raise DbqError(f"topic {names.topic}: its rules kept changing under this operator; will try again")

    def _check_queue(self, queue: QueueNames) -> None:
        """InvalidSpec unless `queue` is a pipes queue of this client's version in the keyspace."""
        statements = PipesStatements(queue)
        rows = self._run(statements.read_meta, queue.queue) if self._has_meta(queue) else []
        if not rows or rows[0][0] != "pipes":
            raise InvalidSpec(
                f"queue {queue.qualified} is not a pipes queue of this keyspace: create it (a Queue with the"
                " topic's backend, design and Secret), or bind the subscription to another"
            )
        if rows[0][1] != PIPES_SCHEMA_VERSION:
            raise InvalidSpec(
                f"queue {queue.qualified} has pipes schema version {rows[0][1]}, not {PIPES_SCHEMA_VERSION}:"
                " it is upgraded by its Queue's next reconcile"
            )

    def _has_meta(self, queue: QueueNames) -> bool:
        keyspace = self.session.cluster.metadata.keyspaces.get(queue.schema)
        return keyspace is not None and queue.meta in keyspace.tables

    def counts(self) -> TopicCounts | None:
        """The topic's counters by subscription; None when its rules are not recorded."""
        names = self.target.names
        if not self._keyspace_exists() or not self._has_tables():
            return None
        found = self._run(self.cql.read_rules, names.topic)
        if not found:
            return None
        counted = {str(name): int(n or 0) for name, n in self._run(self.cql.read_counts, names.topic)}
        return TopicCounts(
            rules_version=int(found[0][1]),
            published=counted.get(PUBLISHED, 0),
            unrouted=counted.get(UNROUTED, 0),
            routed={r.subscription: counted.get(ROUTED + r.subscription, 0) for r in self.target.routes},
            dropped={r.subscription: 0 for r in self.target.routes},  # a pipe is never full
        )

    def _has_tables(self) -> bool:
        keyspace = self.session.cluster.metadata.keyspaces.get(self.target.names.schema)
        return keyspace is not None and all(t in keyspace.tables for t in TABLES)

    def teardown(self) -> None:
        """Remove the topic's rules (its publishers find no topic) and counters; with the last
        topic of the keyspace, the topic tables, and then the keyspace if nothing else is in it
        (a queue's teardown leaves it while they are there)."""
        names = self.target.names
        with keyspace_lock(self.settings, names.schema):
            if not self._keyspace_exists() or not self._has_tables():
                return
            self._run(self.cql.drop_rules, names.topic)
            self._run(self.cql.drop_counts, names.topic)
            if self._run(self.cql.any_topic):
                return
            for statement in self.cql.drop_tables:
                self._run(statement)
            self.session.cluster.refresh_keyspace_metadata(names.schema)
            keyspace = self.session.cluster.metadata.keyspaces.get(names.schema)
            if keyspace is not None and not keyspace.tables:
                self._run(self.cql.drop_keyspace)
