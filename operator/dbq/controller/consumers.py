"""Keeps a QueueConsumer's KEDA objects as its spec says: read the Queues, the workload and the
namespace's ScaledObjects, plan (`dbq.controller.consumer_plan`), write the QueueUser, the
TriggerAuthentication and the ScaledObject, and report what KEDA and the HPA do in the status.

Run when the spec changes and on a short timer: a Queue made Ready or deleted since changes the
query, KEDA's Active condition and the workload's replicas are mirrored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dbq.api.access import QUEUE_USER_PLURAL
from dbq.api.consumers import QUEUE_CONSUMER_PLURAL, scaler_name
from dbq.api.models import GROUP, PLURAL, VERSION
from dbq.controller import conditions as cond
from dbq.controller.access import Synced
from dbq.controller.consumer_plan import (
    KEDA_API,
    SCALED_JOBS,
    SCALED_OBJECTS,
    TRIGGER_AUTHENTICATIONS,
    ScalingPlan,
    owned_by,
    parse_queue_consumer,
    plan_scaling,
)
from dbq.controller.reconcile import Event
from dbq.errors import DbqError, InvalidQueueConsumer, KedaNotInstalled, NoQueueReady
from dbq.kube import Kube
from dbq.resource import SecretReader, settings_for

Resource = Mapping[str, Any]
Poster = Callable[[Resource, Event], None]
ACTIVE = "Active"
PLURALS = {"QueueUser": QUEUE_USER_PLURAL, "TriggerAuthentication": TRIGGER_AUTHENTICATIONS,
           "ScaledObject": SCALED_OBJECTS, "ScaledJob": SCALED_JOBS}  # fmt: skip
# KEDA's label on the Jobs a ScaledJob starts
SCALED_JOB_LABEL = "scaledjob.keda.sh/name"


def scaler_plural(resource: Resource) -> str:
    """What the QueueConsumer's spec makes KEDA scale with: a ScaledJob for spec.job, else a ScaledObject."""
    return SCALED_JOBS if (resource.get("spec") or {}).get("job") else SCALED_OBJECTS


def keda_condition(scaled_object: Resource | None, type_: str) -> dict[str, Any] | None:
    return cond.condition((scaled_object or {}).get("status", {}).get("conditions"), type_)


def keda_ready(scaled_object: Resource | None, name: str) -> tuple[bool | None, str, str]:
    """Ready as KEDA says it of the ScaledObject: Unknown until KEDA has looked at it."""
    said = keda_condition(scaled_object, "Ready")
    if said is None or said.get("status") == "Unknown":
        return None, "WaitingForKeda", f"ScaledObject {name} written; KEDA has not taken it up yet"
    if said.get("status") == "True":
        return True, "Scaling", f"KEDA scales the workload on ScaledObject {name}"
    return False, "KedaRefused", f"KEDA: ScaledObject {name}: {said.get('message') or said.get('reason')}"


