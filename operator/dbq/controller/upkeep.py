"""Statistics, cleanup and maintenance of a provisioned queue, each on its schedule from the spec.

No kopf and no Kubernetes client here: `run_upkeep` takes a way to open the backend and what the
operator remembers of earlier runs, and returns the status patch and events. A pure
`what_is_due` decides first, so a tick with nothing due touches neither the Secret nor the
database; pure helpers compute rolling rates from the history table and say when status is
worth writing.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from croniter import croniter

from dbq.api.durations import seconds
from dbq.api.models import QueueSpec
from dbq.api.status import CleanupStatus, MaintenanceStatus, RingStatus, StatsStatus
from dbq.backends.base import Earlier, QueueBackend
from dbq.backends.maintenance import MaintenanceResult
from dbq.backends.odbc_ring import OdbcRing, measure_many, positions_of
from dbq.client import QueueStats
from dbq.controller import autogrow, metrics
from dbq.controller import conditions as cond
from dbq.controller.reconcile import Event, health, resize_started
from dbq.controller.schedule import describe
from dbq.errors import DbqError
from dbq.resource import parse_spec
from dbq.settings import time_zone

# status.stats is rewritten when a figure changed, or at least this often (a heartbeat): an idle
# queue costs the API server two writes an hour, and Prometheus has the fresh figures.
STATS_HEARTBEAT_S = 3600.0
# How often a database is asked, on a new connection, whether it answers and takes the Secret's
# credentials (pooled sessions would hide a revoked password): so Ready turns False within a
# tick or two of an outage, and True again as soon as it ends. One queue's tick asks for all.
HEALTH_INTERVAL_S = 5.0
# The history table's samples past the retention are removed this often (not on every tick).
HISTORY_PURGE_S = 600.0
# An empty queue whose positions did not move keeps its last statistics (`Memory.unchanged`),
# and is measured in full again at least this often.
QUIET_REFRESH_S = 600.0
# Repairs worth an Event, per design; the other counts are routine housekeeping.
REPAIRS = ("expiredLeases", "orphans", "holes", "finishedPipes", "rolledBack", "stalledConversations",
           "cleanedConversations")  # fmt: skip


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_window(cron: str, after: datetime) -> datetime:
    return croniter(cron, after.astimezone(time_zone())).get_next(datetime)


def rate_window_s(spec: QueueSpec) -> float:
    """Rates are averaged over four stats intervals, and at least 20 s."""
    return max(4 * seconds(spec.stats.interval), 20.0)


@dataclass
class DatabaseMemory:
    """What the operator remembers of one database, shared by its queues: so that one health
    check every HEALTH_INTERVAL_S serves them all, not one per queue."""

    checked_at: float = 0.0  # monotonic: when a queue's tick last connected to it anew
    failed_at: float = 0.0  # ...and when a queue's tick last failed (then each checks for itself)

    def check_due(self, now: float) -> bool:
        """Whether the database needs asking: not asked lately, or a tick failed since."""
        return due(self.checked_at, HEALTH_INTERVAL_S, now) or self.failed_at > self.checked_at


@dataclass
class Memory:
    """What the operator remembers of one queue between ticks (lost on restart: then both run)."""

    stats_at: float = 0.0  # monotonic
    cleanup_at: float = 0.0
    stats_written_at: float = 0.0
    cleanup_written_at: float = 0.0
    # A maintenance run under way in the background: its status and Event when it ends.
    maintenance: Future[tuple[dict[str, Any], Event]] | None = None
    parsed: tuple[int | None, QueueSpec] | None = None  # the spec of that generation, parsed
    database: DatabaseMemory = field(default_factory=DatabaseMemory)  # shared with its database's queues
    # The samples this operator recorded in the history table lately: (monotonic, pushed, taken),
    # oldest first. It holds every sample taken since `samples_cover` (0: none recorded yet).
    samples: deque[tuple[float, int, int]] = field(default_factory=deque)
    samples_cover: float = 0.0  # -inf: since the queue was created
    history_purged_at: float = 0.0
    drift_at: float = 0.0  # when its objects were last compared with the spec (or provisioned)
    # The digest of its schema's catalog when a drift check last found it whole, and when.
    whole: tuple[str, float] | None = None
    # The queue at rest: its last statistics, when its counters last moved (or were first
    # seen), and when the last cleanup since then ran, if it found nothing to do.
    last_stats: QueueStats | None = None
    moved_at: float = 0.0
    found_nothing_at: float = 0.0
    # spec.ring.autoGrow: samples in a row above its threshold, and whether it could not grow.
    full_samples: int = 0
    grow_blocked: bool = False
    # An empty queue: its positions (`dbq.contract.ring.quiet_sequences`) read just before
    # `last_stats` were measured in full, and when.
    quiet: tuple[tuple[int, ...], float] | None = None
    sequences: tuple[int, ...] | None = None  # the oids of those sequences, once read
    flow: tuple[float, float] | None = None  # the rates the last full tick published

    def spec(self, generation: int | None, raw: dict[str, Any]) -> QueueSpec:
        """The parsed spec, parsed again only when its generation changed: a tick with nothing
        due parses nothing."""
        if self.parsed is None or self.parsed[0] != generation:
            self.parsed = (generation, parse_spec(raw))
        return self.parsed[1]

    def created(self, now: float) -> None:
        """The queue was created empty just now: its first cleanup is due one interval later
        and writes status.cleanup once it repairs something or the heartbeat is due (there is
        nothing to repair yet), and the history table holds no sample of it to read or purge
        (every one there will be is one this operator records)."""
        self.cleanup_at = self.cleanup_written_at = now
        self.history_purged_at = now
        self.samples_cover = -math.inf

    def remembers(self, window_s: float, now: float) -> bool:
        """Whether `sample_since` answers as the history table would: no sample of the window
        can be one this operator did not record (one taken before it started, say)."""
        return self.samples_cover != 0.0 and self.samples_cover <= now - window_s

    def sample_since(self, window_s: float, now: float) -> Earlier | None:
        """The oldest remembered sample at most `window_s` old (as `QueueBackend.sample_since`)."""
        for at, pushed, taken in self.samples:
            if at >= now - window_s:
                return Earlier(now - at, pushed, taken)
        return None

    def saw_stats(self, stats: QueueStats, now: float) -> None:
        """Statistics just measured: a change of any counter ends the queue's rest."""
        if self.last_stats is None or counters(self.last_stats) != counters(stats):
            self.moved_at, self.found_nothing_at = now, 0.0
        self.last_stats = stats

    def measured(self, positions: tuple[int, ...] | None, stats: QueueStats, now: float) -> None:
        """Statistics measured in full, just after its positions were read (None: not read)."""
        empty = not (stats.depth or stats.in_flight or stats.delayed)
        self.quiet = (positions, now) if positions is not None and empty else None

    def unchanged(self, positions: tuple[int, ...] | None, now: float) -> QueueStats | None:
        """The statistics of a queue measured empty whose positions have not moved since: the
        last ones, as a full measurement would find them (nothing arrives, leaves or is
        redriven or purged without moving one); None when it must be measured in full."""
        if positions is None or self.quiet is None or self.last_stats is None:
            return None
        kept, at = self.quiet
        return self.last_stats if kept == positions and now - at < QUIET_REFRESH_S else None

    def at_rest(self, stalled_after_s: float) -> bool:
        """Whether a cleanup now would find nothing: the queue holds no message (none ready,
        leased, delayed or archived, so no lease or time to live can end and nothing ages into
        a repair), and a cleanup that found nothing ran at least `stalled_after_s` after its
        counters last moved (so a hole or orphan left by that last move was old enough to be
        repaired then), or it was never used (`untouched`). A move ends it (`saw_stats`)."""
        s = self.last_stats
        return (
            s is not None
            and not (s.depth or s.in_flight or s.delayed or s.archived)
            and (self.found_nothing_at >= self.moved_at + stalled_after_s or self.untouched())
        )

    def untouched(self) -> bool:
        """Never used since it was made: its positions, read when it was last measured empty,
        were all at their start and every counter is at zero. No position was ever drawn and
        nothing taken, so a cleanup has nothing to repair (a queue just created rests at once)."""
        s = self.last_stats
        return self.quiet is not None and not any(self.quiet[0]) and s is not None and not any(counters(s))

    def remember_sample(self, stats: QueueStats, now: float, window_s: float) -> None:
        """A sample recorded in the history table; those older than the window are let go."""
        self.samples.append((now, stats.pushed, stats.taken))
        self.samples_cover = self.samples_cover or now
        while self.samples and self.samples[0][0] < now - window_s:
            self.samples.popleft()
            self.samples_cover = max(self.samples_cover, now - window_s)


