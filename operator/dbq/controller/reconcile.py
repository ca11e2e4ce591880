"""One generic reconcile and one deletion for every backend: spec + Secret -> backend ->
status and events.

No kopf and no Kubernetes client in here: the caller passes a Secret reader and applies the
returned status patch and events, so `dbq apply` runs exactly this code without a cluster.
Every failure is a `DbqError`; each sets a reason and emits a Warning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dbq.api.models import DeletionPolicy, QueueSpec, queue_name
from dbq.api.status import QueueStatus
from dbq.backends import open_backend
from dbq.backends.base import Depth, Finding, QueueBackend, Resized
from dbq.controller import conditions as cond
from dbq.controller import metrics
from dbq.controller.autogrow import with_ring_size
from dbq.controller.schedule import describe
from dbq.errors import DbqError, InvalidSpec, QueueNotFound
from dbq.resource import QueueReader, SecretReader, dead_letter_keeper, parse_spec, settings_for

FORCE_DELETE = "dbq.dev/force-delete"


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    error: DbqError | None = None
    steps: list[str] = field(default_factory=list)
    created: bool = False  # ApplyResult.created: the queue was created empty

    @property
    def ok(self) -> bool:
        return self.error is None


def backend_for(
    name: str, namespace: str, spec_raw: dict[str, Any] | QueueSpec, read_secret: SecretReader,
    read_queue: QueueReader | None = None, status: Mapping[str, Any] | None = None,
) -> tuple[QueueSpec, str, QueueBackend]:  # fmt: skip
    """`spec_raw` is parsed unless it is a QueueSpec already (the upkeep's, parsed once per
    generation). `read_queue` finds the Queue named by spec.deadLetter.queue, which planning
    needs; upkeep and deletion plan nothing (the database records where dead letters go) and
    pass none. `status` says what spec.ring.autoGrow grew the ring to (the size kept)."""
    spec = spec_raw if isinstance(spec_raw, QueueSpec) else parse_spec(spec_raw)
    spec = with_ring_size(spec, status)
    try:
        queue = queue_name(name, spec)
    except ValueError as e:
        raise InvalidSpec(str(e)) from None
    keeper = dead_letter_keeper(name, namespace, spec, read_queue) if read_queue is not None else None
    provisioned = cond.is_true((status or {}).get("conditions"), cond.PROVISIONED)
    return (
        spec,
        queue,
        open_backend(spec, queue, settings_for(spec, namespace, read_secret), keeper, provisioned),
    )


def no_queues(_namespace: str, _name: str) -> None:
    """A QueueReader that finds no Queue (no cluster to ask)."""
    return None


def reconcile(
    name: str,
    namespace: str,
    spec_raw: dict[str, Any],
    generation: int | None,
    status: dict[str, Any] | None,
    read_secret: SecretReader,
    *,
    read_queue: QueueReader = no_queues,
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
        spec, queue, backend = backend_for(name, namespace, spec_raw, read_secret, read_queue, status)
        # One observe and plan, under the queue's lock: apply returns what it had to do.
        result = backend.apply()
        out.steps = [s.done for s in result.steps]
        out.created = result.created
        if result.steps and drift_check:
            why = "; ".join(s.why for s in result.steps)
            out.events.append(Event("Warning", "Drift", f"database objects differed from the spec: {why}"))
        if result.steps:
            verb = "Repaired" if drift_check else "Provisioned"
            out.events.append(Event("Normal", verb, f"{verb.lower()} {queue}: " + "; ".join(out.steps)))
        message = f"queue {queue} ({spec.design}, {spec.backend}) matches the spec at {backend.endpoint()}"
        conditions = cond.set_condition(conditions, cond.READY, True, "Provisioned", message, generation)
        conditions = cond.set_condition(
            conditions, cond.PROVISIONED, True, "Provisioned", message, generation
        )
        conditions, checked = health(
            conditions, result.findings, generation, repaired=bool(result.steps and drift_check)
        )
        out.events += checked
        conditions = cond.settled(conditions)
        if result.resized is not None:
            conditions, announced = resize_started(conditions, result.resized, generation)
            out.events.append(announced)
        out.events += shared_login(status.get("operatorLoginSessions"), result.operator_login_sessions)
        out.status = QueueStatus.model_validate(
            {
                "conditions": conditions,
                "observedGeneration": generation,
                "schemaVersion": result.schema_version,
                "queueName": queue,
                "endpoint": backend.endpoint(),
                "operatorLoginSessions": result.operator_login_sessions,
            }
        ).wire()
        metrics.reconciled(ok=True, seconds=time.monotonic() - started)
    except DbqError as e:
        failed = not_ready(conditions, e, generation)
        out.error, out.status, out.events = e, failed.status, out.events + failed.events
        metrics.reconciled(ok=False, seconds=time.monotonic() - started, reason=e.reason)
    finally:
        if backend is not None:
            backend.close()
    if (words := schedule_words(spec_raw, status)) is not None:
        out.status["schedule"] = words
    ready_before = (cond.condition(old, cond.READY) or {}).get("status")
    ready_now = (cond.condition(out.status.get("conditions"), cond.READY) or {}).get("status")
    if ready_before != ready_now and ready_now == "True":
        # A queue provisioned and ready in one go gets one Event that says both: an API write less.
        provisioned = [e for e in out.events if e.reason == "Provisioned"]
        if provisioned:
            provisioned[0].message += "; the queue is ready"
        else:
            out.events.append(Event("Normal", "Ready", "queue is ready"))
    metrics.set_ready(namespace, name, ready_now == "True")
    return out


def schedule_words(spec_raw: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
    """status.schedule for a Queue the upkeep has not described yet (it runs once the queue is
    provisioned, and keeps it current with the next window): so `kubectl describe` shows the
    schedules and checks of a queue that never became ready, too. None: nothing to write."""
    if status.get("schedule") and cond.is_true(status.get("conditions"), cond.PROVISIONED):
        return None
    try:
        words = describe(parse_spec(spec_raw), None).wire()
    except DbqError:
        return None
    return None if status.get("schedule") == words else words


def resize_started(
    conditions: list[dict[str, Any]], resized: Resized, generation: int | None
) -> tuple[list[dict[str, Any]], Event]:
    """Resizing=True once a switch to the new ring size is made, and its Event: pushes land in the
    new ring from then on, while the older one drains (the upkeep reports the end)."""
    grow = resized.to_size > resized.from_size
    message = (
        f"ring switched from {resized.from_size} to {resized.to_size} slots (new slots prepared in"
        f" {resized.prepared_s:.1f}s, pushes paused {resized.switch_s * 1000:.0f}ms);"
        f" {resized.positions_left} message(s) left in the older ring"
    )
    if not grow:
        message += ": producers may find the queue full until it drains"
    reason = "Growing" if grow else "Shrinking"
    return cond.set_condition(conditions, cond.RESIZING, True, reason, message, generation), Event(
        "Normal", "ResizeStarted", message
    )


def shared_login(before: int | None, now: int | None) -> list[Event]:
    """A Warning when applications start using the Queue's Secret (the operator's login)."""
    if not now or (before or 0) > 0:
        return []
    return [
        Event(
            "Warning",
            "AdminSecretInUse",
            f"{now} session(s) of dbq's client use the Queue's Secret, the operator's login, which may"
            " create and drop tables: give each application a QueueUser and its Secret (docs: Security)",
        )
    ]


def health(
    conditions: list[dict[str, Any]] | None,
    findings: Sequence[Finding],
    generation: int | None,
    *,
    repaired: bool = False,
) -> tuple[list[dict[str, Any]], list[Event]]:
    """Degraded from the queue's health checks (Service Broker has them; the other designs report
    none): True with the first failed check as its reason and every one in its message, False
    when all pass. A Warning Event when it turns True or its reason changes, a Normal one when it
    clears."""
    before = cond.condition(conditions, cond.DEGRADED) or {}
    if findings:
        reason, message = findings[0].check, "; ".join(f.message for f in findings)
        new = cond.set_condition(conditions, cond.DEGRADED, True, reason, message, generation)
        changed = before.get("status") != "True" or before.get("reason") != reason
        return new, [Event("Warning", reason, message)] if changed else []
    if before.get("status") == "False" and not repaired:
        return list(conditions or []), []
    reason = "Repaired" if repaired else "AsExpected"
    new = cond.set_condition(
        conditions, cond.DEGRADED, False, reason, "database objects match the spec", generation
    )
    cleared = (
        [Event("Normal", "ChecksPassed", "every health check passes again")]
        if before.get("status") == "True"
        else []
    )
    return new, cleared


def not_ready(conditions: list[dict[str, Any]] | None, e: DbqError, generation: int | None) -> Outcome:
    """Ready=False with the error's reason (Provisioned too, for a queue never provisioned),
    Reconciling or Stalled by whether waiting heals it, and a Warning Event when Ready turns False or its reason changes. A changed message alone is
    written to the condition without an Event, so an outage is one Event, not one per retry."""
    new = cond.set_condition(conditions, cond.READY, False, e.reason, str(e), generation)
    if not cond.is_true(conditions, cond.PROVISIONED):  # objects made earlier stay provisioned
        new = cond.set_condition(new, cond.PROVISIONED, False, e.reason, str(e), generation)
    new = cond.settled(new, e)
    out = Outcome(
        status=QueueStatus.model_validate({"conditions": new, "observedGeneration": generation}).wire()
    )
    previous = cond.condition(conditions, cond.READY) or {}
    if previous.get("status") != "False" or previous.get("reason") != e.reason:
        out.events.append(Event("Warning", e.reason, str(e)))
    out.error = e
    return out


def status_changes(current: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Only the fields that differ, so an unchanged queue costs no API write."""
    current = current or {}
    return {
        k: v
        for k, v in new.items()
        if json.dumps(current.get(k), sort_keys=True) != json.dumps(v, sort_keys=True)
    }


