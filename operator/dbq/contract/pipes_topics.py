"""A topic on Cassandra (the pipes design): its rules as the operator records them, and every CQL
statement its publishers and the operator run.

A topic's row in the keyspace's `dbq_topics` table holds its rules whole, as one JSON value (the
subscriptions, each with its queue and filter, and the queue of unrouted messages) and their
version: the operator replaces them with one write, so a publisher that reads the row sees the
old rules or the new ones, never a mix. A publish reads the row (or routes by the rules its client read less than `rules_refresh`
seconds ago), evaluates each filter
(`dbq.contract.filters`, the reference evaluator) and writes every copy, each in its queue's
pipe, in one logged batch: Cassandra applies all of it or, should the client die first, none.
Nothing is ever full on pipes, so onFull never applies there.

The counts are Cassandra counters in `dbq_topic_counts` (one partition per topic); each publisher
adds what it counted every second and when it closes: what a publisher killed in between had
counted, or an update that timed out, is not counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dbq.api.filters import Filter
from dbq.contract.topics import TOPICS_TABLE, Route, TopicNames, TopicTarget
from dbq.errors import QueueError
from dbq.names import QueueNames
from dbq.names import pg_quote as quote

PIPES_TOPIC_SCHEMA_VERSION = 1
COUNTS_TABLE = "dbq_topic_counts"
PUBLISHED, UNROUTED = "published", "unrouted"  # counters of the topic; each route's is ROUTED + name
ROUTED = "routed:"

# What the rules row holds: PIPES_TOPIC_SCHEMA_VERSION, the rules version, the rules as JSON.
TABLES = {
    TOPICS_TABLE: "topic text PRIMARY KEY, schema_version int, rules_version bigint, rules text",
    COUNTS_TABLE: "topic text, name text, n counter, PRIMARY KEY (topic, name)",
}


@dataclass(frozen=True)
class PipesRules:
    """The rules a publish routes by: its routes (queue names in the topic's keyspace) and the
    queue that gets what none matched."""

    version: int
    routes: tuple[Route, ...]
    unrouted: QueueNames | None


def rules_json(target: TopicTarget) -> str:
    """The target's rules as the topic's row holds them: canonical JSON, so equal rules compare
    equal as text."""
    return json.dumps(
        {
            "routes": [
                {
                    "subscription": r.subscription,
                    "label": r.label,
                    "queue": r.queue.queue,
                    "filter": r.filter.wire(),
                }
                for r in sorted(target.routes, key=lambda r: r.subscription)
            ],
            "unrouted": target.unrouted.queue if target.unrouted else None,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def parse_rules(names: TopicNames, version: int, text: str) -> PipesRules:
    """The rules of a topic's row (`rules_json`); QueueError when the row holds something else."""
    try:
        raw: Mapping[str, Any] = json.loads(text)
        routes = tuple(
            Route(
                str(r["subscription"]),
                QueueNames(names.schema, str(r["queue"])),
                Filter.model_validate(r["filter"]),
                label=str(r.get("label") or ""),
            )
            for r in raw["routes"]
        )
        unrouted = raw.get("unrouted")
    except (ValueError, KeyError, TypeError) as e:
        raise QueueError(
            f"topic {names.topic} in keyspace {names.schema} has rules this client cannot read ({e}):"
            " upgrade the client to the operator's version"
        ) from None
    return PipesRules(version, routes, QueueNames(names.schema, str(unrouted)) if unrouted else None)


class PipesTopicStatements:
    """The statements of one topic; attributes are CQL text ready to prepare (values are bind
    markers, identifiers validated and quoted)."""

    def __init__(self, names: TopicNames) -> None:
        ks = quote(names.schema)
        self.topics = f"{ks}.{quote(TOPICS_TABLE)}"
        self.counts = f"{ks}.{quote(COUNTS_TABLE)}"
        self.create = [f"CREATE TABLE IF NOT EXISTS {ks}.{quote(t)} ({cols})" for t, cols in TABLES.items()]
        self.read_rules = f"SELECT schema_version, rules_version, rules FROM {self.topics} WHERE topic = ?"
        # The operator's writes: the first, and each change from the version it read (one wins).
        self.first_rules = (
            f"INSERT INTO {self.topics} (topic, schema_version, rules_version, rules) VALUES (?, ?, ?, ?)"
            " IF NOT EXISTS"
        )
        self.change_rules = (
            f"UPDATE {self.topics} SET schema_version = ?, rules_version = ?, rules = ? WHERE topic = ?"
            " IF rules_version = ?"
        )
        self.add = f"UPDATE {self.counts} SET n = n + ? WHERE topic = ? AND name = ?"
        self.read_counts = f"SELECT name, n FROM {self.counts} WHERE topic = ?"
        self.drop_rules = f"DELETE FROM {self.topics} WHERE topic = ?"
        self.drop_counts = f"DELETE FROM {self.counts} WHERE topic = ?"
        self.any_topic = f"SELECT topic FROM {self.topics} LIMIT 1"
        self.has_topics_table = (
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?"
        )
        self.drop_tables = [f"DROP TABLE IF EXISTS {ks}.{quote(t)}" for t in TABLES]
        self.drop_keyspace = f"DROP KEYSPACE IF EXISTS {ks}"