@dataclass
class Upkeep:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    checked: bool = False  # a new connection to the database answered, so its credentials hold


def measure_together(
    rings: Sequence[OdbcRing], memories: Sequence[Memory], now: float
) -> list[QueueStats | DbqError]:
    """The statistics of rings of one database, in order, on one connection (the caller closes
    the rings): the positions of all first, then in full only the rings not measured empty or
    whose positions moved since (`Memory.unchanged`). An idle queue costs four sequences read."""
    read = positions_of(rings, [memory.sequences for memory in memories])
    for memory, at in zip(memories, read, strict=True):
        memory.sequences = at.oids if at is not None else None  # a failed read names them again
    positions = [at.values if at is not None else None for at in read]
    kept = [memory.unchanged(at, now) for memory, at in zip(memories, positions, strict=True)]
    moved = [i for i, stats in enumerate(kept) if stats is None]
    measured = dict(zip(moved, measure_many([rings[i] for i in moved]) if moved else [], strict=True))
    out: list[QueueStats | DbqError] = []
    for i, stats in enumerate(kept):
        if stats is not None:
            out.append(stats)
            continue
        result = measured[i]
        if isinstance(result, QueueStats):
            memories[i].measured(positions[i], result, now)
        out.append(result)
    return out


def due(last: float, interval_s: float, now: float) -> bool:
    return last == 0.0 or now - last >= interval_s


