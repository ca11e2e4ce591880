"""One generic reconcile for every backend: spec + Secret -> backend apply -> status and events.

No kopf and no Kubernetes client in here: the caller passes a Secret reader and applies the
returned status patch and events, so `dbq apply` runs exactly this code without a cluster.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from dbq.api.models import QueueSpec, queue_name
from dbq.backends import open_backend
from dbq.backends.base import BackendError, InvalidSpec, QueueBackend
from dbq.controller import conditions as cond
from dbq.controller import metrics
from dbq.resource import SecretReader, parse_spec, settings_for


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    error: BackendError | None = None
    steps: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def backend_for(
    name: str, namespace: str, spec_raw: dict[str, Any], read_secret: SecretReader
) -> tuple[QueueSpec, str, QueueBackend]:
    spec = parse_spec(spec_raw)
    try:
        queue = queue_name(name, spec)
    except ValueError as e:
        raise InvalidSpec(str(e)) from None
    return spec, queue, open_backend(spec, queue, settings_for(spec, namespace, read_secret))


def reconcile(
    name: str,
    namespace: str,
    spec_raw: dict[str, Any],
    generation: int | None,
    status: dict[str, Any] | None,
    read_secret: SecretReader,
    *,
    drift_check: bool = False,
) -> Outcome:
    """Provision or repair the queue; the Outcome says what to write and announce."""
    status = dict(status or {})
    old = status.get("conditions") or []
    out = Outcome()
    started = time.monotonic()
    backend: QueueBackend | None = None
    conditions = old
    try:
        spec, queue, backend = backend_for(name, namespace, spec_raw, read_secret)
        steps = backend.plan(backend.observe())
        if steps and drift_check:
            why = "; ".join(s.why for s in steps)
            conditions = cond.set_condition(
                conditions, cond.DEGRADED, True, "Drift", f"repairing: {why}", generation
            )
            out.events.append(Event("Warning", "Drift", f"database objects differ from the spec: {why}"))
        result = backend.apply() if steps else None
        out.steps = [s.why for s in result.steps] if result else []
        if result and result.steps:
            verb = "Repaired" if drift_check else "Provisioned"
            out.events.append(Event("Normal", verb, f"{verb.lower()} {queue}: " + "; ".join(out.steps)))
        message = f"queue {queue} ({spec.design}, {spec.backend}) matches the spec at {backend.endpoint()}"
        conditions = cond.set_condition(conditions, cond.READY, True, "Provisioned", message, generation)
        conditions = cond.set_condition(
            conditions, cond.PROVISIONED, True, "Provisioned", message, generation
        )
        degraded_reason = "Repaired" if steps and drift_check else "AsExpected"
        conditions = cond.set_condition(
            conditions, cond.DEGRADED, False, degraded_reason, "database objects match the spec", generation
        )
        out.status = {
            "conditions": conditions,
            "observedGeneration": generation,
            "schemaVersion": result.schema_version if result else status.get("schemaVersion") or 1,
            "queueName": queue,
            "endpoint": backend.endpoint(),
        }
        metrics.reconciled(ok=True, seconds=time.monotonic() - started)
    except BackendError as e:
        out.error = e
        # A failed drift repair keeps Degraded=True (set above) until a later pass repairs it.
        conditions = cond.set_condition(conditions, cond.READY, False, e.reason, str(e), generation)
        if not cond.is_true(old, cond.PROVISIONED):  # objects made earlier stay provisioned
            conditions = cond.set_condition(conditions, cond.PROVISIONED, False, e.reason, str(e), generation)
        out.status = {"conditions": conditions, "observedGeneration": generation}
        previous = cond.condition(old, cond.READY) or {}
        if previous.get("reason") != e.reason or previous.get("message") != str(e):
            out.events.append(Event("Warning", e.reason, str(e)))
        metrics.reconciled(ok=False, seconds=time.monotonic() - started, reason=e.reason)
    finally:
        if backend is not None:
            backend.close()
    ready_before = (cond.condition(old, cond.READY) or {}).get("status")
    ready_now = (cond.condition(out.status.get("conditions"), cond.READY) or {}).get("status")
    if ready_before != ready_now and ready_now == "True":
        out.events.append(Event("Normal", "Ready", "queue is ready"))
    metrics.set_ready(namespace, name, ready_now == "True")
    return out


def status_changes(current: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Only the fields that differ, so an unchanged queue costs no API write."""
    current = current or {}
    return {
        k: v
        for k, v in new.items()
        if json.dumps(current.get(k), sort_keys=True) != json.dumps(v, sort_keys=True)
    }
