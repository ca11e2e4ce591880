"""kopf handlers: thin wrappers that call the generic reconcile, deletion and upkeep, and write
what they return. Kubernetes reads go through `dbq.kube`, settings come from `dbq.settings`."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from dbq.api.crd import DEAD_LETTER_QUEUE_FIELD, field_selector
from dbq.api.durations import seconds
from dbq.api.models import GROUP, PLURAL, VERSION
from dbq.backends.base import QueueBackend
from dbq.backends.odbc_ring import CatalogDigests, OdbcRing, catalog_digests, record_samples
from dbq.client import QueueStats
from dbq.connection import pool
from dbq.controller import conditions as cond
from dbq.controller import fleet, leadership, metrics, upkeep
from dbq.controller.reconcile import (
    FORCE_DELETE,
    Event,
    Outcome,
    dead_letters_kept_by,
    delete,
    lazy_backend,
    not_ready,
    reconcile,
    status_changes,
)
from dbq.controller.topics import TopicSync
from dbq.controller.upkeep import due
from dbq.errors import DbqError, QueueNotFound
from dbq.kube import Kube
from dbq.settings import OperatorSettings

FINALIZER = "dbq.dev/finalizer"
PAUSED = fleet.PAUSED
SETTINGS = OperatorSettings.from_env()
log = logging.getLogger("dbq")
_kube: Kube | None = None


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


# Secrets read in the last SECRET_TTL_S, by namespace and name: a thousand queues of one
# database do not read its Secret on every tick. A missing Secret is not kept, and any failed
# tick forgets them all, so a fixed or rotated Secret is seen at the next try.
SECRET_TTL_S = 30.0
_secrets: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}


def read_secret(namespace: str, name: str) -> dict[str, Any] | None:
    now = time.monotonic()
    kept = _secrets.get((namespace, name))
    if kept is not None and now - kept[0] < SECRET_TTL_S:
        return kept[1]
    data = kube().read_secret(namespace, name)
    if data is not None:
        _secrets[(namespace, name)] = (now, data)
    return data


def read_queue(namespace: str, name: str) -> dict[str, Any] | None:
    """The Queue resource, or None when it does not exist (spec.deadLetter.queue)."""
    try:
        return kube().get_queue(namespace, name)
    except QueueNotFound:
        return None


def forget_credentials() -> None:
    """After a failure: the next try reads the Secrets again and connects anew, so a fixed
    Secret is followed, and a revoked password is not hidden by sessions opened before."""
    _secrets.clear()
    lender = pool.shared()
    if lender is not None:
        lender.drop_all()


def post_event(resource: Mapping[str, Any], event: Event) -> None:
    """An Event about any of dbq's resources (a handler's own, or another it changed)."""
    kopf.event(
        kopf.Body(cast(Any, dict(resource))), type=event.type, reason=event.reason, message=event.message
    )


def not_stopping() -> None:
    """A handler kopf queued and started only after the operator was told to stop ends at once,
    its objects and finalizer untouched: its successor handles it. Thousands of deletions
    pending then no longer hold the stop up (kopf waits for every handler it has queued)."""
    if leadership.stopping.is_set():
        raise kopf.TemporaryError("the operator is stopping: its successor handles this", delay=10)


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
    settings.execution.executor = _handlers
    # A Queue deleted while one of its timers runs (an upkeep tick, a drift check) is deleted
    # once that tick ends: kopf looks again after this long (60 s by default).
    settings.background.cancellation_polling = 2.0
    pool.enable(SETTINGS.db_connections)  # the queues of one database share its connections


@kopf.on.probe(id="api")
def probe_api(**_: Any) -> str:
    return "ok"


# Events said once per queue: the status that records them is written before they are posted.
ANNOUNCED_ONCE = ("Provisioned", "Ready")


def _write(body: kopf.Body, status: Mapping[str, Any], patch: kopf.Patch, changes: dict[str, Any],
           events: list[Event]) -> None:  # fmt: skip
    leadership.fence()
    changed = status_changes(dict(status), changes)
    if changed and any(event.reason in ANNOUNCED_ONCE for event in events):
        # Now, not when the handler returns: an operator stopped between the two (a crash, a lost
        # Lease) leaves a status that says the queue was announced, so its successor does not
        # announce it again. Stopped before, it posted nothing.
        kube().patch_queue_status(body["metadata"]["namespace"], body["metadata"]["name"], changed)
        changed = {}
    for key, value in changed.items():
        patch.status[key] = value
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _reconcile(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
               patch: kopf.Patch, retry: int, drift_check: bool = False) -> Outcome | None:  # fmt: skip
    """The queue reconciled and its status written; its Outcome (None when it is paused)."""
    if annotated(meta, PAUSED):
        conditions = cond.set_condition(
            status.get("conditions"), cond.PAUSED, True, "Paused",
            f"annotation {PAUSED}=true: dbq leaves this queue alone", meta.get("generation"),
        )  # fmt: skip
        _write(
            body, status, patch, {"conditions": conditions, "observedGeneration": meta.get("generation")}, []
        )
        return None
    current = dict(status)
    first = None if drift_check else cond.reconciling(status.get("conditions"), meta.get("generation"))
    if first is not None:  # written now, not when the handler ends: GitOps tools wait on it
        seen = {"conditions": first, "observedGeneration": meta.get("generation")}
        kube().patch_queue_status(meta["namespace"], meta["name"], seen)
        current.update(seen)
    outcome = reconcile(
        meta["name"], meta["namespace"], dict(spec), meta.get("generation"), current, read_secret,
        read_queue=read_queue, drift_check=drift_check,
    )  # fmt: skip
    outcome.status["conditions"] = cond.drop_condition(outcome.status.get("conditions"), cond.PAUSED)
    if outcome.ok:  # its objects match the spec now: the next drift check is an interval away
        FLEET.tracked(meta["namespace"], meta["name"], spec).memory.drift_at = time.monotonic()
    if outcome.ok and not drift_check:
        _first_upkeep(meta, spec, {**current, **outcome.status}, outcome)
    _write(body, current, patch, outcome.status, outcome.events)
    if outcome.error is not None:
        forget_credentials()
    if outcome.error is not None and not drift_check:  # the drift check comes back by itself
        raise kopf.TemporaryError(str(outcome.error), delay=backoff(retry))
    return outcome


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def apply_queue(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                patch: kopf.Patch, retry: int, **_: Any) -> None:  # fmt: skip
    leadership.fence()
    not_stopping()
    _reconcile(body, meta, spec, status, patch, retry)


# kopf's sync handlers, at most DBQ_WORKERS at once.
_handlers = ThreadPoolExecutor(max_workers=SETTINGS.workers, thread_name_prefix="dbq-handler")
# Every Queue the watch saw, for the upkeep scheduler.
FLEET = fleet.Fleet(drift_interval_s=SETTINGS.drift_interval_s)
# A drift check of every queue of a schema whose catalog digest did not change at least this
# often: the digest does not see rows (a ring's slots deleted, say).
FULL_DRIFT_CHECK_S = 3600.0
# Groups of queues with upkeep due, at most DBQ_WORKERS at once.
_ticks = ThreadPoolExecutor(max_workers=SETTINGS.workers, thread_name_prefix="dbq-upkeep")
# Maintenance runs of every queue, at most two at once, beside the upkeep.
_maintenance = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dbq-maintenance")
_scheduler: list[asyncio.Task[None]] = []
# The context kopf runs a Queue's handlers in (its Event poster among them): the scheduler's
# workers run in copies of it, so kopf.event() works there as in a handler.
_handler_context: list[contextvars.Context] = []


@kopf.on.event(GROUP, VERSION, PLURAL)
async def saw_queue(type: str | None, body: kopf.Body, **_: Any) -> None:
    """Every Queue the watch sees feeds the upkeep scheduler: after a restart, the first listing
    rebuilds it."""
    if not _handler_context:
        _handler_context.append(contextvars.copy_context())
    if type == "DELETED":
        FLEET.forget(body["metadata"]["namespace"], body["metadata"]["name"])
    else:
        FLEET.saw(dict(body))


@kopf.on.startup()
async def start_upkeep(**_: Any) -> None:
    _scheduler.append(asyncio.create_task(_schedule_upkeep(), name="dbq-upkeep-scheduler"))


@kopf.on.cleanup()
async def stop_upkeep(**_: Any) -> None:
    for task in _scheduler:
        task.cancel()
    _scheduler.clear()


async def _schedule_upkeep() -> None:
    """Statistics, cleanup and maintenance of every provisioned Queue, each when its schedule
    from the spec is due: every DBQ_UPKEEP_TICK seconds, the groups with something due go to a
    pool of DBQ_WORKERS threads (a group still running is left to the next tick). Deciding
    what is due touches neither the Secret nor the database."""
    loop = asyncio.get_running_loop()
    busy: set[tuple[str, ...]] = set()
    while True:
        await asyncio.sleep(SETTINGS.upkeep_tick_s)
        leadership.fence()
        groups = await loop.run_in_executor(_ticks, functools.partial(FLEET.due, busy=frozenset(busy)))
        for group in groups:
            busy.add(group.key)
            context = _handler_context[0].copy() if _handler_context else contextvars.copy_context()
            work = functools.partial(context.run, _upkeep_group, group)
            done = loop.run_in_executor(_ticks, work)
            done.add_done_callback(functools.partial(_ended, busy, group.key))


def _ended(busy: set[tuple[str, ...]], key: tuple[str, ...], done: asyncio.Future[None]) -> None:
    busy.discard(key)
    if not done.cancelled() and done.exception() is not None:
        log.error("upkeep of %s failed", "/".join(key), exc_info=done.exception())


def _upkeep_group(group: fleet.Group) -> None:
    """The upkeep of a group of queues, one after the other on one connection at a time; the
    statistics of a batched group measured together first."""
    if leadership.stopping.is_set():
        return
    now, wall = time.monotonic(), datetime.now(UTC)
    measured = _measure_together(group.queues, now, wall) if group.batched else {}
    for entry in group.queues:
        if entry.kept_up():
            _upkeep(entry, measured.get((entry.namespace, entry.name)), now, wall)
    drifting = [entry for entry in group.queues if due(entry.memory.drift_at, SETTINGS.drift_interval_s, now)]
    if drifting:
        _check_drift(group, drifting, now)


def _check_drift(group: fleet.Group, entries: list[fleet.Tracked], now: float) -> None:
    """Objects dropped or changed behind the operator's back made again; status written only
    when something changed. A queue of a batched group is compared with its spec only when its
    catalog digest changed since a check found it whole (and hourly): a neighbour made or
    dropped in its schema leaves it alone."""
    digests = _digests(group, entries[0], now) if group.batched else None
    for entry in entries:
        if not (entry.kept_up() or entry.pause_changed()):
            continue
        digest = digests.of(entry.queue_name() or "") if digests is not None else None
        whole = entry.memory.whole
        if (
            digest is not None
            and whole is not None
            and whole[0] == digest
            and now - whole[1] < FULL_DRIFT_CHECK_S
        ):
            entry.memory.drift_at = now
            continue
        patch, body = kopf.Patch(), kopf.Body(cast(Any, entry.body))
        outcome = _reconcile(body, body.meta, body.spec, body.status, patch, retry=0, drift_check=True)
        _write_now(entry, dict(patch.status or {}), [])
        entry.memory.drift_at = now
        clean = digest is not None and outcome is not None and outcome.ok and not outcome.steps
        entry.memory.whole = (digest, now) if clean and digest is not None else None


def _digests(group: fleet.Group, entry: fleet.Tracked, now: float) -> CatalogDigests | None:
    """The catalog digests of the group's schema, read at most every half drift interval (the
    queues of a schema come due at different ticks), and kept while the database's catalog
    change counters stay as they were; None when they cannot be read (each check then reports
    its own error)."""
    kept = FLEET.digests.get(group.key)
    if kept is not None and now - kept[1] < SETTINGS.drift_interval_s / 2:
        return kept[0]
    try:
        ring = cast(OdbcRing, entry.backend(read_secret))
        try:
            digests = catalog_digests(ring, kept[0] if kept is not None else None)
        finally:
            ring.close()
    except DbqError:
        return None
    if digests is not None:
        FLEET.digests[group.key] = (digests, now)
    return digests


def _measure_together(
    entries: list[fleet.Tracked], now: float, wall: datetime
) -> dict[tuple[str, str], QueueStats]:
    """The statistics of the queues (PostgreSQL rings of one schema) whose statistics are due,
    measured and recorded together; those whose own upkeep must measure them (an error, or a
    queue whose backend cannot be made) are left out. The positions of all are read first: an
    empty queue whose positions did not move keeps its last statistics, unmeasured."""
    measuring: list[tuple[fleet.Tracked, OdbcRing]] = []
    for entry in entries:
        try:
            if upkeep.what_is_due(entry.spec(), entry.status, entry.memory, now, wall).stats:
                measuring.append((entry, cast(OdbcRing, entry.backend(read_secret))))
        except DbqError:
            continue  # its own upkeep reports it
    if not measuring:
        return {}
    rings = [ring for _, ring in measuring]
    try:
        results = upkeep.measure_together(rings, [entry.memory for entry, _ in measuring], now)
        ok = [(entry, ring, stats) for (entry, ring), stats in zip(measuring, results, strict=True)
              if isinstance(stats, QueueStats)]  # fmt: skip
        if ok:
            purge = [(ring, seconds(entry.spec().stats.retention)) for entry, ring, _ in ok
                     if upkeep.history_due(entry.memory, now)]  # fmt: skip
            record_samples([ring for _, ring, _ in ok], [stats for _, _, stats in ok], purge)
    except DbqError as e:
        log.info("statistics of %d queues measured one by one: %s", len(rings), e)
        return {}
    finally:
        for ring in rings:  # the statements ran on one of them (closing the others costs nothing)
            ring.close()
    return {(entry.namespace, entry.name): stats for entry, _, stats in ok}


def _upkeep(entry: fleet.Tracked, measured: QueueStats | None, now: float, wall: datetime) -> None:
    namespace, name, status = entry.namespace, entry.name, entry.status
    log.debug("upkeep tick of queue %s/%s", namespace, name)
    opened: list[QueueBackend] = []

    def backend() -> QueueBackend:
        if not opened:
            opened.append(entry.backend(read_secret))
        return opened[0]

    try:
        done = upkeep.run_upkeep(namespace, name, entry.spec(), status, backend, entry.memory, now=now, wall=wall,
                                 background=_maintenance, measured=measured)  # fmt: skip
    except DbqError as e:  # Ready=False at once, one Warning when that changes
        entry.memory.database.failed_at = time.monotonic()  # the database's other queues check too
        forget_credentials()
        failed = not_ready(status.get("conditions"), e, entry.generation)
        if failed.events:
            log.warning("queue %s/%s is not ready: %s: %s", namespace, name, e.reason, e)
        metrics.set_ready(namespace, name, False)
        _write_now(entry, failed.status, failed.events)
        return
    finally:
        for opened_backend in opened:
            opened_backend.close()
    _write_now(entry, done.status, done.events)
    if done.checked and not cond.is_true(status.get("conditions"), cond.READY):  # the database is back
        _check_drift(fleet.Group((namespace, name), [entry], False), [entry], now)


def _write_now(entry: fleet.Tracked, changes: Mapping[str, Any], events: list[Event]) -> None:
    """Status changes and Events of a queue's upkeep, written at once (no kopf handler runs)."""
    leadership.fence()
    changed = status_changes(entry.status, dict(changes))
    if changed:
        kube().patch_queue_status(entry.namespace, entry.name, changed)
        FLEET.wrote(entry.namespace, entry.name, changed)
    for event in events:
        post_event(entry.body, event)