def counters(stats: QueueStats) -> tuple[int, ...]:
    """What moves when anything happens to a queue (the oldest message's age moves by itself)."""
    return (stats.depth, stats.in_flight, stats.pushed, stats.popped, stats.acquired, stats.expired,
            stats.dead, stats.delayed, stats.archived)  # fmt: skip


def history_due(memory: Memory, now: float) -> bool:
    """Whether the queue's samples past the retention are to be removed with this sample."""
    return due(memory.history_purged_at, HISTORY_PURGE_S, now)


def rates(stats: QueueStats, earlier: Earlier | None) -> tuple[float, float] | None:
    """(pushes/s, takes/s) since `earlier`; None without a sample old enough to divide by."""
    if earlier is None or earlier.age_s < 1.0:
        return None
    return (
        max(stats.pushed - earlier.pushed, 0) / earlier.age_s,
        max(stats.taken - earlier.taken, 0) / earlier.age_s,
    )


def stats_status(stats: QueueStats, measured: tuple[float, float] | None, at: datetime) -> dict[str, Any]:
    push_rate, pop_rate = measured or (0.0, 0.0)
    return StatsStatus(
        depth=stats.depth,
        in_flight=stats.in_flight,
        pushed=stats.pushed,
        popped=stats.popped,
        acquired=stats.acquired,
        expired=stats.expired,
        push_rate=round(push_rate, 1),
        pop_rate=round(pop_rate, 1),
        oldest_message_age_seconds=round(stats.oldest_age_seconds, 1),
        dead_letters=stats.dead,
        delayed=stats.delayed,
        archived=stats.archived,
        measured_at=stamp(at),
    ).wire()


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


def cleanup_worth_writing(counts: dict[str, int], last_write: float, now: float) -> bool:
    """Something was repaired or housekept, or this operator wrote nothing yet, or the heartbeat
    is due: so status.cleanup.lastRun is at most STATS_HEARTBEAT_S old, without an API write per
    run. (A queue created empty counts from its creation: `Memory.created`.)"""
    return any(counts.values()) or last_write == 0.0 or now - last_write >= STATS_HEARTBEAT_S


