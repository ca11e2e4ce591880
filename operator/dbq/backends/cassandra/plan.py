"""Planning for pipes queues: spec + what exists in Cassandra -> the steps that make them match.

A pure function (tests run it without a cluster). Every step is idempotent (IF NOT EXISTS, ALTER
to a fixed value, UPDATE of the settings row), so an interrupted apply is simply planned again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dbq.api.limits import DEFAULT_MAX_BODY_BYTES, MAX_PIPES_BODY_BYTES, MAX_PIPES_HEADER_BYTES
from dbq.backends.cassandra.cql import COMPACTION, COMPACTION_OPTIONS, GC_GRACE_SECONDS
from dbq.contract.headers import DEFAULT_HEADER_BYTES, DEFAULT_MAX_HEADERS
from dbq.contract.pipes import META_COLUMNS, PIPES_SCHEMA_VERSION
from dbq.errors import DeadLetterQueueNotFound, InvalidSpec
from dbq.names import QueueNames


@dataclass(frozen=True)
class PipesTarget:
    names: QueueNames
    replication: dict[str, str]
    max_pushes_per_pipe: int
    max_push_time_ms: int
    max_attempts: int = 0  # dead-letter a message acquired this many times and not acked; 0: never
    archive_ttl_s: int = 0  # keep acked and popped messages this long; 0: no archive
    # The queue whose dead table keeps this queue's dead letters (spec.deadLetter.queue, in the
    # same cluster); None: its own.
    dead_letter_keeper: QueueNames | None = None
    header_bytes: int = DEFAULT_HEADER_BYTES  # spec.messages.headerBytes
    max_headers: int = DEFAULT_MAX_HEADERS  # spec.messages.maxHeaders
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # spec.messages.maxBytes

    @property
    def dead_letter_queue(self) -> str:
        """What the metadata row records of dead_letter_keeper: keyspace.queue, or '' for the queue itself."""
        return self.dead_letter_keeper.qualified if self.dead_letter_keeper is not None else ""


class PipesAction(StrEnum):
    CREATE_KEYSPACE = "create_keyspace"
    ALTER_KEYSPACE = "alter_keyspace"
    CREATE_TABLE = "create_table"
    TUNE_TABLE = "tune_table"
    ADD_META_COLUMNS = "add_meta_columns"
    ADD_DEAD_SOURCE = "add_dead_source"
    ADD_HEADERS = "add_headers"
    SOURCE_DEAD_LETTERS = "source_dead_letters"
    RECORD_SETTINGS = "record_settings"


@dataclass(frozen=True)
class PipesStep:
    action: PipesAction
    why: str
    table: str = ""  # for CREATE_TABLE, TUNE_TABLE and ADD_HEADERS

    def __str__(self) -> str:
        return f"{self.action}:{self.table}" if self.table else str(self.action)

    @property
    def done(self) -> str:
        """What applying it did, in words (Events, `dbq apply`)."""
        return {
            PipesAction.CREATE_KEYSPACE: "created the keyspace",
            PipesAction.ALTER_KEYSPACE: "changed the keyspace's replication: run `nodetool repair --full` on every node",
            PipesAction.CREATE_TABLE: f"created table {self.table}",
            PipesAction.TUNE_TABLE: f"reset compaction and gc_grace_seconds of table {self.table}",
            PipesAction.ADD_META_COLUMNS: "added the columns of schema versions 2 to 4 to the metadata table",
            PipesAction.ADD_HEADERS: f"added the headers column to table {self.table}",
            PipesAction.ADD_DEAD_SOURCE: "added the source column to the dead-letter table",
            PipesAction.SOURCE_DEAD_LETTERS: "named this queue the source of its older dead letters",
            PipesAction.RECORD_SETTINGS: "recorded the schema version and settings",
        }[self.action]


@dataclass(frozen=True)
class TableOptions:
    gc_grace_seconds: int
    compaction: dict[str, str]


@dataclass(frozen=True)
class RecordedPipes:
    schema_version: int
    max_pushes_per_pipe: int
    max_push_time_ms: int
    max_attempts: int = 0  # recorded since schema version 2
    archive_ttl_s: int = 0  # recorded since schema version 2
    dead_letter_queue: str = ""  # recorded since schema version 3
    header_bytes: int = DEFAULT_HEADER_BYTES  # recorded since schema version 4
    max_headers: int = DEFAULT_MAX_HEADERS  # recorded since schema version 4
    max_body_bytes: int = 0  # recorded since schema version 5


@dataclass(frozen=True)
class PipesObserved:
    keyspace_exists: bool = False
    replication: dict[str, str] = field(default_factory=dict)
    tables: dict[str, TableOptions] = field(default_factory=dict)
    recorded: RecordedPipes | None = None
    meta_columns: frozenset[str] = frozenset()
    dead_columns: frozenset[str] = frozenset()
    # Message tables made before schema version 4, without a headers column.
    headerless: frozenset[str] = frozenset()
    # The schema version recorded for the queue that keeps the dead letters (spec.deadLetter.queue),
    # None when it is not provisioned; not looked up when the queue keeps its own.
    keeper_version: int | None = None


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


def is_new(target: PipesTarget, observed: PipesObserved) -> bool:
    """Whether nothing of the queue exists: no metadata row and none of its tables (the
    keyspace, the metadata and history tables may be other queues')."""
    return observed.recorded is None and not set(target.names.pipes_tables) & observed.tables.keys()


def plan_pipes(target: PipesTarget, observed: PipesObserved) -> list[PipesStep]:
    n = target.names
    steps: list[PipesStep] = []
    if target.max_body_bytes > MAX_PIPES_BODY_BYTES:
        raise InvalidSpec(
            f"spec.messages.maxBytes is {target.max_body_bytes}, and a pipes queue stores bodies of at most"
            f" {MAX_PIPES_BODY_BYTES} bytes (a Spark job stages each in one Cassandra mutation): lower it, or"
            " use a ring queue (up to 64 MiB)"
        )
    if target.header_bytes > MAX_PIPES_HEADER_BYTES:
        raise InvalidSpec(
            f"spec.messages.headerBytes is {target.header_bytes}, and a pipes message holds at most"
            f" {MAX_PIPES_HEADER_BYTES} bytes of headers (they move in logged batches, which Cassandra refuses"
            " past 50 KiB): lower it"
        )
    if target.dead_letter_keeper is not None and observed.keeper_version != PIPES_SCHEMA_VERSION:
        found = (
            "it is not provisioned"
            if observed.keeper_version is None
            else (f"it has schema version {observed.keeper_version}")
        )
        raise DeadLetterQueueNotFound(
            f"spec.deadLetter.queue: queue {target.dead_letter_keeper.qualified} must be provisioned at pipes schema"
            f" version {PIPES_SCHEMA_VERSION} before it keeps other queues' dead letters, and {found}:"
            " retried until that Queue is Ready"
        )
    if not observed.keyspace_exists:
        steps.append(PipesStep(PipesAction.CREATE_KEYSPACE, f"keyspace {n.schema} does not exist"))
    elif observed.replication != target.replication:
        why = (
            f"keyspace {n.schema} replicates as {observed.replication}, the spec asks for "
            f"{target.replication}: run `nodetool repair --full {n.schema}` on every node afterwards"
        )
        steps.append(PipesStep(PipesAction.ALTER_KEYSPACE, why))
    if n.meta not in observed.tables:
        steps.append(PipesStep(PipesAction.CREATE_TABLE, f"table {n.schema}.{n.meta} does not exist", n.meta))
    elif missing := [c for c in META_COLUMNS if c not in observed.meta_columns]:
        why = f"table {n.schema}.{n.meta} has no {', '.join(missing)} (made by an older schema version)"
        steps.append(PipesStep(PipesAction.ADD_META_COLUMNS, why))
    if n.history not in observed.tables:
        why = f"statistics history table {n.schema}.{n.history} does not exist"
        steps.append(PipesStep(PipesAction.CREATE_TABLE, why, n.history))
    for table in n.pipes_tables:
        options = observed.tables.get(table)
        if options is None:
            steps.append(
                PipesStep(PipesAction.CREATE_TABLE, f"table {n.schema}.{table} does not exist", table)
            )
        elif drift := options_drift(options):
            why = f"table {n.schema}.{table} has {', '.join(drift)}"
            steps.append(PipesStep(PipesAction.TUNE_TABLE, why, table))
    if n.dead in observed.tables and "source" not in observed.dead_columns:
        why = f"table {n.schema}.{n.dead} has no source column (made by schema version 2)"
        steps.append(PipesStep(PipesAction.ADD_DEAD_SOURCE, why))
    for table in n.message_tables:
        if table in observed.headerless:
            why = f"table {n.schema}.{table} has no headers column (made before schema version 4)"
            steps.append(PipesStep(PipesAction.ADD_HEADERS, why, table))
    if observed.recorded is not None and observed.recorded.schema_version == 2 and n.dead in observed.tables:
        why = f"dead letters of schema version 2 in {n.schema}.{n.dead} name no source"
        steps.append(PipesStep(PipesAction.SOURCE_DEAD_LETTERS, why))
    want = RecordedPipes(
        PIPES_SCHEMA_VERSION, target.max_pushes_per_pipe, target.max_push_time_ms, target.max_attempts,
        target.archive_ttl_s, target.dead_letter_queue, target.header_bytes, target.max_headers,
        target.max_body_bytes,
    )  # fmt: skip
    if observed.recorded != want:
        why = f"record {_settings(want)} (was {_settings(observed.recorded)})"
        steps.append(PipesStep(PipesAction.RECORD_SETTINGS, why))
    return steps


def _settings(recorded: RecordedPipes | None) -> str:
    if recorded is None:
        return "nothing"
    return (
        f"schema version {recorded.schema_version}, a new pipe every {recorded.max_pushes_per_pipe}"
        f" messages or {recorded.max_push_time_ms} ms, dead letters after {recorded.max_attempts or 'no'} attempts,"
        f" archive kept {recorded.archive_ttl_s} s, dead letters kept by"
        f" {recorded.dead_letter_queue or 'the queue itself'}, headers of at most {recorded.header_bytes} bytes"
        f" and {recorded.max_headers} keys, bodies of at most {recorded.max_body_bytes} bytes"
    )