@contextmanager
def lazy_backend(
    name: str, namespace: str, spec: QueueSpec, read_secret: SecretReader
) -> Iterator[Callable[[], QueueBackend]]:
    """A function that opens the queue's backend the first time it is called (reading the
    Secret then, not before) and returns the same one after; closed on leaving."""
    opened: list[QueueBackend] = []

    def get() -> QueueBackend:
        if not opened:
            opened.append(backend_for(name, namespace, spec, read_secret)[2])
        return opened[0]

    try:
        yield get
    finally:
        for backend in opened:
            backend.close()


def deletion_blocker(queue: str, depth: Depth) -> str | None:
    """Why a DeleteIfEmpty queue cannot be dropped yet (messages ready or leased, Service Broker
    conversations open), with the counts; None when it can."""
    if not (depth.depth or depth.in_flight or depth.conversations):
        return None
    conversations = f" and {depth.conversations} open conversations" if depth.conversations else ""
    return (
        f"queue {queue} still holds {depth.depth} ready and {depth.in_flight} leased messages{conversations};"
        f" drain it, or annotate {FORCE_DELETE}=true to drop them"
    )


def dead_letters_kept_by(name: str, spec: Mapping[str, Any] | None) -> str | None:
    """The Queue (of the same namespace) whose table keeps the dead letters of Queue `name`:
    its spec.deadLetter.queue, unless that names itself; None for its own table."""
    keeper = ((spec or {}).get("deadLetter") or {}).get("queue")
    return str(keeper) if keeper and keeper != name else None