def cleanup_message(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing to repair"


@functools.lru_cache(maxsize=4096)  # every queue's planned window, read on every tick
def parse_stamp(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


Task = Literal["run", "plan", "wait"]


def maintenance_due(spec: QueueSpec, status: dict[str, Any], wall: datetime) -> tuple[Task, datetime]:
    """("run" | "plan" | "wait", the window). A queue without a planned window, or whose
    schedule changed, gets the next one planned ("plan")."""
    planned = status.get("maintenance") or {}
    if not planned.get("nextRun") or planned.get("cron") != spec.reindex.schedule:
        return "plan", next_window(spec.reindex.schedule, wall)
    when = parse_stamp(planned["nextRun"])
    return ("run" if wall >= when else "wait"), when


@dataclass(frozen=True)
class Due:
    """What a tick has to do, decided before anything is opened."""

    stats: bool
    cleanup: bool
    health: bool  # the database was not asked anew for a while, or a tick failed since
    maintenance: Task
    window: datetime  # the planned maintenance window
    drift: bool = False  # its objects are to be compared with the spec

    @property
    def touches_database(self) -> bool:
        return self.stats or self.cleanup or self.health or self.drift or self.maintenance == "run"


def what_is_due(spec: QueueSpec, status: dict[str, Any], memory: Memory, now: float, wall: datetime,
                drift_interval_s: float | None = None) -> Due:  # fmt: skip
    maintenance, window = maintenance_due(spec, status, wall)
    stats = due(memory.stats_at, seconds(spec.stats.interval), now)
    # A queue at rest is cleaned up on the heartbeat only: an idle fleet costs no repair calls.
    resting = memory.at_rest(seconds(spec.timeouts.stalled_after))
    every = STATS_HEARTBEAT_S if resting else seconds(spec.cleanup.interval)
    if cond.is_true(status.get("conditions"), cond.RESIZING):
        # An older ring drains: it retires within a stats interval of its last position drawn.
        every = min(every, seconds(spec.stats.interval))
    cleanup = due(memory.cleanup_at, every, now)
    drift = drift_interval_s is not None and due(memory.drift_at, drift_interval_s, now)
    return Due(stats, cleanup, memory.database.check_due(now), maintenance, window, drift)


def nothing_due(spec: QueueSpec, status: dict[str, Any], memory: Memory, now: float, wall: datetime,
                drift_interval_s: float | None = None) -> bool:  # fmt: skip
    """Whether a tick has nothing to do for the queue itself: nothing due, no window to plan, no
    finished maintenance to report. The health check of its database is left out: one queue a
    database runs it (`dbq.controller.fleet.Fleet.due`). Decided without the database, the
    Secret or a thread."""
    if memory.maintenance is not None and memory.maintenance.done():
        return False
    todo = what_is_due(spec, status, memory, now, wall, drift_interval_s)
    return not (todo.stats or todo.cleanup or todo.drift) and todo.maintenance == "wait"


def maintenance_status(
    result: MaintenanceResult, spec: QueueSpec, wall: datetime, after: datetime
) -> dict[str, Any]:
    return MaintenanceStatus(
        next_run=stamp(after),
        cron=spec.reindex.schedule,
        last_run=stamp(wall),
        result=result.result,  # type: ignore[arg-type]
        message=result.message,
        actions=[f"{s.action} {s.target}" for s in result.steps],
        before={k: round(v, 1) for k, v in result.before.items()},
        after={k: round(v, 1) for k, v in result.after.items()},
        duration_seconds=round(result.seconds, 2),
    ).wire()


def run_maintenance(spec: QueueSpec, backend: QueueBackend, wall: datetime) -> tuple[dict[str, Any], Event]:
    t = spec.reindex.threshold
    started = time.monotonic()
    try:
        result: MaintenanceResult = backend.maintain(t.dead_tuple_percent, t.fragmentation_percent,
                                                     spec.reindex.online)  # fmt: skip
    except DbqError as e:  # reported; the next window tries again
        result = MaintenanceResult("Failed", str(e), seconds=time.monotonic() - started)
    after = next_window(spec.reindex.schedule, max(wall, datetime.now(UTC)))
    kind, reason = {
        "Succeeded": ("Normal", "Maintained"),
        "NotNeeded": ("Normal", "MaintenanceNotNeeded"),
        "Skipped": ("Warning", "MaintenanceSkipped"),
    }.get(result.result, ("Warning", "MaintenanceFailed"))
    status = maintenance_status(result, spec, wall, after)
    return status, Event(kind, reason, f"{result.message} (next window {stamp(after)})")


def run_upkeep(
    namespace: str,
    name: str,
    spec: QueueSpec,
    status: dict[str, Any],
    backend: Callable[[], QueueBackend],
    memory: Memory,
    now: float | None = None,
    wall: datetime | None = None,
    background: Executor | None = None,
    health_check: bool = True,
    measured: QueueStats | None = None,
) -> Upkeep:
    """Measure, clean up and maintain the queue when each is due. `backend` opens (or returns)
    the queue's backend, and is called only when something due needs the database. DbqError from
    stats or cleanup propagates to the caller; a failed maintenance is reported in status.

    With `background`, a maintenance run goes there (it opens a connection of its own, so it
    outlives the tick's backend) and the ticks go on: a long REINDEX delays neither this queue's
    statistics nor another's. The tick after it ends writes its status and Event.

    Without `health_check` the database's health check waits for the next tick that finds it due
    (the first upkeep, run with provisioning: a check then would put the next one a whole tick
    past HEALTH_INTERVAL_S).

    With `measured`, the caller measured the queue's statistics and recorded the sample (and
    purged the history when `history_due` says so) with those of other queues of its database
    (`dbq.controller.fleet`): the backend is not asked for them again."""
    now = time.monotonic() if now is None else now
    wall = datetime.now(UTC) if wall is None else wall
    todo = what_is_due(spec, status, memory, now, wall)
    out = Upkeep()
    if _sampled_only(spec, todo, memory, measured, now, health_check):
        return out
    next_run = todo.window
    ran = None
    if memory.maintenance is not None:
        if memory.maintenance.done():
            ran, memory.maintenance = memory.maintenance.result(), None
    elif todo.maintenance == "run" and background is not None:
        memory.maintenance = background.submit(run_maintenance, spec, backend(), wall)
    elif todo.maintenance == "run":
        ran = run_maintenance(spec, backend(), wall)
    if ran is not None:
        out.status["maintenance"], event = ran
        out.events.append(event)
        next_run = parse_stamp(out.status["maintenance"]["nextRun"])
    elif todo.maintenance == "plan":
        planned = {"nextRun": stamp(next_run), "cron": spec.reindex.schedule}
        out.status["maintenance"] = MaintenanceStatus.model_validate(
            {**(status.get("maintenance") or {}), **planned}
        ).wire()
    if todo.health and health_check:
        backend().ping()
        memory.database.checked_at = now
        out.checked = True
    schedule = describe(spec, next_run).wire()
    if status.get("schedule") != schedule:
        out.status["schedule"] = schedule
    if todo.stats:
        stats = backend().measure() if measured is None else measured
        window = rate_window_s(spec)
        earlier = (
            memory.sample_since(window, now)
            if memory.remembers(window, now)
            else backend().sample_since(window)
        )
        purge = history_due(memory, now)
        if measured is None:
            backend().record_sample(stats, seconds(spec.stats.retention), purge=purge)
        memory.saw_stats(stats, now)
        memory.remember_sample(stats, now, window)
        if purge:
            memory.history_purged_at = now
        memory.stats_at = now
        flow = memory.flow = rates(stats, earlier)
        new = stats_status(stats, flow, wall)
        metrics.set_stats(namespace, name, stats, flow)
        if worth_writing(status.get("stats"), new, memory.stats_written_at, now):
            out.status["stats"] = new
            memory.stats_written_at = now
        generation = (cond.condition(status.get("conditions"), cond.READY) or {}).get("observedGeneration")
        conditions, events = health(status.get("conditions"), backend().checks(), generation)
        conditions, grown = grow_ring(
            namespace, name, spec, status, stats, backend, memory, conditions, generation
        )
        if conditions != (status.get("conditions") or []):
            out.status["conditions"] = conditions
        out.status.update(grown.status)
        out.events += events + grown.events
    if todo.cleanup:
        counts = backend().cleanup(seconds(spec.timeouts.stalled_after))
        memory.cleanup_at = now
        memory.found_nothing_at = 0.0 if any(counts.values()) else now
        if any(counts.values()):  # archived messages scavenged, say: no position moves for that
            memory.quiet = None
        metrics.count_cleanup(namespace, name, counts)
        repaired = {k: v for k, v in counts.items() if k in REPAIRS and v}
        previous = status.get("cleanup") or {}
        at = stamp(wall)
        cleanup = CleanupStatus(
            last_run=at,
            last_result=counts,
            repaired_total=int(previous.get("repairedTotal") or 0) + sum(repaired.values()),
            last_repair_at=at if repaired else previous.get("lastRepairAt"),
        )
        if cleanup_worth_writing(counts, memory.cleanup_written_at, now):
            out.status["cleanup"] = cleanup.wire()
            memory.cleanup_written_at = now
        if repaired:
            out.events.append(Event("Normal", "Repaired", f"cleanup repaired {cleanup_message(repaired)}"))
        conditions, events = resize_progress(out.status.get("conditions", status.get("conditions")), counts)
        if events or conditions != (out.status.get("conditions", status.get("conditions")) or []):
            out.status["conditions"] = conditions
        out.events += events
    return out


def _sampled_only(spec: QueueSpec, todo: Due, memory: Memory, measured: QueueStats | None, now: float,
                  health_check: bool) -> bool:  # fmt: skip
    """A tick whose only task is a sample of statistics kept unmeasured (`Memory.unchanged`)
    whose rates are the ones last published, with no heartbeat due: the sample is remembered,
    and status, metrics and conditions stay as they are (an idle fleet's tick costs no more)."""
    if not (todo.stats and measured is not None and measured is memory.last_stats):
        return False
    if (
        todo.cleanup
        or todo.maintenance != "wait"
        or memory.maintenance is not None
        or (todo.health and health_check)
    ):
        return False
    window = rate_window_s(spec)
    if now - memory.stats_written_at >= STATS_HEARTBEAT_S or not memory.remembers(window, now):
        return False
    if rates(measured, memory.sample_since(window, now)) != memory.flow:
        return False
    memory.remember_sample(measured, now, window)
    if history_due(memory, now):
        memory.history_purged_at = now
    memory.stats_at = now
    return True


def grow_ring(
    namespace: str, name: str, spec: QueueSpec, status: dict[str, Any], stats: QueueStats,
    backend: Callable[[], QueueBackend], memory: Memory, conditions: list[dict[str, Any]],
    generation: int | None,
) -> tuple[list[dict[str, Any]], Upkeep]:  # fmt: skip
    """spec.ring.autoGrow after a statistics sample: the ring grown online when it stayed nearly
    full (status.ring.grownTo, Resizing, Events), or a Warning once when it is at maxSize."""
    out = Upkeep()
    size = autogrow.ring_size(spec, status)
    growth = autogrow.decide(spec, size, stats.depth, memory.full_samples)
    memory.full_samples = growth.full_samples
    if spec.design == "ring":
        metrics.set_ring(namespace, name, size, growth.blocked)
    if growth.blocked and not memory.grow_blocked:
        out.events.append(Event("Warning", "RingFullCannotGrow", (
            f"{stats.depth} messages wait in a ring of {size} slots, above spec.ring.autoGrow.whenFullAbove, and"
            " it is at maxSize: add consumers, or raise spec.ring.autoGrow.maxSize")))  # fmt: skip
    memory.grow_blocked = growth.blocked
    if growth.to is None:
        return conditions, out
    resized = backend().resize(growth.to)
    if resized is None:  # another run is resizing it: the next sample decides again
        return conditions, out
    out.status["ring"] = RingStatus(grown_to=growth.to).wire()
    conditions, started = resize_started(conditions, resized, generation)
    out.events.append(Event("Normal", "AutoGrown", (
        f"{stats.depth} messages waited in {size} slots (above {spec.ring.auto_grow.when_full_above}%"  # type: ignore[union-attr]
        f" twice in a row): {started.message}")))  # fmt: skip
    return conditions, out


def resize_progress(
    conditions: list[dict[str, Any]] | None, counts: dict[str, int]
) -> tuple[list[dict[str, Any]], list[Event]]:
    """Resizing from a cleanup's counts: its message says what the older rings still hold while
    they drain; once none is left it turns False, with an Event."""
    before = cond.condition(conditions, cond.RESIZING)
    if before is None or before.get("status") != "True":
        return list(conditions or []), []
    generation = before.get("observedGeneration")
    draining = counts.get("generationsDraining", 0)
    if draining:
        message = (
            f"{draining} older ring(s) draining: {counts.get('resizePositionsLeft', 0)} message(s) still to"
            f" take in ring order, {counts.get('resizeLeased', 0)} leased"
        )
        reason = str(before.get("reason") or "Draining")
        new = cond.set_condition(conditions, cond.RESIZING, True, reason, message, generation)
        return new, []
    message = "the older ring drained and was dropped: one ring, of spec.ring.size"
    new = cond.set_condition(conditions, cond.RESIZING, False, "Resized", message, generation)
    return new, [Event("Normal", "Resized", message)]
