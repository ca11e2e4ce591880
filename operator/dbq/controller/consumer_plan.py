"""What a QueueConsumer should make KEDA do, from its spec, the Queues it names, its workload and
the ScaledObjects of its namespace: a pure function, unit-tested without an API server.

The objects, each owned by the QueueConsumer and labelled with its name, for spec.trigger
`postgresql` (KEDA's own scaler runs the query):
- a QueueUser `NAME-scaler` with only the `monitor` right on the Queues in use;
- a TriggerAuthentication `NAME-scaler` handing KEDA that QueueUser's connection string;
- a ScaledObject `NAME` on the workload (a ScaledJob `NAME` starting Jobs, for spec.job), with
  one `postgresql` trigger whose query adds up the Queues' backlogs (`keda_backlog.sql`): one
  query on one login, so one connection pool, however many Queues (KEDA would combine one
  trigger per Queue by their maximum, not their sum).
For `push`, only the ScaledObject (or ScaledJob), whose `external-push` trigger dials the
operator's push scaler (`dbq.scaler`), which runs the same query with the operator's connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dbq.api.access import QUEUE_USER_KIND, QUEUE_USER_PLURAL, secret_name
from dbq.api.consumers import QUEUE_CONSUMER_KIND, QueueConsumerSpec, Workload, scaler_name
from dbq.api.models import GROUP, VERSION, QueueSpec, queue_name
from dbq.backends.ring_sql import load_template, render_template
from dbq.connection import ConnectionSettings
from dbq.controller import conditions as cond
from dbq.errors import InvalidQueueConsumer, InvalidSpec, NoQueueReady, WorkloadNotFound, WorkloadTaken
from dbq.names import QueueNames, pg_quote
from dbq.resource import parse_spec, validation_message

Resource = Mapping[str, Any]
SettingsOf = Callable[[QueueSpec, str], ConnectionSettings]

KEDA_GROUP, KEDA_VERSION = "keda.sh", "v1alpha1"
KEDA_API = f"{KEDA_GROUP}/{KEDA_VERSION}"
SCALED_OBJECTS, SCALED_JOBS, TRIGGER_AUTHENTICATIONS = "scaledobjects", "scaledjobs", "triggerauthentications"
JOBS_KEPT = 5  # finished Jobs of a ScaledJob kept to look at, succeeded and failed each
CONSUMER_LABEL = "dbq.dev/queue-consumer"
MANAGED_BY = {"app.kubernetes.io/managed-by": "dbq"}
# KEDA's pool and the HPA's read each hold a session at most; a few more for a restart's overlap.
SCALER_CONNECTION_LIMIT = 4
MEASURE_FLAGS = {"depth": "depth", "depthAndInFlight": "depth_and_in_flight", "oldestAge": "oldest_age"}


@dataclass(frozen=True)
class ScalingPlan:
    queues: tuple[str, ...]  # the Queues scaled on (metadata.name), in spec order
    query: str
    # What to write, in order (the login before what reads its Secret, the ScaledObject last);
    # the QueueUser and TriggerAuthentication only for the postgresql trigger.
    children: tuple[dict[str, Any], ...]
    # (apiVersion, plural, name) of what this QueueConsumer may have written before and no longer
    # needs (the push trigger reads with the operator's connection): deleted when it owns them.
    unused: tuple[tuple[str, str, str], ...] = ()

    @property
    def scaled_object(self) -> dict[str, Any]:
        """The ScaledObject (a workload) or ScaledJob (Jobs)."""
        return self.children[-1]


def parse_queue_consumer(raw: Mapping[str, Any]) -> QueueConsumerSpec:
    try:
        return QueueConsumerSpec.model_validate(raw)
    except ValidationError as e:
        raise InvalidSpec(validation_message(e)) from None


def owned_by(obj: Resource, consumer: Resource) -> bool:
    uid = consumer["metadata"].get("uid")
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def backlog_query(spec: QueueConsumerSpec, stats_routines: Sequence[str]) -> str:
    """The one SELECT KEDA runs: each Queue's term of `keda_backlog.sql`, added up (the largest,
    for the oldest age). `stats_routines` are quoted, schema-qualified routine names."""
    template = load_template("dbq.backends.postgres", "keda_backlog.sql")
    flags = {flag: flag == MEASURE_FLAGS[spec.measure] for flag in MEASURE_FLAGS.values()}
    terms = []
    for stats in stats_routines:
        (statement,) = render_template(template, {"stats": stats}, flags)
        terms.append(" ".join(line for line in statement.splitlines() if not line.startswith("--")))
    if spec.measure == "oldestAge" and len(terms) > 1:
        return f"SELECT GREATEST({', '.join(terms)})"
    return "SELECT " + " + ".join(terms)


@dataclass(frozen=True)
class ScaledQueues:
    """The Queues a QueueConsumer scales on now, their database and the one query of their backlog."""

    queues: tuple[str, ...]  # metadata.name, in spec order: those that exist and are Ready
    names: tuple[QueueNames, ...]  # their names in the database
    admin: ConnectionSettings  # the operator's connection to their one database
    query: str


def scaled_queues(
    namespace: str, spec: QueueConsumerSpec, queues: Mapping[str, Resource], settings_of: SettingsOf
) -> ScaledQueues:
    """The Queues of spec.queues that exist and are Ready; InvalidQueueConsumer (naming the
    entry) for one KEDA cannot read, or one on another database; NoQueueReady for none."""
    used: list[str] = []
    names: list[QueueNames] = []
    first: tuple[str, ConnectionSettings] | None = None
    for index, queue in enumerate(spec.queues):
        found = queues.get(queue)
        if found is None or not cond.is_true((found.get("status") or {}).get("conditions"), cond.READY):
            continue
        field = f"spec.queues[{index}]"
        queue_spec = parse_spec(found.get("spec") or {})
        if queue_spec.backend != "postgres" or queue_spec.design != "ring":
            raise InvalidQueueConsumer(
                f"{field}: Queue {queue} is a {queue_spec.design} queue on {queue_spec.backend}: a QueueConsumer"
                " scales on PostgreSQL ring queues; scale this one with a ScaledObject of your own (docs:"
                " platform/autoscaling)"
            )
        settings = settings_of(queue_spec, namespace)
        if first is None:
            first = (queue, settings)
        elif (settings.host, settings.port, settings.database) != (
            first[1].host, first[1].port, first[1].database
        ):  # fmt: skip
            raise InvalidQueueConsumer(
                f"{field}: Queue {queue} is on {settings.endpoint} and {first[0]} on {first[1].endpoint}: one"
                " QueueConsumer's backlog is one query on one database; make a QueueConsumer per database"
            )
        names.append(QueueNames(queue_spec.connection.schema_, queue_name(queue, queue_spec)))
        used.append(queue)
    if first is None:
        raise NoQueueReady(
            f"spec.queues: none of {', '.join(spec.queues)} exists and is Ready in namespace {namespace}: the"
            " ScaledObject is removed until one is"
        )
    routines = [f"{pg_quote(n.schema)}.{pg_quote(n.routine('stats'))}" for n in names]
    return ScaledQueues(tuple(used), tuple(names), first[1], backlog_query(spec, routines))


def check_workload(
    consumer: Resource, target: Workload, workload: Resource | None, scaled_objects: Sequence[Resource]
) -> None:
    """WorkloadNotFound, or WorkloadTaken when a ScaledObject this QueueConsumer did not write
    scales it already (KEDA allows one a workload)."""
    namespace = consumer["metadata"]["namespace"]
    if workload is None:
        raise WorkloadNotFound(
            f"spec.workload: there is no {target.kind} {target.name} in namespace {namespace}: create it, or fix"
            " the name; nothing is scaled meanwhile"
        )
    for other in scaled_objects:
        ref = other.get("spec", {}).get("scaleTargetRef", {})
        same = ref.get("name") == target.name and ref.get("kind", "Deployment") == target.kind
        if same and not owned_by(other, consumer):
            raise WorkloadTaken(
                f"spec.workload: {target.kind} {target.name} is already scaled by ScaledObject"
                f" {other['metadata']['name']}, which this QueueConsumer did not write: KEDA allows one"
                " ScaledObject a workload; delete that one, or name another workload"
            )


def plan_scaling(
    consumer: Resource,
    spec: QueueConsumerSpec,
    queues: Mapping[str, Resource],
    workload: Resource | None,
    scaled_objects: Sequence[Resource],
    settings_of: SettingsOf,
    scaler_address: str = "",
) -> ScalingPlan:
    """The objects to write (`scaler_address`: where KEDA reaches the operator's push scaler,
    empty when it serves none); WorkloadNotFound, WorkloadTaken, NoQueueReady or InvalidQueueConsumer
    (naming the field) when the spec cannot be scaled on now."""
    meta = consumer["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    target = spec.workload
    if target is not None:
        check_workload(consumer, target, workload, scaled_objects)
    scaled = scaled_queues(namespace, spec, queues, settings_of)
    query = scaled.query
    scaler = scaler_name(name)

    def child(api_version: str, kind: str, child_name: str, child_spec: dict[str, Any]) -> dict[str, Any]:
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": QUEUE_CONSUMER_KIND, "name": name,
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        return {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "name": child_name,
                "namespace": namespace,
                "labels": {**MANAGED_BY, CONSUMER_LABEL: name},
                "ownerReferences": [owner],
            },
            "spec": child_spec,
        }

    if spec.trigger == "push":
        if not scaler_address:
            raise InvalidQueueConsumer(
                "spec.trigger: push needs the operator's push scaler, and this operator serves none: give it"
                " --scaler-port and DBQ_SCALER_ADDRESS (the chart's pushScaler.enabled), or use trigger postgresql"
            )
        trigger = {"type": "external-push", "name": "backlog", "metadata": {"scalerAddress": scaler_address}}
        logins: tuple[dict[str, Any], ...] = ()
        unused: tuple[tuple[str, str, str], ...] = (
            (KEDA_API, TRIGGER_AUTHENTICATIONS, scaler),
            (f"{GROUP}/{VERSION}", QUEUE_USER_PLURAL, scaler),
        )
    else:
        logins = (
            child(f"{GROUP}/{VERSION}", QUEUE_USER_KIND, scaler, {
                "queues": [{"name": q, "rights": ["monitor"]} for q in scaled.queues],
                "connectionLimit": SCALER_CONNECTION_LIMIT,
            }),
            child(KEDA_API, "TriggerAuthentication", scaler, {
                "secretTargetRef": [{"parameter": "connection", "name": secret_name(scaler), "key": "url"}],
            }),
        )  # fmt: skip
        trigger = {"type": "postgresql", "name": "backlog", "authenticationRef": {"name": scaler},
                   "metadata": {"query": query, "targetQueryValue": str(spec.messages_per_replica),
                                "activationTargetQueryValue": str(spec.activation)}}  # fmt: skip
        unused = ()
    if target is not None:
        scaler_kind, replaced = "ScaledObject", SCALED_JOBS
        scaler_spec: dict[str, Any] = {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": target.kind, "name": target.name},
            "cooldownPeriod": spec.cooldown_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {
                "stabilizationWindowSeconds": spec.scale_down_stabilization_seconds}}}},
        }  # fmt: skip
    else:  # Jobs for long tasks: KEDA starts them, never stops one
        scaler_kind, replaced = "ScaledJob", SCALED_OBJECTS
        scaler_spec = {"jobTargetRef": spec.job, "successfulJobsHistoryLimit": JOBS_KEPT,
                       "failedJobsHistoryLimit": JOBS_KEPT}  # fmt: skip
    scaler_spec |= {"pollingInterval": spec.polling_interval_seconds, "minReplicaCount": spec.min_replicas,
                    "maxReplicaCount": spec.max_replicas, "triggers": [trigger]}  # fmt: skip
    unused = ((KEDA_API, replaced, name), *unused)
    return ScalingPlan(
        scaled.queues, query, (*logins, child(KEDA_API, scaler_kind, name, scaler_spec)), unused
    )