def delete(
    name: str,
    namespace: str,
    spec_raw: dict[str, Any],
    generation: int | None,
    status: dict[str, Any] | None,
    read_secret: SecretReader,
    *,
    force: bool,
    dead_letter_users: Sequence[str] = (),
) -> Outcome:
    """Drop the queue's objects as its deletion policy says (`force`: even with messages in it).
    An Outcome with an error means "not yet": the caller retries later; its status carries a
    DeletionBlocked condition when messages are in the way, or other Queues keep their dead
    letters in its table (`dead_letter_users`, whatever `force` says), and its events say why."""
    status = dict(status or {})
    policy = spec_raw.get("deletionPolicy", DeletionPolicy.DeleteIfEmpty)
    out = Outcome()
    if policy == DeletionPolicy.Retain:
        out.events.append(Event("Normal", "Retained", "deletionPolicy Retain: database objects kept"))
        return out
    if dead_letter_users:
        why = (
            f"Queues {', '.join(dead_letter_users)} keep their dead letters in this queue's table"
            " (spec.deadLetter.queue): redrive or purge them (`dbq dead-letters redrive|purge QUEUE`) and"
            " remove that field, or delete those Queues, first"
        )
        out.status["conditions"] = cond.set_condition(
            status.get("conditions"), cond.DELETION_BLOCKED, True, "DeadLetterQueueInUse", why, generation
        )
        out.events.append(Event("Warning", "DeletionBlocked", why))
        out.error = DbqError(why)
        return out
    provisioned = cond.is_true(status.get("conditions"), cond.PROVISIONED)
    try:
        _spec, queue, backend = backend_for(name, namespace, spec_raw, read_secret)
        try:
            if policy == DeletionPolicy.DeleteIfEmpty and not force:
                try:
                    depth = backend.depth()
                except QueueNotFound:  # dropped already (a deletion run again after it dropped them)
                    depth = Depth(depth=0, in_flight=0)
                message = deletion_blocker(queue, depth)
                if message:
                    out.status["conditions"] = cond.set_condition(
                        status.get("conditions"), cond.DELETION_BLOCKED, True, "NotEmpty", message, generation
                    )
                    out.events.append(Event("Warning", "DeletionBlocked", message))
                    out.error = DbqError(message)
                    return out
            dropped = backend.teardown()
        finally:
            backend.close()
    except DbqError as e:
        if not provisioned or (force and e.reason == "SecretNotFound"):
            # Never provisioned (bad Secret or spec): dbq made nothing there to drop. Or forced.
            why = "never provisioned" if not provisioned else "forced"
            out.events.append(Event("Normal", "Deleted", f"{e}; {why}: nothing dropped"))
            return out
        out.error = e
        out.events.append(Event("Warning", e.reason, f"cannot delete yet: {e}"))
        return out
    if dropped:  # a deletion run again after it dropped everything (its operator stopped) says nothing
        out.events.append(Event("Normal", "Deleted", f"dropped queue {queue} ({policy})"))
    return out
