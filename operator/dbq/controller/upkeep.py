"""Statistics and cleanup of a provisioned queue, each on its interval from the spec.

No kopf and no Kubernetes client here: `run_upkeep` takes the backend and what the operator
remembers of earlier runs, and returns the status patch and events. Pure helpers decide what is
due, compute rolling rates from the history table, and say when status is worth writing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dbq.api.durations import seconds
from dbq.api.models import QueueSpec
from dbq.backends.base import Earlier, QueueBackend, Sample
from dbq.controller import metrics
from dbq.controller.reconcile import Event

# status.stats is rewritten when a figure changed, or at least this often (a heartbeat).
STATS_HEARTBEAT_S = 300.0
# Repairs worth an Event, per design; the other counts are routine housekeeping.
REPAIRS = ("expiredLeases", "orphans", "finishedPipes", "rolledBack")


def rate_window_s(spec: QueueSpec) -> float:
    """Rates are averaged over four stats intervals, and at least 20 s."""
    return max(4 * seconds(spec.stats.interval), 20.0)


@dataclass
class Memory:
    """What the operator remembers of one queue between ticks (lost on restart: then both run)."""

    stats_at: float = 0.0  # monotonic
    cleanup_at: float = 0.0
    stats_written_at: float = 0.0


@dataclass
class Upkeep:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


def due(last: float, interval_s: float, now: float) -> bool:
    return last == 0.0 or now - last >= interval_s


def rates(sample: Sample, earlier: Earlier | None) -> tuple[float, float] | None:
    """(pushes/s, takes/s) since `earlier`; None without a sample old enough to divide by."""
    if earlier is None or earlier.age_s < 1.0:
        return None
    return (
        max(sample.pushed - earlier.pushed, 0) / earlier.age_s,
        max(sample.taken - earlier.taken, 0) / earlier.age_s,
    )


def stats_status(sample: Sample, measured: tuple[float, float] | None, at: datetime) -> dict[str, Any]:
    push_rate, pop_rate = measured or (0.0, 0.0)
    return {
        "depth": sample.depth,
        "inFlight": sample.in_flight,
        "pushed": sample.pushed,
        "popped": sample.popped,
        "acquired": sample.acquired,
        "expired": sample.expired,
        "pushRate": round(push_rate, 1),
        "popRate": round(pop_rate, 1),
        "oldestMessageAgeSeconds": round(sample.oldest_age_s, 1),
        "measuredAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def worth_writing(old: dict[str, Any] | None, new: dict[str, Any], last_write: float, now: float) -> bool:
    """A figure changed, or the heartbeat is due: else status stays as it is (no API write)."""
    if not old or last_write == 0.0 or now - last_write >= STATS_HEARTBEAT_S:
        return True
    ignore = {"measuredAt", "oldestMessageAgeSeconds"}
    # The age of a message nobody takes grows every tick: only a change of 10% or more counts.
    old_age, new_age = float(old.get("oldestMessageAgeSeconds") or 0), float(new["oldestMessageAgeSeconds"])
    aged = abs(new_age - old_age) > max(0.1 * old_age, 1.0)
    return aged or {k: v for k, v in old.items() if k not in ignore} != {
        k: v for k, v in new.items() if k not in ignore
    }


def cleanup_message(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing to repair"


def run_upkeep(
    namespace: str,
    name: str,
    spec: QueueSpec,
    status: dict[str, Any],
    backend: QueueBackend,
    memory: Memory,
    now: float | None = None,
) -> Upkeep:
    """Measure and/or clean up the queue when due; BackendError propagates to the caller."""
    now = time.monotonic() if now is None else now
    out = Upkeep()
    if due(memory.stats_at, seconds(spec.stats.interval), now):
        sample = backend.measure()
        earlier = backend.sample_since(rate_window_s(spec))
        backend.record_sample(sample, seconds(spec.stats.retention))
        memory.stats_at = now
        measured = rates(sample, earlier)
        new = stats_status(sample, measured, datetime.now(UTC))
        metrics.set_stats(namespace, name, sample, measured)
        if worth_writing(status.get("stats"), new, memory.stats_written_at, now):
            out.status["stats"] = new
            memory.stats_written_at = now
    if due(memory.cleanup_at, seconds(spec.cleanup.interval), now):
        counts = backend.cleanup(seconds(spec.timeouts.stalled_after))
        memory.cleanup_at = now
        metrics.count_cleanup(namespace, name, counts)
        repaired = {k: v for k, v in counts.items() if k in REPAIRS and v}
        previous = status.get("cleanup") or {}
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cleanup: dict[str, Any] = {
            "lastRun": at,
            "lastResult": counts,
            "repairedTotal": int(previous.get("repairedTotal") or 0) + sum(repaired.values()),
            "lastRepairAt": at if repaired else previous.get("lastRepairAt"),
        }
        # Written when something was repaired or housekept, or as the stats heartbeat is.
        if any(counts.values()) or not previous or now - memory.stats_written_at >= STATS_HEARTBEAT_S:
            out.status["cleanup"] = {k: v for k, v in cleanup.items() if v is not None}
        if repaired:
            out.events.append(Event("Normal", "Repaired", f"cleanup repaired {cleanup_message(repaired)}"))
    return out
