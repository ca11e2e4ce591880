"""What a topic's client and its provisioning share: names, the publish call, its answer.

A topic routes each message it is given, in one transaction, into the queue of every
subscription whose filter matches it (`dbq.api.filters`); each subscription's queue is an
ordinary Queue, with its own leases, retries and dead letters. On PostgreSQL the routing is one
routine per topic, generated from its subscriptions: one compiled predicate and one push per
subscription, and no dynamic SQL when a message is published.

The subscriptions a routine was made from are its rules version: a change of subscriptions takes
the topic's lock exclusively, replaces the routine and moves the version on; a publish takes the
lock shared and checks the version, so each message is routed by the rules in force when it
commits (a publish that waited on a change is refused with SQLSTATE 40001 and made again).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from dbq.api.filters import Filter
from dbq.names import QueueNames, check_identifier, pg_quote

TOPIC_SCHEMA_VERSION = 1
TOPICS_TABLE = "dbq_topics"  # per schema: topic, schema_version, rules_version, unrouted queue
SUBSCRIPTIONS_TABLE = "dbq_subscriptions"  # per schema: the rules of each topic, as a DBA reads them
# A publish whose subscription's queue is full and says onFull: Reject fails whole with this
# SQLSTATE (configuration_limit_exceeded): no queue gets a copy.
FULL_STATE = "53400"
ON_FULL = ("Reject", "Drop")
LABEL_PATTERN = r"[a-z][a-z0-9_-]{0,62}"


@dataclass(frozen=True)
class TopicNames:
    """Names of one topic's objects, unquoted."""

    schema: str
    topic: str

    def __post_init__(self) -> None:
        check_identifier(self.schema, "spec.connection.schema")
        check_identifier(self.topic, "topic name")

    @property
    def publish(self) -> str:
        return f"{self.topic}_publish"

    @property
    def publish_many(self) -> str:
        return f"{self.topic}_publish_many"

    @property
    def in_force(self) -> str:
        """A routine of earlier versions (its check is now inside the publish routines): dropped
        with the topic."""
        return f"{self.topic}_in_force"

    @property
    def published(self) -> str:
        """Sequence: messages published (committed or not: a sequence is not transactional)."""
        return f"{self.topic}_n_published"

    @property
    def unrouted(self) -> str:
        """Sequence: messages no subscription matched."""
        return f"{self.topic}_n_unrouted"

    def routed(self, ordinal: int) -> str:
        """Sequence: copies routed to the queue of the subscription numbered `ordinal`."""
        return f"{self.topic}_s{int(ordinal)}_routed"

    def dropped(self, ordinal: int) -> str:
        """Sequence: copies skipped for that subscription, its queue full (onFull: Drop)."""
        return f"{self.topic}_s{int(ordinal)}_dropped"

    def route_counters(self, ordinals: Iterable[int]) -> list[str]:
        """The routed and dropped sequences of the subscriptions numbered `ordinals`, in that order."""
        return [name for o in ordinals for name in (self.routed(o), self.dropped(o))]

    def counters(self, ordinals: Iterable[int]) -> list[str]:
        """Every sequence of the topic: published, unrouted, then `route_counters(ordinals)`."""
        return [self.published, self.unrouted, *self.route_counters(ordinals)]

    @property
    def lock(self) -> str:
        """The text whose hash keys the topic's advisory lock."""
        return f"dbq-topic:{self.schema}.{self.topic}"


@dataclass(frozen=True)
class Route:
    """One subscription: its name, its queue (in the topic's database) and filter, and what to do
    when that queue is full. `ordinal` numbers it within the topic for good (its counters);
    `ring_size` is its queue's (read from the queue's metadata when the topic is applied).
    `label` is the name a publish answers with (the Subscription's metadata.name), when it is not
    `subscription`, the name of its objects."""

    subscription: str
    queue: QueueNames
    filter: Filter
    on_full: str = "Reject"
    ordinal: int = 0
    ring_size: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        check_identifier(self.subscription, "subscription name")
        if self.on_full not in ON_FULL:
            raise ValueError(f"onFull is Reject or Drop, not {self.on_full!r}")
        if self.label and not re.fullmatch(LABEL_PATTERN, self.label):
            raise ValueError(
                f"a subscription's label is a Kubernetes name ({LABEL_PATTERN}), not {self.label!r}"
            )

    @property
    def shown(self) -> str:
        """The name a publish answers with, and errors name."""
        return self.label or self.subscription


@dataclass(frozen=True)
class TopicTarget:
    names: TopicNames
    routes: tuple[Route, ...] = ()
    unrouted: QueueNames | None = None  # the queue that gets what no subscription matched


@dataclass
class TopicCounts:
    """A topic's counts, by its backend's counters (PostgreSQL: sequences, which draw outside
    transactions, so a publish rolled back is counted too; Cassandra: counters added to after the
    copies are written)."""

    rules_version: int
    published: int
    unrouted: int
    routed: dict[str, int] = field(default_factory=dict)  # by subscription
    dropped: dict[str, int] = field(default_factory=dict)


def publish_statement(names: TopicNames) -> str:
    """The call of the topic's routine: body, stored headers, subject, ttl in ms."""
    return f"SELECT {pg_quote(names.schema)}.{pg_quote(names.publish)}(?, ?, ?, ?)"


def publish_many_statement(names: TopicNames) -> str:
    """The call of the topic's batch routine: bodies end to end, their lengths, a JSON array of
    stored headers (or NULL), a JSON array of subjects (or NULL), ttl in ms."""
    return f"SELECT {pg_quote(names.schema)}.{pg_quote(names.publish_many)}(?, ?, ?, ?, ?)"


def routed_ids(answer: str | None) -> dict[str, int]:
    """The routine's answer, `subscription=id,...`, as subscription -> message id in its queue."""
    found: dict[str, int] = {}
    for pair in (answer or "").split(","):
        if pair:
            name, _, msg_id = pair.partition("=")
            found[name] = int(msg_id)
    return found
