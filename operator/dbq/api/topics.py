"""The Topic and Subscription resources: spec and status as pydantic models.

A Topic is where publishers send messages; a Subscription binds a Topic to an existing Queue of
the same database with a filter (`dbq.api.filters`). One team owns the Topic, each consumer team
its Subscriptions: adding, changing or removing a subscription never touches the Topic's
manifest. As for the Queue (`dbq.api.models`), these models give `dbq apply` its validation and
the CRDs their schemas and CEL rules (`dbq.api.crd`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from dbq.api.filters import Filter
from dbq.api.models import (
    DERIVABLE_NAME_PATTERN,
    DNS_LABEL_PATTERN,
    IDENTIFIER_HINT,
    IDENTIFIER_PATTERN,
    Backend,
    Connection,
    Design,
    Model,
    derived_queue_name,
    immutable,
)
from dbq.api.status import Condition

TOPIC_KIND, TOPIC_PLURAL = "Topic", "topics"
SUBSCRIPTION_KIND, SUBSCRIPTION_PLURAL = "Subscription", "subscriptions"

# Where topics are made (backend -> designs); the others are refused at admission, by name.
TOPIC_BACKENDS = {"postgres": ("ring",), "cassandra": ("pipes",)}
TOPIC_BACKEND_HINT = (
    "spec.backend and spec.design: topics are made on postgres ring queues (backend: postgres, design: ring)"
    " and on cassandra pipes queues (backend: cassandra, design: pipes); sqlserver topics are not provided"
    " yet: publish to each queue with `push` there"
)
QueueRef = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]


class TopicSpec(Model):
    backend: Annotated[
        Backend,
        Field(json_schema_extra=immutable("spec.backend", "create a new Topic on the other backend")),
    ] = Field(description="The database of the topic and its subscribers' queues: postgres or cassandra.")
    design: Annotated[
        Design,
        Field(json_schema_extra=immutable("spec.design", "create a new Topic with the other design")),
    ] = Field(
        default=Design.ring,
        description="The design of its subscribers' queues: ring (postgres) or pipes (cassandra).",
    )
    topic_name: Annotated[
        str | None,
        Field(
            pattern=IDENTIFIER_PATTERN,
            json_schema_extra=immutable("spec.topicName", "create a new Topic with the other name"),
        ),
    ] = Field(
        default=None, description="Name of the topic's routines; defaults to metadata.name with '-' as '_'."
    )
    connection: Connection = Field(
        description="The Secret to connect with and the schema: those of every subscriber's Queue."
    )
    unrouted_queue: QueueRef | None = Field(
        default=None,
        description="A Queue (metadata.name, this namespace and database) that gets the messages no"
        " subscription matched; absent: they are counted as unrouted and kept nowhere.",
    )

    @model_validator(mode="after")
    def _supported(self) -> TopicSpec:
        if self.design not in TOPIC_BACKENDS.get(str(self.backend), ()):
            raise ValueError(TOPIC_BACKEND_HINT)
        return self


class SubscriptionSpec(Model):
    topic: Annotated[
        str,
        Field(
            pattern=DNS_LABEL_PATTERN,
            max_length=63,
            json_schema_extra=immutable("spec.topic", "create a new Subscription for the other Topic"),
        ),
    ] = Field(
        description="The Topic (metadata.name, in this namespace) whose messages this subscription gets."
    )
    queue: Annotated[
        str,
        Field(
            pattern=DNS_LABEL_PATTERN,
            max_length=63,
            json_schema_extra=immutable("spec.queue", "create a new Subscription for the other Queue"),
        ),
    ] = Field(
        description="The Queue (metadata.name, in this namespace, on the Topic's database) that gets a copy"
        " of each matching message."
    )
    filter: Filter = Field(
        default_factory=Filter,
        description="Which messages the queue gets: clauses on the subject and headers, all of which hold"
        " (none: every message).",
    )
    on_full: Literal["Reject", "Drop"] = Field(
        default="Reject",
        description="When the queue is full: Reject fails the whole publish (no subscriber gets a copy);"
        " Drop skips this subscriber's copy and counts it.",
    )


TOPIC_RULES = [
    {
        "rule": " || ".join(
            f"(self.backend == '{b}' && self.design in {list(ds)})" for b, ds in TOPIC_BACKENDS.items()
        ),
        "message": TOPIC_BACKEND_HINT,
    },
    {
        "rule": "has(self.topicName) == has(oldSelf.topicName)",
        "message": "spec.topicName cannot be added or removed after creation; create a new Topic instead",
    },
]
TOPIC_ROOT_RULES = [
    {
        "rule": f"has(self.spec.topicName) || self.metadata.name.matches('{DERIVABLE_NAME_PATTERN}')",
        "message": "metadata.name cannot be used as a topic name: set spec.topicName "
        "(lower-case letters, digits, '_', at most 40) or use a name of lower-case letters, digits and '-'",
    }
]
SUBSCRIPTION_ROOT_RULES = [
    {
        "rule": f"self.metadata.name.matches('{DERIVABLE_NAME_PATTERN}')",
        "message": "metadata.name of a Subscription names its counters in the database: use lower-case"
        " letters, digits and '-', starting with a letter, at most 40 characters",
    }
]


def topic_name(metadata_name: str, spec: TopicSpec) -> str:
    """The name of the topic's database objects."""
    if spec.topic_name:
        return spec.topic_name
    derived = derived_queue_name(metadata_name)
    if derived is None:
        raise ValueError(
            f"metadata.name {metadata_name!r} cannot be used as a topic name: set spec.topicName ({IDENTIFIER_HINT})"
        )
    return derived


