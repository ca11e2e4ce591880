"""The Queue's status as pydantic models: what the controller writes, field for field.

The CRD's status schema is generated from `QueueStatus` (`dbq.api.crd`), so `kubectl explain
queue.status` describes every field. The controller builds these models and writes their
`wire()` form; it writes no status field that is not declared here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dbq.api.models import Model


class Condition(Model):
    type: str = Field(
        description="Ready, Reconciling, Stalled, Provisioned, Degraded, DeletionBlocked or Paused."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="Why, in one word (docs: reference/reasons).")
    message: str = Field(default="", description="What happened and what to do, without credentials.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (UTC).")
    observed_generation: int | None = Field(
        default=None, description="The generation the condition is about."
    )


class StatsStatus(Model):
    """The latest measurement, with rolling rates (written when a figure changes, or every 5 min)."""

    depth: int = Field(description="Messages ready to be taken.")
    in_flight: int = Field(description="Messages leased and not yet acknowledged.")
    pushed: int = Field(description="Messages pushed since the queue was created.")
    popped: int = Field(description="Messages popped (at-most-once) since creation.")
    acquired: int = Field(description="Messages acquired (leased) since creation.")
    expired: int = Field(description="Messages that expired unread since creation.")
    push_rate: float = Field(description="Pushes per second over the rate window.")
    pop_rate: float = Field(description="Pops and acquires per second over the rate window.")
    oldest_message_age_seconds: float = Field(description="Age of the oldest ready message.")
    dead_letters: int = Field(default=0, description="Dead letters held (spec.deadLetter).")
    delayed: int = Field(default=0, description="Messages pushed or nacked with a delay, not due yet.")
    archived: int = Field(
        default=0, description="Acked and popped messages kept in the archive (spec.archive)."
    )
    measured_at: str = Field(description="When the figures were measured (UTC).")


class CleanupStatus(Model):
    last_run: str = Field(description="When cleanup last ran (UTC).")
    last_result: dict[str, int] = Field(description="What the last run repaired or removed, by kind.")
    repaired_total: int = Field(default=0, description="Repairs since the queue was created.")
    last_repair_at: str | None = Field(default=None, description="When something was last repaired.")


class MaintenanceStatus(Model):
    """The planned window, and the result of the last run once one ran."""

    next_run: str = Field(description="The next maintenance window (UTC).")
    cron: str = Field(description="The schedule the window was planned from.")
    last_run: str | None = Field(default=None, description="When the last run started (UTC).")
    result: Literal["Succeeded", "NotNeeded", "Skipped", "Failed"] | None = Field(
        default=None, description="How the last run ended."
    )
    message: str | None = Field(default=None, description="The last run in words.")
    actions: list[str] | None = Field(default=None, description="The statements the last run executed.")
    before: dict[str, float] | None = Field(default=None, description="Measured figures before the run.")
    after: dict[str, float] | None = Field(default=None, description="Measured figures after the run.")
    duration_seconds: float | None = Field(default=None, description="How long the last run took.")


class ScheduleStatus(Model):
    """Every schedule and threshold in words (`kubectl describe queue`)."""

    statistics: str = Field(description="When statistics are measured and how long they are kept.")
    cleanup: str = Field(description="When cleanup runs and what it repairs.")
    maintenance: str = Field(description="The maintenance window, its thresholds and the next run.")
    checks: str | None = Field(
        default=None, description="Service Broker: the health checks, written as conditions."
    )


class RingStatus(Model):
    """What spec.ring.autoGrow did to the ring."""

    grown_to: int | None = Field(
        default=None,
        description="The slots spec.ring.autoGrow grew the ring to (the ring's size while above spec.ring.size).",
    )


class QueueStatus(Model):
    observed_generation: int | None = Field(default=None, description="The last generation reconciled.")
    schema_version: int | None = Field(default=None, description="Version of the objects dbq created.")
    queue_name: str | None = Field(default=None, description="Name of the queue's database objects.")
    endpoint: str | None = Field(
        default=None, description="host:port/database of the queue, never credentials."
    )
    conditions: list[Condition] | None = Field(default=None, description="kstatus conditions (Ready first).")
    operator_login_sessions: int | None = Field(
        default=None,
        description="PostgreSQL: sessions of dbq's client (applications, Spark jobs) logged in to the queue's"
        " database with the Queue's Secret, the operator's login, at the last check; each should use a"
        " QueueUser's Secret instead (an AdminSecretInUse Event when they appear).",
    )
    stats: StatsStatus | None = None
    ring: RingStatus | None = None
    cleanup: CleanupStatus | None = Field(default=None, description="The last cleanup and its totals.")
    maintenance: MaintenanceStatus | None = None
    schedule: ScheduleStatus | None = None