def _run_upkeep(meta: kopf.Meta, spec: kopf.Spec, status: dict[str, Any], memory: upkeep.Memory,
                health_check: bool = True) -> upkeep.Upkeep:  # fmt: skip
    """The queue's upkeep on its backend (opened only when something due needs it); raises DbqError."""
    name, namespace = meta["name"], meta["namespace"]
    parsed = memory.spec(meta.get("generation"), dict(spec))
    with lazy_backend(name, namespace, parsed, read_secret) as backend:
        return upkeep.run_upkeep(namespace, name, parsed, status, backend, memory, background=_maintenance,
                                 health_check=health_check)  # fmt: skip


def _first_upkeep(meta: kopf.Meta, spec: kopf.Spec, status: dict[str, Any], outcome: Outcome) -> None:
    """The first statistics, cleanup and schedule of a queue just provisioned (or of one this
    operator has not measured yet), written with Ready in one status patch: an API write less per
    queue, and its figures show at once. On failure the upkeep scheduler tries again. A queue
    created empty has its first cleanup one interval later: there is nothing to repair yet."""
    memory = FLEET.tracked(meta["namespace"], meta["name"], spec).memory
    if memory.stats_at:
        return
    if outcome.created:
        memory.created(time.monotonic())
    try:
        done = _run_upkeep(meta, spec, status, memory, health_check=False)
    except DbqError as e:
        log.info(
            "queue %s/%s: its first upkeep is left to the scheduler: %s", meta["namespace"], meta["name"], e
        )
        return
    outcome.status.update(done.status)
    outcome.events += done.events


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_queue(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                 patch: kopf.Patch, retry: int, **_: Any) -> None:  # fmt: skip
    leadership.fence()
    not_stopping()
    name, namespace = meta["name"], meta["namespace"]
    _unroute(namespace, name, retry)
    # The API server selects them from its cache: listing every Queue of the namespace made a
    # deletion's cost grow with the fleet.
    named = kube().list_queues(namespace, field_selector=field_selector(DEAD_LETTER_QUEUE_FIELD, name))
    users = sorted(
        q["metadata"]["name"] for q in named if dead_letters_kept_by(q["metadata"]["name"], q["spec"]) == name
    )
    outcome = delete(name, namespace, dict(spec), meta.get("generation"), dict(status), read_secret,
                     force=annotated(meta, FORCE_DELETE), dead_letter_users=users)  # fmt: skip
    _write(body, status, patch, outcome.status, outcome.events)
    if outcome.error is not None:
        delay = min(60.0, backoff(retry)) if outcome.status else backoff(retry)
        raise kopf.TemporaryError(str(outcome.error), delay=delay)
    metrics.forget(namespace, name)
    FLEET.forget(namespace, name)


def _unroute(namespace: str, queue: str, retry: int) -> None:
    """Topics that route to the queue route to it no more (its Subscriptions go not Ready) before
    its objects are dropped: a publish routine that pushed into a dropped queue would fail."""
    sync = TopicSync(kube(), read_secret, post_event)
    for topic in sync.topics_of_queue(namespace, queue):
        synced = sync.sync(namespace, topic)
        if synced.error is not None:
            raise kopf.TemporaryError(
                f"topic {topic} still routes to this queue and cannot be changed: {synced.error}",
                delay=backoff(retry),
            )


def finish_running(timeout: float) -> bool:
    """Once kopf stopped: wait up to `timeout` for handlers, ticks and maintenance still running
    in their threads; whether all ended (leader election releases the Lease only then)."""
    return leadership.drain({"dbq-handler": _handlers, "dbq-upkeep": _ticks, "dbq-maintenance": _maintenance},
                            timeout)  # fmt: skip
