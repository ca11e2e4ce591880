"""The QueueUser resource: who may do what on the queues and topics of one namespace.

A QueueUser becomes one database login with a generated password, a member of the group role
of each right it is given (`dbq.contract.access`), and a Secret its applications read instead
of the Queue's (the operator's) Secret. As for the Queue (`dbq.api.models`), these models give
the CRD its schema and CEL rules (`dbq.api.crd`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from dbq.api.models import DNS_LABEL_PATTERN, Model
from dbq.api.status import Condition


class Right(StrEnum):
    """What a login may do on a queue or topic (`dbq.contract.access` lists each right's routines)."""

    SEND = "send"  # push, push_many, defer
    RECEIVE = "receive"  # pop, acquire, ack, nack, extend and the batch forms
    PEEK = "peek"  # look at waiting messages without taking them
    MONITOR = "monitor"  # statistics and their history (the Spark status sources)
    PUBLISH = "publish"  # publish to a Topic
    MANAGE = "manage"  # dead letters (list, redrive, purge), the archive, repair


QUEUE_RIGHTS = (Right.SEND, Right.RECEIVE, Right.PEEK, Right.MONITOR, Right.MANAGE)
TOPIC_RIGHTS = (Right.PUBLISH,)

QUEUE_USER_KIND, QUEUE_USER_PLURAL = "QueueUser", "queueusers"
# metadata.name names the login (through a hash) and the Secret `dbq-user-<name>`.
QUEUE_USER_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
SECRET_PREFIX = "dbq-user-"
ROTATE_ANNOTATION = "dbq.dev/rotate"
DEFAULT_CONNECTION_LIMIT = 50

QueueRight = Literal["send", "receive", "peek", "monitor", "manage"]
TopicRight = Literal["publish"]
Name = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]


class QueueGrant(Model):
    name: Name = Field(
        description="A Queue of this namespace (metadata.name); a queue of another namespace cannot be named."
    )
    rights: list[QueueRight] = Field(
        min_length=1,
        max_length=5,
        description="send (push, push_many, defer), receive (pop, acquire, ack, nack, extend, the batch"
        " forms), peek, monitor (stats, history, the Spark status sources), manage (dead letters, redrive,"
        " purge, the archive, repair).",
    )


class TopicGrant(Model):
    name: Name = Field(description="A Topic of this namespace (metadata.name).")
    rights: list[TopicRight] = Field(min_length=1, max_length=1, description="publish.")


class QueueUserSpec(Model):
    queues: list[QueueGrant] = Field(
        default_factory=list, max_length=256, description="The queues the login may use, and how."
    )
    topics: list[TopicGrant] = Field(
        default_factory=list, max_length=256, description="The topics the login may publish to."
    )
    connection_limit: int = Field(
        default=DEFAULT_CONNECTION_LIMIT,
        ge=1,
        le=10_000,
        description="At most this many sessions of the login at once (PostgreSQL's CONNECTION LIMIT; SQL Server and Cassandra have no such limit).",
    )

    @model_validator(mode="after")
    def _something(self) -> QueueUserSpec:
        if not self.queues and not self.topics:
            raise ValueError(NOTHING_HINT)
        for field, grants in (("queues", self.queues), ("topics", self.topics)):
            names = [g.name for g in grants]
            if len(set(names)) != len(names):
                raise ValueError(f"spec.{field}: each name once: {UNIQUE_HINT}")
        return self

    def rights(self) -> dict[tuple[str, str], tuple[Right, ...]]:
        """(kind, name) -> the rights given, kind 'queue' or 'topic', each right once."""
        out: dict[tuple[str, str], tuple[Right, ...]] = {}
        for kind, grants in (("queue", self.queues), ("topic", self.topics)):
            for g in grants:
                out[(kind, g.name)] = tuple(Right(r) for r in dict.fromkeys(g.rights))
        return out


NOTHING_HINT = "a QueueUser names at least one queue (spec.queues) or topic (spec.topics)"
UNIQUE_HINT = "list the rights of one queue or topic in one entry"
QUEUE_USER_RULES = [
    # Either list may be absent (the API server fills in no default for it).
    {
        "rule": "(has(self.queues) ? size(self.queues) : 0) + (has(self.topics) ? size(self.topics) : 0) > 0",
        "message": NOTHING_HINT,
    },
    {
        "rule": "!has(self.queues) || self.queues.all(a, self.queues.exists_one(b, b.name == a.name))",
        "message": f"spec.queues: each name once: {UNIQUE_HINT}",
    },
    {
        "rule": "!has(self.topics) || self.topics.all(a, self.topics.exists_one(b, b.name == a.name))",
        "message": f"spec.topics: each name once: {UNIQUE_HINT}",
    },
]
QUEUE_USER_ROOT_RULES = [
    {
        "rule": f"self.metadata.name.matches('{QUEUE_USER_NAME_PATTERN}')",
        "message": "metadata.name of a QueueUser names its login and its Secret (dbq-user-NAME): use"
        " lower-case letters, digits and '-', starting with a letter, at most 40 characters",
    }
]


class GrantStatus(Model):
    kind: Literal["queue", "topic"] = Field(description="queue or topic.")
    name: str = Field(description="The Queue or Topic (metadata.name).")
    rights: list[str] = Field(description="The rights the login holds on it now.")


class QueueUserStatus(Model):
    observed_generation: int | None = Field(default=None, description="The last generation reconciled.")
    conditions: list[Condition] | None = Field(default=None, description="kstatus conditions (Ready first).")
    login: str | None = Field(default=None, description="The database login (role) of this QueueUser.")
    secret_name: str | None = Field(
        default=None, description="The Secret with its url, username and password (owned by the QueueUser)."
    )
    endpoint: str | None = Field(default=None, description="host:port/database, never credentials.")
    granted: list[GrantStatus] | None = Field(
        default=None, description="The rights held, per queue and topic."
    )
    rotated_at: str | None = Field(default=None, description="When the password was last set (UTC).")
    rotation: str | None = Field(
        default=None, description=f"The value of the {ROTATE_ANNOTATION} annotation last acted on."
    )


class QueueUserResource(Model):
    """A whole QueueUser manifest, checked as the API server checks it (the examples are)."""

    model_config = ConfigDict(extra="ignore")
    api_version: Literal["dbq.dev/v1alpha1"]
    kind: Literal["QueueUser"]
    metadata: dict[str, Any]
    spec: QueueUserSpec


def secret_name(name: str) -> str:
    return f"{SECRET_PREFIX}{name}"