def subscription_name(metadata_name: str) -> str:
    """The subscription's name in the database (its counters, the routine's answer)."""
    derived = derived_queue_name(metadata_name)
    if derived is None:
        raise ValueError(
            f"metadata.name {metadata_name!r} cannot name a subscription: use lower-case letters, digits"
            " and '-', starting with a letter, at most 40 characters"
        )
    return derived


class RouteStatus(Model):
    """One subscription as the topic's routine routes it."""

    subscription: str = Field(description="The Subscription (metadata.name).")
    queue: str = Field(description="Its Queue (metadata.name).")
    routed: int = Field(description="Copies put in the queue since the subscription was bound.")
    dropped: int = Field(description="Copies skipped because the queue was full (onFull: Drop).")


class TopicStatus(Model):
    observed_generation: int | None = Field(default=None, description="The last generation reconciled.")
    topic_name: str | None = Field(default=None, description="Name of the topic's database objects.")
    endpoint: str | None = Field(default=None, description="host:port/database, never credentials.")
    conditions: list[Condition] | None = Field(default=None, description="kstatus conditions (Ready first).")
    rules_version: int | None = Field(
        default=None, description="The version of the routing rules in force (one more per change)."
    )
    subscriptions: int | None = Field(
        default=None, description="Subscriptions the publish routine routes to."
    )
    published: int | None = Field(
        default=None,
        description="Messages published since the topic was made (counted by a sequence: a publish rolled"
        " back counts too).",
    )
    unrouted: int | None = Field(default=None, description="Published messages no subscription matched.")
    routes: list[RouteStatus] | None = Field(default=None, description="Each bound subscription's counts.")
    measured_at: str | None = Field(default=None, description="When the counts were read (UTC).")


class SubscriptionStatus(Model):
    observed_generation: int | None = Field(default=None, description="The last generation reconciled.")
    conditions: list[Condition] | None = Field(default=None, description="kstatus conditions (Ready first).")
    queue_name: str | None = Field(default=None, description="Name of the queue's database objects.")
    routed: int | None = Field(default=None, description="Copies put in the queue since it was bound.")
    dropped: int | None = Field(default=None, description="Copies skipped, the queue full (onFull: Drop).")


class TopicResource(Model):
    """A whole Topic manifest, checked as the API server checks it (the examples are)."""

    model_config = ConfigDict(extra="ignore")
    api_version: Literal["dbq.dev/v1alpha1"]
    kind: Literal["Topic"]
    metadata: dict[str, Any]
    spec: TopicSpec


class SubscriptionResource(Model):
    """A whole Subscription manifest, checked as the API server checks it (the examples are)."""

    model_config = ConfigDict(extra="ignore")
    api_version: Literal["dbq.dev/v1alpha1"]
    kind: Literal["Subscription"]
    metadata: dict[str, Any]
    spec: SubscriptionSpec
