"""Every schedule, threshold and check of a Queue in words: what `kubectl describe queue` shows
under status.schedule. Pure: from the spec (and the next planned maintenance window)."""

from __future__ import annotations

from datetime import datetime

from dbq.api.models import QueueSpec
from dbq.api.status import ScheduleStatus
from dbq.settings import time_zone

WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


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


def describe(spec: QueueSpec, next_run: datetime | None) -> ScheduleStatus:
    """What `kubectl describe` shows under status.schedule, in a DBA's words."""
    zone = time_zone()
    r, t = spec.reindex, spec.reindex.threshold
    cleanup = (f"every {spec.cleanup.interval}; claims and pipes idle for {spec.timeouts.stalled_after}"
               " are stalled and repaired")  # fmt: skip
    if spec.design == "servicebroker":
        what = (f"ALTER QUEUE ... REBUILD past {t.fragmentation_percent}% fragmentation or ghost records,"
                " REORGANIZE past 5% (offline operations, so only in this window; before SQL Server 2016"
                " reported with what to run, not run)")  # fmt: skip
        cleanup = (f"every {spec.cleanup.interval}: end-of-conversation replies received, senders'"
                   f" conversations idle for {spec.timeouts.stalled_after} ended, conversations with no"
                   " message left ended WITH CLEANUP, 500 of each kind per run")  # fmt: skip
    elif spec.backend == "cassandra":
        what = "nothing to do: Cassandra compacts queue tables on its own"
    elif spec.backend == "postgres":
        what = (f"VACUUM a table when dead rows pass {t.dead_tuple_percent}%, REINDEX"
                f"{' CONCURRENTLY' if r.online else ''} an index when its bloat passes {t.fragmentation_percent}%")  # fmt: skip
    else:
        what = (f"REORGANIZE an index past 5% fragmentation, REBUILD{' ONLINE' if r.online else ''} it past"
                f" {t.fragmentation_percent}%")  # fmt: skip
    upcoming = f"; next at {next_run.astimezone(zone):%Y-%m-%d %H:%M %Z}" if next_run else ""
    return ScheduleStatus(
        statistics=f"measured every {spec.stats.interval}, history kept {spec.stats.retention}",
        cleanup=cleanup,
        maintenance=f"{describe_cron(r.schedule)} ({zone.key}, cron '{r.schedule}'): {what}{upcoming}",
        checks=describe_checks(spec) if spec.design == "servicebroker" else None,
    )


def describe_checks(spec: QueueSpec) -> str:
    """A Service Broker queue's health checks in words, run with every statistics measurement."""
    sb = spec.service_broker
    poison = "re-enabled by dbq" if sb.re_enable_on_poison else "reported, not re-enabled"
    parts = [
        f"every {spec.stats.interval}: broker enabled and its GUID unique",
        f"queue receiving (when poison-message detection disables it: {poison})",
    ]
    if sb.activation:
        parts.append(
            f"activation of {sb.activation.procedure} on with its procedure present, queue monitor not"
            f" NOTIFIED over {sb.checks.notified_after} with no task waiting"
        )
    parts += [
        "no errors in sys.transmission_queue",
        f"at most {sb.checks.open_conversations} open conversations",
    ]
    return "; ".join(parts)
