"""kopf handlers: thin wrappers that call the generic reconcile and write what it returns."""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from dbq import kubeconfig
from dbq.api.models import GROUP, PLURAL, VERSION, DeletionPolicy
from dbq.backends.base import BackendError
from dbq.client.errors import QueueError
from dbq.controller import conditions as cond
from dbq.controller import metrics, upkeep
from dbq.controller.reconcile import Outcome, backend_for, reconcile, status_changes

FINALIZER = "dbq.dev/finalizer"
PAUSED = "dbq.dev/paused"
FORCE_DELETE = "dbq.dev/force-delete"
DRIFT_INTERVAL = float(os.environ.get("DBQ_DRIFT_INTERVAL", "60"))
UPKEEP_TICK = float(os.environ.get("DBQ_UPKEEP_TICK", "5"))  # the shortest stats/cleanup interval
log = logging.getLogger("dbq")
_core: client.CoreV1Api | None = None


def core() -> client.CoreV1Api:
    global _core
    if _core is None:
        kubeconfig.load()
        _core = client.CoreV1Api()
    return _core


def read_secret(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        secret = core().read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise kopf.TemporaryError(
            f"cannot read Secret {namespace}/{name}: HTTP {e.status}", delay=10
        ) from None
    return dict(secret.data or {})


def backoff(retry: int) -> float:
    return float(min(300, 5 * 2 ** min(retry, 6)))


def annotated(meta: kopf.Meta, key: str) -> bool:
    """Whether annotation `key` is set to "true" (any case)."""
    return str(meta.get("annotations", {}).get(key, "")).lower() == "true"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="dbq.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="dbq.dev", key="last-handled-configuration"
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.INFO
    settings.execution.max_workers = int(os.environ.get("DBQ_WORKERS", "8"))
    core()


@kopf.on.probe(id="api")
def probe_api(**_: Any) -> str:
    return "ok"


def _write(outcome: Outcome, body: kopf.Body, status: kopf.Status, patch: kopf.Patch) -> None:
    for key, value in status_changes(dict(status), outcome.status).items():
        patch.status[key] = value
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _reconcile(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
               patch: kopf.Patch, retry: int, drift_check: bool = False) -> None:  # fmt: skip
    if annotated(meta, PAUSED):
        conditions = cond.set_condition(
            status.get("conditions"), cond.PAUSED, True, "Paused",
            f"annotation {PAUSED}=true: dbq leaves this queue alone", meta.get("generation"),
        )  # fmt: skip
        _write(Outcome(status={"conditions": conditions}), body, status, patch)
        return
    outcome = reconcile(
        meta["name"], meta["namespace"], dict(spec), meta.get("generation"), dict(status), read_secret,
        drift_check=drift_check,
    )  # fmt: skip
    outcome.status["conditions"] = cond.drop_condition(outcome.status.get("conditions"), cond.PAUSED)
    _write(outcome, body, status, patch)
    if outcome.error is not None:
        if drift_check:
            return  # the timer comes back by itself
        raise kopf.TemporaryError(str(outcome.error), delay=backoff(retry))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def apply_queue(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                patch: kopf.Patch, retry: int, **_: Any) -> None:  # fmt: skip
    _reconcile(body, meta, spec, status, patch, retry)


@kopf.timer(GROUP, VERSION, PLURAL, interval=DRIFT_INTERVAL, initial_delay=DRIFT_INTERVAL, idle=5)
def drift(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
          patch: kopf.Patch, **_: Any) -> None:  # fmt: skip
    """Re-create objects dropped behind our back; writes status only when something changed.
    Queues not provisioned yet are left to the create/resume handlers."""
    if not cond.is_true(status.get("conditions"), cond.PROVISIONED):
        return
    _reconcile(body, meta, spec, status, patch, retry=0, drift_check=True)


_memory: dict[tuple[str, str], upkeep.Memory] = {}


@kopf.timer(GROUP, VERSION, PLURAL, interval=UPKEEP_TICK, initial_delay=UPKEEP_TICK)
def upkeep_tick(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                patch: kopf.Patch, **_: Any) -> None:  # fmt: skip
    """Statistics and cleanup, each when its interval from the spec is due."""
    if annotated(meta, PAUSED) or not cond.is_true(status.get("conditions"), cond.PROVISIONED):
        return
    name, namespace = meta["name"], meta["namespace"]
    memory = _memory.setdefault((namespace, name), upkeep.Memory())
    try:
        parsed, _queue, backend = backend_for(name, namespace, dict(spec), read_secret)
        try:
            done = upkeep.run_upkeep(namespace, name, parsed, dict(status), backend, memory)
        finally:
            backend.close()
    except (BackendError, QueueError) as e:
        log.warning("upkeep of %s/%s failed: %s", namespace, name, e)  # the drift timer reports it
        return
    for key, value in done.status.items():
        patch.status[key] = value
    for event in done.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_queue(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                 patch: kopf.Patch, retry: int, **_: Any) -> None:  # fmt: skip
    name, namespace = meta["name"], meta["namespace"]
    policy = spec.get("deletionPolicy", DeletionPolicy.DeleteIfEmpty)
    if policy == DeletionPolicy.Retain:
        kopf.event(
            body, type="Normal", reason="Retained", message="deletionPolicy Retain: database objects kept"
        )
        metrics.forget(namespace, name)
        return
    provisioned = cond.is_true(status.get("conditions"), cond.PROVISIONED)
    force = annotated(meta, FORCE_DELETE)
    try:
        _spec, queue, backend = backend_for(name, namespace, dict(spec), read_secret)
        try:
            if policy == DeletionPolicy.DeleteIfEmpty and not force:
                depth = backend.depth()
                if depth.depth or depth.in_flight:
                    message = (
                        f"queue {queue} still holds {depth.depth} ready and {depth.in_flight} leased messages; "
                        f"drain it, or annotate {FORCE_DELETE}=true to drop them"
                    )
                    patch.status["conditions"] = cond.set_condition(
                        status.get("conditions"), cond.DELETION_BLOCKED, True, "NotEmpty", message,
                        meta.get("generation"),
                    )  # fmt: skip
                    kopf.event(body, type="Warning", reason="DeletionBlocked", message=message)
                    raise kopf.TemporaryError(message, delay=min(60.0, backoff(retry)))
            backend.teardown()
        finally:
            backend.close()
    except BackendError as e:
        if not provisioned or (force and e.reason == "SecretNotFound"):
            # Never provisioned (bad Secret or spec): dbq made nothing there to drop. Or forced.
            why = "never provisioned" if not provisioned else "forced"
            kopf.event(body, type="Normal", reason="Deleted", message=f"{e}; {why}: nothing dropped")
            metrics.forget(namespace, name)
            return
        kopf.event(body, type="Warning", reason=e.reason, message=f"cannot delete yet: {e}")
        raise kopf.TemporaryError(str(e), delay=backoff(retry)) from None
    kopf.event(body, type="Normal", reason="Deleted", message=f"dropped queue {queue} ({policy})")
    metrics.forget(namespace, name)
    _memory.pop((namespace, name), None)
