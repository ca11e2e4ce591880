"""Conditions as Kubernetes tools expect them: type/status/reason/message/lastTransitionTime,
with the transition time kept when only the message changes.

Readiness follows the kstatus convention that Flux, Argo CD and `kubectl wait` read: `Ready` is
written as soon as a Queue is seen (Unknown until the first reconcile ends), `Reconciling=True`
while dbq is still working towards the spec (provisioning, or retrying an error that waiting can
heal), `Stalled=True` for an error that needs someone to act, and neither once Ready. The two
abnormal-true conditions are removed, not set False, when they no longer hold."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dbq.errors import DbqError

READY = "Ready"
PROVISIONED = "Provisioned"
DEGRADED = "Degraded"
DELETION_BLOCKED = "DeletionBlocked"
PAUSED = "Paused"
RECONCILING = "Reconciling"
RESIZING = "Resizing"
STALLED = "Stalled"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    *,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new list with `type_` set (None: Unknown); other conditions are kept as they are."""
    out = [dict(c) for c in (conditions or []) if c.get("type") != type_]
    previous = next((c for c in conditions or [] if c.get("type") == type_), None)
    value = "Unknown" if status is None else "True" if status else "False"
    changed = previous is None or previous.get("status") != value
    out.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": (now or now_iso()) if changed else previous["lastTransitionTime"],  # type: ignore[index]
            "observedGeneration": generation,
        }
    )
    order = {READY: 0, RECONCILING: 1, STALLED: 2, PROVISIONED: 3, DEGRADED: 4}
    return sorted(out, key=lambda c: (order.get(c["type"], 9), c["type"]))


def drop_condition(conditions: list[dict[str, Any]] | None, type_: str) -> list[dict[str, Any]]:
    return [dict(c) for c in (conditions or []) if c.get("type") != type_]


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]] | None, type_: str) -> bool:
    return (condition(conditions, type_) or {}).get("status") == "True"


def reconciling(
    conditions: list[dict[str, Any]] | None, generation: int | None
) -> list[dict[str, Any]] | None:
    """The conditions to write before working on `generation`, or None when they are written:
    Reconciling=True, and Ready=Unknown for a Queue seen for the first time."""
    ready = condition(conditions, READY)
    if ready and ready.get("observedGeneration") == generation:
        return None  # this generation is being worked on, or was
    message = f"reconciling generation {generation}"
    new = set_condition(conditions, RECONCILING, True, "Reconciling", message, generation)
    new = drop_condition(new, STALLED)
    if ready is None:
        new = set_condition(new, READY, None, "Reconciling", message, generation)
    return new


def settled(conditions: list[dict[str, Any]], error: DbqError | None = None) -> list[dict[str, Any]]:
    """After a reconcile: neither abnormal condition when it succeeded; Reconciling=True for an
    error that waiting can heal (dbq retries), Stalled=True for one that needs a change."""
    out = drop_condition(drop_condition(conditions, RECONCILING), STALLED)
    if error is None:
        return out
    ready = condition(out, READY) or {}
    generation = ready.get("observedGeneration")
    if error.retry:
        return set_condition(out, RECONCILING, True, error.reason, f"retrying: {error}", generation)
    return set_condition(out, STALLED, True, error.reason, str(error), generation)
