"""Planning for pipes queues: spec + what exists in Cassandra -> the steps that make them match.

A pure function (tests run it without a cluster). Every step is idempotent (IF NOT EXISTS, ALTER
to a fixed value, UPDATE of the settings row), so an interrupted apply is simply planned again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dbq.backends.base import Step
from dbq.backends.cassandra.cql import (
    COMPACTION,
    COMPACTION_OPTIONS,
    GC_GRACE_SECONDS,
    PIPES_SCHEMA_VERSION,
)
from dbq.backends.names import QueueNames


@dataclass(frozen=True)
class PipesTarget:
    names: QueueNames
    replication: dict[str, str]
    max_pushes_per_pipe: int
    max_push_time_ms: int


@dataclass(frozen=True)
class TableOptions:
    gc_grace_seconds: int
    compaction: dict[str, str]


@dataclass(frozen=True)
class RecordedPipes:
    schema_version: int
    max_pushes_per_pipe: int
    max_push_time_ms: int


@dataclass(frozen=True)
class PipesObserved:
    keyspace_exists: bool = False
    replication: dict[str, str] = field(default_factory=dict)
    tables: dict[str, TableOptions] = field(default_factory=dict)
    recorded: RecordedPipes | None = None


def options_drift(options: TableOptions) -> list[str]:
    """What differs from the compaction and gc_grace dbq chose for queue tables."""
    drift = []
    if options.gc_grace_seconds != GC_GRACE_SECONDS:
        drift.append(f"gc_grace_seconds {options.gc_grace_seconds} (want {GC_GRACE_SECONDS})")
    want = COMPACTION | COMPACTION_OPTIONS
    got = {k: options.compaction.get(k) for k in want}
    if got != want:
        drift.append(
            f"compaction {options.compaction.get('class', '?')} (want {want['class'].rsplit('.', 1)[-1]})"
        )
    return drift


def plan_pipes(target: PipesTarget, observed: PipesObserved) -> list[Step]:
    n = target.names
    steps: list[Step] = []
    if not observed.keyspace_exists:
        steps.append(Step("create_keyspace", f"keyspace {n.schema} does not exist"))
    elif observed.replication != target.replication:
        steps.append(
            Step(
                "alter_keyspace",
                f"keyspace {n.schema} replicates as {observed.replication}, the spec asks for "
                f"{target.replication}: run `nodetool repair --full {n.schema}` on every node afterwards",
            )
        )
    if n.meta not in observed.tables:
        steps.append(Step(f"create_table:{n.meta}", f"table {n.schema}.{n.meta} does not exist"))
    if n.history not in observed.tables:
        steps.append(
            Step(
                f"create_table:{n.history}", f"statistics history table {n.schema}.{n.history} does not exist"
            )
        )
    for table in (n.pipes, n.pipe_state, n.waiting, n.pending):
        options = observed.tables.get(table)
        if options is None:
            steps.append(Step(f"create_table:{table}", f"table {n.schema}.{table} does not exist"))
        elif drift := options_drift(options):
            steps.append(Step(f"tune_table:{table}", f"table {n.schema}.{table} has {', '.join(drift)}"))
    want = RecordedPipes(PIPES_SCHEMA_VERSION, target.max_pushes_per_pipe, target.max_push_time_ms)
    if observed.recorded != want:
        steps.append(
            Step("record_settings", f"record {_settings(want)} (was {_settings(observed.recorded)})")
        )
    return steps


def _settings(recorded: RecordedPipes | None) -> str:
    if recorded is None:
        return "nothing"
    return (
        f"schema version {recorded.schema_version}, a new pipe every {recorded.max_pushes_per_pipe}"
        f" messages or {recorded.max_push_time_ms} ms"
    )
