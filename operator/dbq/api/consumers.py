"""The QueueConsumer resource: the consumers of some Queues, scaled with their backlog by KEDA.

The team that runs the consumers owns it. It names the Queues its workload reads, the workload,
and how much backlog a replica takes on; the operator writes and owns the KEDA objects that do
the scaling (`dbq.controller.consumers`): a ScaledObject on the workload, a TriggerAuthentication,
and a QueueUser that may only monitor the Queues, whose login KEDA reads the figures with.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from dbq.api.models import DNS_LABEL_PATTERN, Model
from dbq.api.status import Condition

QUEUE_CONSUMER_KIND, QUEUE_CONSUMER_PLURAL = "QueueConsumer", "queueconsumers"
# metadata.name names the ScaledObject and, with `-scaler`, the QueueUser (at most 40 characters).
QUEUE_CONSUMER_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,31}[a-z0-9])?$"
SCALER_SUFFIX = "-scaler"
MAX_QUEUES = 16

Name = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]
Measure = Literal["depth", "depthAndInFlight", "oldestAge"]


class Workload(Model):
    kind: Literal["Deployment", "StatefulSet"] = Field(
        default="Deployment", description="Deployment or StatefulSet."
    )
    name: Name = Field(description="The workload of this namespace whose replicas KEDA sets.")


class QueueConsumerSpec(Model):
    queues: list[Name] = Field(
        min_length=1,
        max_length=MAX_QUEUES,
        description="The Queues of this namespace the workload consumes (ring queues on PostgreSQL, one"
        " database); the backlog scaled on is their sum (the largest age, for oldestAge).",
    )
    workload: Workload | None = Field(
        default=None,
        description="What KEDA scales (a ScaledObject). Leave `replicas` out of its manifest. Give this or"
        " spec.job.",
    )
    job: dict[str, Any] | None = Field(
        default=None,
        description="For long tasks, instead of spec.workload: a Job's spec (batch/v1 JobSpec: template,"
        " backoffLimit...). KEDA starts Jobs for the backlog (a ScaledJob: ceil(backlog / messagesPerReplica)"
        " Jobs running, at most maxReplicas), each taking its messages and ending, e.g. `dbq consume"
        " --max-messages N`; a Job is never stopped to scale in.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    trigger: Literal["postgresql", "push"] = Field(
        default="postgresql",
        description="Who reads the backlog: postgresql (KEDA's own scaler, every pollingIntervalSeconds, as a"
        " monitor-only QueueUser the operator writes; scaling goes on while the operator is down) or push (the"
        " operator's push scaler, with its own connection: a message in an empty queue activates the workload at"
        " once, without waiting for the poll).",
    )
    measure: Measure = Field(
        default="depth",
        description="What counts as backlog: depth (messages waiting), depthAndInFlight (waiting or leased,"
        " for long handlers: a replica holding leases is not taken away), oldestAge (the oldest waiting"
        " message's age in seconds, for a latency target).",
    )
    messages_per_replica: int = Field(
        ge=1,
        le=1_000_000,
        description="The backlog one replica takes on: replicas = ceil(backlog / messagesPerReplica), between"
        " the two counts. For oldestAge, seconds of the oldest message's age per replica.",
    )
    min_replicas: int = Field(
        default=0, ge=0, le=1000, description="Replicas while the queues are empty (0 allowed)."
    )
    max_replicas: int = Field(default=10, ge=1, le=1000, description="Replicas at most.")
    activation: int = Field(
        default=0,
        ge=0,
        description="From 0 replicas, the first starts once the backlog is above this (0: any message).",
    )
    polling_interval_seconds: int = Field(
        default=10,
        ge=1,
        le=3600,
        description="Seconds between KEDA's reads of the backlog: how long a message can wait for the first"
        " replica, and a read of the stats routine each time.",
    )
    cooldown_seconds: int = Field(
        default=300, ge=0, le=86_400, description="Seconds of an empty backlog before the last replica goes."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="Seconds the HPA waits, after the backlog falls, before it removes replicas.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> QueueConsumerSpec:
        if (self.workload is None) == (self.job is None):
            raise ValueError(TARGET_HINT)
        if self.max_replicas < self.min_replicas:
            raise ValueError(REPLICAS_HINT)
        if len(set(self.queues)) != len(self.queues):
            raise ValueError(QUEUES_HINT)
        return self


TARGET_HINT = (
    "give spec.workload (a Deployment or StatefulSet to scale) or spec.job (Jobs for long tasks), one of them"
)
REPLICAS_HINT = "spec.maxReplicas must be at least spec.minReplicas: raise maxReplicas or lower minReplicas"
QUEUES_HINT = "spec.queues: name each Queue once"
QUEUE_CONSUMER_RULES = [
    {"rule": "has(self.workload) != has(self.job)", "message": TARGET_HINT},
    {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",
     "message": REPLICAS_HINT},
    {"rule": "self.queues.all(a, self.queues.exists_one(b, b == a))", "message": QUEUES_HINT},
]  # fmt: skip
QUEUE_CONSUMER_ROOT_RULES = [
    {
        "rule": f"self.metadata.name.matches('{QUEUE_CONSUMER_NAME_PATTERN}')",
        "message": "metadata.name of a QueueConsumer names its ScaledObject and its QueueUser (NAME-scaler):"
        " use lower-case letters, digits and '-', starting with a letter, at most 33 characters",
    }
]


class QueueConsumerStatus(Model):
    observed_generation: int | None = Field(default=None, description="The last generation reconciled.")
    conditions: list[Condition] | None = Field(
        default=None, description="kstatus conditions (Ready first), and Active: whether KEDA sees a backlog."
    )
    scaled_object: str | None = Field(
        default=None,
        description="The ScaledObject (spec.workload) or ScaledJob (spec.job) the operator wrote.",
    )
    queue_user: str | None = Field(
        default=None,
        description="The QueueUser (monitor only) whose login KEDA reads the backlog with (trigger postgresql).",
    )
    queues: list[str] | None = Field(
        default=None, description="The Queues scaled on now: those of spec.queues that exist and are Ready."
    )
    query: str | None = Field(
        default=None,
        description="The backlog's query, run by KEDA (postgresql) or by the push scaler (push).",
    )
    replicas: int | None = Field(
        default=None, description="The workload's replicas, or the Jobs running, as last seen."
    )
    desired_replicas: int | None = Field(
        default=None, description="What the HPA last asked for (spec.workload)."
    )


class QueueConsumerResource(Model):
    """A whole QueueConsumer manifest, checked as the API server checks it (the examples are)."""

    model_config = ConfigDict(extra="ignore")
    api_version: Literal["dbq.dev/v1alpha1"]
    kind: Literal["QueueConsumer"]
    metadata: dict[str, Any]
    spec: QueueConsumerSpec


def scaler_name(name: str) -> str:
    """The QueueUser and TriggerAuthentication of QueueConsumer `name`."""
    return f"{name}{SCALER_SUFFIX}"
