"""Statistics and cleanup of a provisioned queue, each on its interval from the spec.

No kopf and no Kubernetes client here: `run_upkeep` takes the backend and what the operator
remembers of earlier runs, and returns the status patch and events. Pure helpers decide what is
due, compute rolling rates from the history table, and say when status is worth writing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from dbq.api.durations import seconds
from dbq.api.models import QueueSpec
from dbq.backends.base import BackendError, Earlier, QueueBackend, Sample
from dbq.backends.maintenance import MaintenanceResult
from dbq.controller import metrics
from dbq.controller.reconcile import Event

# status.stats is rewritten when a figure changed, or at least this often (a heartbeat).
STATS_HEARTBEAT_S = 300.0
# Repairs worth an Event, per design; the other counts are routine housekeeping.
REPAIRS = ("expiredLeases", "orphans", "holes", "finishedPipes", "rolledBack")


WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def time_zone() -> ZoneInfo:
    """The operator's time zone for maintenance windows (DBQ_TIMEZONE, default UTC)."""
    return ZoneInfo(os.environ.get("DBQ_TIMEZONE", "UTC"))


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_window(cron: str, after: datetime) -> datetime:
    return croniter(cron, after.astimezone(time_zone())).get_next(datetime)


def describe_cron(cron: str) -> str:
    """A cron schedule in words, for the common shapes; the expression itself otherwise."""
    minute, hour, dom, month, dow = cron.split()
    if minute.isdigit() and hour.isdigit() and dom == month == "*":
        at = f"at {int(hour):02d}:{int(minute):02d}"
        if dow == "*":
            return f"{at} every day"
        if dow.isdigit():
            return f"{at} every {WEEKDAYS[int(dow)]}"
    if minute.isdigit() and hour == dom == month == dow == "*":
        return f"at minute {int(minute)} of every hour"
    if minute.startswith("*/") and hour == dom == month == dow == "*":
        return f"every {minute[2:]} minutes"
    return f"on the cron schedule '{cron}'"


def describe(spec: QueueSpec, next_run: datetime | None) -> dict[str, str]:
    """What `kubectl describe` shows under status.schedule, in a DBA's words."""
    zone = time_zone()
    r, t = spec.reindex, spec.reindex.threshold
    if spec.backend == "cassandra":
        what = "nothing to do: Cassandra compacts queue tables on its own"
    elif spec.backend == "postgres":
        what = (f"VACUUM a table when dead rows pass {t.dead_tuple_percent}%, REINDEX"
                f"{' CONCURRENTLY' if r.online else ''} an index when its bloat passes {t.fragmentation_percent}%")  # fmt: skip
    else:
        what = (f"REORGANIZE an index past 5% fragmentation, REBUILD{' ONLINE' if r.online else ''} it past"
                f" {t.fragmentation_percent}%")  # fmt: skip
    upcoming = f"; next at {next_run.astimezone(zone):%Y-%m-%d %H:%M %Z}" if next_run else ""
    return {
        "statistics": f"measured every {spec.stats.interval}, history kept {spec.stats.retention}",
        "cleanup": f"every {spec.cleanup.interval}; claims and pipes idle for {spec.timeouts.stalled_after}"
        f" are stalled and repaired",
        "maintenance": f"{describe_cron(r.schedule)} ({zone.key}, cron '{r.schedule}'): {what}{upcoming}",
    }


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
        "measuredAt": stamp(at),
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


def parse_stamp(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def maintenance_due(spec: QueueSpec, status: dict[str, Any], wall: datetime) -> tuple[str, datetime]:
    """("run" | "plan" | "wait", the window). A queue without a planned window, or whose
    schedule changed, gets the next one planned ("plan")."""
    planned = status.get("maintenance") or {}
    if not planned.get("nextRun") or planned.get("cron") != spec.reindex.schedule:
        return "plan", next_window(spec.reindex.schedule, wall)
    when = parse_stamp(planned["nextRun"])
    return ("run" if wall >= when else "wait"), when


def run_maintenance(spec: QueueSpec, backend: QueueBackend, wall: datetime) -> tuple[dict[str, Any], Event]:
    t = spec.reindex.threshold
    started = time.monotonic()
    try:
        result: MaintenanceResult = backend.maintain(t.dead_tuple_percent, t.fragmentation_percent,
                                                     spec.reindex.online)  # fmt: skip
    except BackendError as e:  # reported; the next window tries again
        result = MaintenanceResult("Failed", str(e), seconds=time.monotonic() - started)
    after = next_window(spec.reindex.schedule, max(wall, datetime.now(UTC)))
    status = {
        **result.as_status(),
        "lastRun": stamp(wall),
        "nextRun": stamp(after),
        "cron": spec.reindex.schedule,
    }
    kind, reason = {
        "Succeeded": ("Normal", "Maintained"),
        "NotNeeded": ("Normal", "MaintenanceNotNeeded"),
        "Skipped": ("Warning", "MaintenanceSkipped"),
    }.get(result.result, ("Warning", "MaintenanceFailed"))
    return status, Event(kind, reason, f"{result.message} (next window {stamp(after)})")


def run_upkeep(
    namespace: str,
    name: str,
    spec: QueueSpec,
    status: dict[str, Any],
    backend: QueueBackend,
    memory: Memory,
    now: float | None = None,
    wall: datetime | None = None,
) -> Upkeep:
    """Measure, clean up and maintain the queue when each is due; BackendError from stats or
    cleanup propagates to the caller, a failed maintenance is reported in status."""
    now = time.monotonic() if now is None else now
    wall = datetime.now(UTC) if wall is None else wall
    out = Upkeep()
    action, next_run = maintenance_due(spec, status, wall)
    if action == "run":
        out.status["maintenance"], event = run_maintenance(spec, backend, wall)
        out.events.append(event)
        next_run = parse_stamp(out.status["maintenance"]["nextRun"])
    elif action == "plan":
        planned = {"nextRun": stamp(next_run), "cron": spec.reindex.schedule}
        out.status["maintenance"] = {**(status.get("maintenance") or {}), **planned}
    schedule = describe(spec, next_run)
    if status.get("schedule") != schedule:
        out.status["schedule"] = schedule
    if due(memory.stats_at, seconds(spec.stats.interval), now):
        sample = backend.measure()
        earlier = backend.sample_since(rate_window_s(spec))
        backend.record_sample(sample, seconds(spec.stats.retention))
        memory.stats_at = now
        measured = rates(sample, earlier)
        new = stats_status(sample, measured, wall)
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
        at = stamp(wall)
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
