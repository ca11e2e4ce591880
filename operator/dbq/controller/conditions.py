"""Conditions as Kubernetes tools expect them: type/status/reason/message/lastTransitionTime,
with the transition time kept when only the message changes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

READY = "Ready"
PROVISIONED = "Provisioned"
DEGRADED = "Degraded"
DELETION_BLOCKED = "DeletionBlocked"
PAUSED = "Paused"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    *,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new list with `type_` set; other conditions are kept as they are."""
    out = [dict(c) for c in (conditions or []) if c.get("type") != type_]
    previous = next((c for c in conditions or [] if c.get("type") == type_), None)
    value = "True" if status else "False"
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
    order = {READY: 0, PROVISIONED: 1, DEGRADED: 2}
    return sorted(out, key=lambda c: (order.get(c["type"], 9), c["type"]))


def drop_condition(conditions: list[dict[str, Any]] | None, type_: str) -> list[dict[str, Any]]:
    return [dict(c) for c in (conditions or []) if c.get("type") != type_]


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]] | None, type_: str) -> bool:
    return (condition(conditions, type_) or {}).get("status") == "True"
