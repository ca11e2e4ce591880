"""Planning for ring queues: spec + what exists -> the steps that make them match.

A pure function, shared by the PostgreSQL and SQL Server dialects: each dialect renders the
same steps as its own SQL. Every step is idempotent, so a plan interrupted half-way (operator
killed) is simply planned and applied again.
"""

from __future__ import annotations

from dataclasses import dataclass

from dbq.backends.base import ConflictingObjects, Observed, Step
from dbq.backends.names import QueueNames

# Version of the objects dbq creates for a ring queue. Bump it when routines or tables change;
# `plan` then re-creates the routines and records the new version (a migration step goes here
# when tables change shape).
RING_SCHEMA_VERSION = 5

ROUTINES = (
    "place", "push", "push_many", "take", "pop", "pop_many", "release",
    "ack", "ack_many", "nack", "repair", "void_holes", "stats",
)  # fmt: skip


@dataclass(frozen=True)
class RingTarget:
    names: QueueNames
    size: int
    message_bytes: int


def plan_ring(target: RingTarget, observed: Observed, routines: tuple[str, ...] = ROUTINES) -> list[Step]:
    n = target.names
    steps: list[Step] = []
    recorded = observed.recorded
    if recorded is not None and recorded.ring_size != target.size:
        raise ConflictingObjects(
            f"{n.schema}.{n.ring} exists with {recorded.ring_size} slots but spec.ring.size is {target.size}: "
            "a ring cannot be resized in place; create a new Queue (or delete this queue's objects first)"
        )
    if not observed.schema_exists:
        steps.append(Step("create_schema", f"schema {n.schema} does not exist"))
    if not observed.meta_exists:
        steps.append(Step("create_meta", f"metadata table {n.schema}.{n.meta} does not exist"))
    ring_missing = n.ring not in observed.tables
    if ring_missing:
        steps.append(Step("create_ring", f"ring table {n.schema}.{n.ring} does not exist"))
    if ring_missing or observed.ring_rows < target.size:
        steps.append(
            Step("fill_ring", f"ring has {0 if ring_missing else observed.ring_rows} of {target.size} slots")
        )
    missing_seqs = [s for s in n.sequences if s not in observed.sequences]
    if missing_seqs:
        steps.append(Step("create_sequences", f"sequences {', '.join(missing_seqs)} do not exist"))
    elif ring_missing:
        # The sequences outlived the ring (dropped behind our back): the messages are gone, so
        # positions restart level, or poppers would wait on positions nobody will write.
        steps.append(Step("reset_positions", "ring re-created while its sequences remained"))
    missing_tables = [t for t in (n.spill, n.gap) if t not in observed.tables]
    if missing_tables:
        steps.append(Step("create_side_tables", f"{', '.join(missing_tables)} missing"))
    if n.history not in observed.tables:
        steps.append(
            Step("create_history", f"statistics history table {n.schema}.{n.history} does not exist")
        )
    missing_routines = [r for r in routines if n.routine(r) not in observed.routines]
    stale = recorded is not None and (
        recorded.schema_version != RING_SCHEMA_VERSION or recorded.message_bytes != target.message_bytes
    )
    if missing_routines or stale or any(s.action == "create_ring" for s in steps):
        why = (
            f"routines {', '.join(n.routine(r) for r in missing_routines)} do not exist"
            if missing_routines
            else "routines are older than the spec"
        )
        steps.append(Step("create_routines", why))
    if (
        recorded is None
        or recorded.schema_version != RING_SCHEMA_VERSION
        or recorded.message_bytes != target.message_bytes
    ):
        steps.append(Step("record_version", f"record schema version {RING_SCHEMA_VERSION} and settings"))
    return steps