class QueueConsumerSync:
    def __init__(self, kube: Kube, read_secret: SecretReader, post: Poster, scaler_address: str = "") -> None:
        self.kube = kube
        self.read_secret = read_secret
        self.post = post
        # where KEDA reaches this operator's push scaler; empty when it serves none
        self.scaler_address = scaler_address

    def _plan(self, resource: Resource) -> ScalingPlan:
        namespace = resource["metadata"]["namespace"]
        spec = parse_queue_consumer(resource.get("spec") or {})
        scaled_objects = self.kube.list_objects(KEDA_API, SCALED_OBJECTS, namespace)
        if scaled_objects is None:
            raise KedaNotInstalled(
                "the cluster serves no scaledobjects.keda.sh: install KEDA; nothing is scaled until then"
            )
        target = spec.workload
        workload = self.kube.read_workload(namespace, target.kind, target.name) if target else None
        queues = {q["metadata"]["name"]: q for q in self.kube.list_resources(PLURAL, namespace)}
        return plan_scaling(resource, spec, queues, workload, scaled_objects,
                            lambda s, ns: settings_for(s, ns, self.read_secret), self.scaler_address)  # fmt: skip

    def sync(self, resource: Resource) -> Synced:
        meta, status = resource["metadata"], dict(resource.get("status") or {})
        namespace, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        out = Synced()
        conditions = status.get("conditions")
        try:
            plan = self._plan(resource)
            for child in plan.children:
                written = self.kube.write_object(PLURALS[child["kind"]], child)
                if written == "foreign":
                    raise InvalidQueueConsumer(
                        f"metadata.name: {child['kind']} {child['metadata']['name']} exists and was not written by this"
                        " QueueConsumer: the operator leaves it alone; rename the QueueConsumer, or delete that object"
                    )
                if written != "unchanged":
                    out.events.append(Event("Normal", "Written", f"{child['kind']} {child['metadata']['name']}"
                                            f" {written}"))  # fmt: skip
            self._remove_children(resource, out.events, plan.unused)
            user = scaler_name(name) if len(plan.children) > 1 else None
            out.status = {"scaledObject": name, "queueUser": user, "queues": list(plan.queues),
                          "query": plan.query}  # fmt: skip
            plural = PLURALS[plan.scaled_object["kind"]]
            ready = keda_ready(self.kube.find_object(KEDA_API, plural, namespace, name), name)
        except DbqError as e:
            out.error = e
            if isinstance(e, NoQueueReady):
                self._remove_children(resource, out.events)
                out.status = {"scaledObject": None, "queues": [], "query": None}
            ready = (False, e.reason, str(e))
        conditions = cond.set_condition(conditions, cond.READY, *ready, generation)
        conditions = self._mirror_active(resource, conditions, out.events, generation)
        out.status |= self._replicas(resource, out.events)
        out.status |= {"observedGeneration": generation, "conditions": cond.settled(conditions, out.error)}
        self.kube.patch_status(QUEUE_CONSUMER_PLURAL, namespace, name, out.status)
        for event in out.events:
            self.post(resource, event)
        return out

    def _mirror_active(
        self,
        resource: Resource,
        conditions: list[dict[str, Any]],
        events: list[Event],
        generation: int | None,
    ) -> list[dict[str, Any]]:
        """Active: whether KEDA sees a backlog above the activation threshold (True keeps at
        least one replica); an Event when it changes."""
        meta = resource["metadata"]
        found = self.kube.find_object(KEDA_API, scaler_plural(resource), meta["namespace"], meta["name"])
        said = keda_condition(found, ACTIVE) if found is not None and owned_by(found, resource) else None
        if said is None:
            return cond.drop_condition(conditions, ACTIVE)
        was = cond.condition(conditions, ACTIVE)
        active = said.get("status") == "True"
        if was is not None and was.get("status") != said.get("status"):
            events.append(Event("Normal", "Activated" if active else "Deactivated",
                                "KEDA sees a backlog: at least one replica" if active
                                else "no backlog: replicas go to spec.minReplicas after the cooldown"))  # fmt: skip
        reason = "Backlog" if active else "NoBacklog"
        return cond.set_condition(conditions, ACTIVE, active, reason, said.get("message") or "", generation)

    def _replicas(self, resource: Resource, events: list[Event]) -> dict[str, Any]:
        meta, spec, status = resource["metadata"], resource.get("spec") or {}, resource.get("status") or {}
        if spec.get("job"):
            return {
                "replicas": self.kube.count_active_jobs(
                    meta["namespace"], f"{SCALED_JOB_LABEL}={meta['name']}"
                )
            }
        target = spec.get("workload") or {}
        if not target.get("name"):
            return {}
        workload = self.kube.read_workload(
            meta["namespace"], target.get("kind", "Deployment"), target["name"]
        )
        if workload is None:
            return {"replicas": None, "desiredReplicas": None}
        replicas = workload.get("spec", {}).get("replicas", 1)
        hpa = self.kube.read_hpa(meta["namespace"], f"keda-hpa-{meta['name']}")
        desired = (hpa or {}).get("status", {}).get("desiredReplicas")
        before = status.get("replicas")
        if before is not None and before != replicas:
            events.append(Event("Normal", "Scaled", f"{target.get('kind')} {target.get('name')}: replicas"
                                f" {before} -> {replicas}"))  # fmt: skip
        return {"replicas": replicas, "desiredReplicas": desired}

    def _remove_children(
        self, resource: Resource, events: list[Event], which: tuple[tuple[str, str, str], ...] | None = None
    ) -> None:
        """Delete the objects this QueueConsumer wrote (`which`; all when None), the ScaledObject
        first (KEDA then stops reading with the login); what another wrote is left alone."""
        meta = resource["metadata"]
        namespace, scaler = meta["namespace"], scaler_name(meta["name"])
        every = ((KEDA_API, SCALED_OBJECTS, meta["name"]), (KEDA_API, SCALED_JOBS, meta["name"]),
                 (KEDA_API, TRIGGER_AUTHENTICATIONS, scaler), (f"{GROUP}/{VERSION}", QUEUE_USER_PLURAL, scaler))  # fmt: skip
        for api_version, plural, name in every if which is None else which:
            found = self.kube.find_object(api_version, plural, namespace, name)
            if found is not None and owned_by(found, resource):
                self.kube.delete_object(api_version, plural, namespace, name)
                events.append(Event("Normal", "Removed", f"{found['kind']} {name} deleted"))

    def delete(self, resource: Resource) -> None:
        self._remove_children(resource, [])
