"""Planning for ring queues: spec + what exists -> the steps that make them match.

A pure function, shared by the PostgreSQL and SQL Server dialects: each dialect renders the
same steps as its own SQL (`RingSqlBase.render`). Every step is idempotent, so a plan
interrupted half-way (operator killed) is simply planned and applied again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dbq.api.limits import DEFAULT_MAX_BODY_BYTES
from dbq.contract.headers import DEFAULT_HEADER_BYTES, DEFAULT_MAX_HEADERS
from dbq.contract.ring import PGMQ_FACADE_VERSION, RING_SCHEMA_VERSION, RingTarget
from dbq.errors import ConflictingObjects, DeadLetterQueueNotFound, InvalidSpec

# Versions 8 and 9 keyed a dead-letter table by msg_id alone; since 10 it is (source, msg_id), so
# it can keep the dead letters of other queues (spec.deadLetter.queue), whose ids are their own.
DEAD_LETTERS_KEYED_BY_ID = (8, 9)
# Since 14 the spill table is indexed by (state, visible_at): delayed messages pushed in bulk wait
# there, and a pop looking for the next due one scanned and sorted them all.
SPILL_INDEXED_SINCE = 14
# Since 16 every message table has a headers column (spec.messages).
HEADERS_SINCE = 16
# Since 18 a body past a slot waits in the content table, and a spilled message's body may be
# there (its spill row's body NULL).
CONTENT_SINCE = 18
# Since 20 every object belongs to the schema's owner role, the routines a login calls run as it
# (SECURITY DEFINER, search_path pinned), and each right's group role holds EXECUTE on its own.

# The routines of every dialect (each adds its internal helpers: see `PgRing.ROUTINES`, `MsRing.ROUTINES`).
ROUTINES = (
    "place", "push", "push_many", "take", "pop", "pop_many", "release",
    "ack", "ack_many", "nack", "repair", "void_holes", "stats",
    "defer", "extend", "redrive", "purge_dead", "scavenge",
)  # fmt: skip


class RingAction(StrEnum):
    CREATE_SCHEMA = "create_schema"
    CREATE_META = "create_meta"
    CREATE_RING = "create_ring"
    FILL_RING = "fill_ring"
    CREATE_SEQUENCES = "create_sequences"
    RESET_POSITIONS = "reset_positions"
    CREATE_SIDE_TABLES = "create_side_tables"
    KEY_DEAD_LETTERS = "key_dead_letters"
    INDEX_SPILL = "index_spill"
    ADD_HEADERS = "add_headers"
    ALLOW_CONTENT = "allow_content"
    SET_COMPRESSION = "set_compression"
    SEED_SETTLED = "seed_settled"
    CREATE_HISTORY = "create_history"
    CREATE_ROUTINES = "create_routines"
    RECORD_VERSION = "record_version"
    SECURE = "secure"
    INSTALL_PGMQ = "install_pgmq"
    PUBLISH_PGMQ = "publish_pgmq"
    UNPUBLISH_PGMQ = "unpublish_pgmq"


DONE = {
    RingAction.CREATE_SCHEMA: "created the schema",
    RingAction.CREATE_META: "created the metadata table",
    RingAction.CREATE_RING: "created the ring table",
    RingAction.FILL_RING: "filled the ring's slots",
    RingAction.CREATE_SEQUENCES: "created the position and total sequences",
    RingAction.RESET_POSITIONS: "levelled the push and pop positions",
    RingAction.CREATE_SIDE_TABLES: "created the spill, gap, staging, dead-letter and archive tables",
    RingAction.KEY_DEAD_LETTERS: "keyed the dead-letter table by source queue",
    RingAction.INDEX_SPILL: "indexed the spill table by due time",
    RingAction.ADD_HEADERS: "added the headers column to the message tables",
    RingAction.ALLOW_CONTENT: "let spilled messages keep their body in the content table",
    RingAction.SET_COMPRESSION: "set the compression of stored bodies",
    RingAction.SEED_SETTLED: "started the settled total from the leases held",
    RingAction.CREATE_HISTORY: "created the statistics history table",
    RingAction.CREATE_ROUTINES: "created the routines",
    RingAction.RECORD_VERSION: "recorded the schema version and settings",
    RingAction.SECURE: "gave every object to the schema's owner role and each right's routines to its group role",
    RingAction.INSTALL_PGMQ: "installed PGMQ's API (schema pgmq) and mapped spec.pgmq.name to the queue",
    RingAction.PUBLISH_PGMQ: "mapped spec.pgmq.name to the queue in PGMQ's API (schema pgmq)",
    RingAction.UNPUBLISH_PGMQ: "removed the queue from PGMQ's API (schema pgmq)",
}


# The steps that make objects (which then belong to the operator, and routines to PUBLIC too,
# until SECURE runs after them).
MAKING = frozenset({
    RingAction.CREATE_SCHEMA, RingAction.CREATE_META, RingAction.CREATE_RING, RingAction.CREATE_SEQUENCES,
    RingAction.CREATE_SIDE_TABLES, RingAction.CREATE_HISTORY, RingAction.CREATE_ROUTINES,
})  # fmt: skip


@dataclass(frozen=True)
class RingStep:
    action: RingAction
    why: str  # what the plan found

    def __str__(self) -> str:
        return str(self.action)

    @property
    def done(self) -> str:
        """What applying it did, in words (Events, `dbq apply`)."""
        return DONE[self.action]


@dataclass(frozen=True)
class Recorded:
    """What the queue's metadata row in the database says about it."""

    schema_version: int
    ring_size: int
    message_bytes: int
    max_attempts: int = 0  # recorded since version 8 (0 before)
    archive: bool = False  # recorded since version 9
    dead_letter_queue: str = ""  # recorded since version 10: RingTarget.dead_letter_queue
    header_bytes: int = DEFAULT_HEADER_BYTES  # recorded since version 16 (spec.messages)
    max_headers: int = DEFAULT_MAX_HEADERS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # recorded since version 18
    compression: str = ""  # spec.messages.compression in force (PostgreSQL); '' before it was set


@dataclass(frozen=True)
class Observed:
    """What exists in the database for one ring queue."""

    schema_exists: bool = False
    meta_exists: bool = False
    tables: frozenset[str] = frozenset()
    sequences: frozenset[str] = frozenset()
    routines: frozenset[str] = frozenset()
    ring_rows: int = 0  # of the newest generation's slots
    slots: int = 0  # the newest generation's size (the recorded size before generations; 0: none)
    recorded: Recorded | None = None
    # The schema version recorded for the queue that keeps the dead letters (spec.deadLetter.queue),
    # None when it is not provisioned; not looked up when the queue keeps its own.
    keeper_version: int | None = None
    # Every object belongs to the owner role and no routine is granted beyond its right (a
    # dialect that does not look says True).
    secured: bool = True
    # The database's PGMQ facade: its version (0: not installed, or not readable by this login)
    # and the PGMQ queue name it maps to this queue ('' for none).
    facade_version: int = 0
    pgmq_name: str = ""
    # The topic patterns bound to that name, sorted.
    pgmq_topics: tuple[str, ...] = ()


def choose_compression(wanted: str, offered: frozenset[str]) -> str:
    """The compression of stored bodies for spec.messages.compression `wanted` ('' for the best
    the server offers: lz4, else pglz) on a server offering `offered` (empty: no choice, PostgreSQL
    before 14 and SQL Server, where '' stays)."""
    if not wanted:
        return next((c for c in ("lz4", "pglz") if c in offered), "")
    if not offered:
        raise InvalidSpec(
            f"spec.messages.compression: {wanted} needs PostgreSQL 14 or later (this server offers no choice):"
            " remove the field"
        )
    if wanted not in offered:
        raise InvalidSpec(
            f"spec.messages.compression: {wanted} is not offered by this server (it offers"
            f" {', '.join(sorted(offered))}): choose one it offers, or remove the field for the best one"
        )
    return wanted


def is_new(target: RingTarget, observed: Observed) -> bool:
    """Whether nothing of the queue exists: no metadata row and none of its tables (the schema,
    the metadata and history tables may be other queues')."""
    return observed.recorded is None and not set(target.names.tables) & observed.tables


def plan_ring(target: RingTarget, observed: Observed, routines: tuple[str, ...] = ROUTINES,
              resizable: bool = False) -> list[RingStep]:  # fmt: skip
    """The steps that make the queue's objects match the spec. A ring of another size is left to
    the online resize when `resizable` (a ring its Queue provisioned), refused otherwise."""
    n = target.names
    steps: list[RingStep] = []

    def step(action: RingAction, why: str) -> None:
        steps.append(RingStep(action, why))

    recorded = observed.recorded
    keeper = target.dead_letter_keeper
    if keeper is not None and observed.keeper_version != RING_SCHEMA_VERSION:
        found = (
            "it is not provisioned"
            if observed.keeper_version is None
            else (f"it has schema version {observed.keeper_version}")
        )
        raise DeadLetterQueueNotFound(
            f"spec.deadLetter.queue: queue {keeper.qualified} must be provisioned at ring schema version"
            f" {RING_SCHEMA_VERSION} before it keeps other queues' dead letters, and {found}: retried until"
            " that Queue is Ready"
        )
    if recorded is not None and recorded.ring_size != target.size and not resizable:
        raise ConflictingObjects(
            f"{n.schema}.{n.ring} exists with {recorded.ring_size} slots but spec.ring.size is {target.size}: "
            "a Queue resizes online only a ring it provisioned itself; create this one with the"
            " ring's size and change spec.ring.size after, or use another queueName or schema"
        )
    if not observed.schema_exists:
        step(RingAction.CREATE_SCHEMA, f"schema {n.schema} does not exist")
    if not observed.meta_exists:
        step(RingAction.CREATE_META, f"metadata table {n.schema}.{n.meta} does not exist")
    ring_missing = n.ring not in observed.tables
    if ring_missing:
        step(RingAction.CREATE_RING, f"ring table {n.schema}.{n.ring} does not exist")
    slots = observed.slots or target.size
    if ring_missing or observed.ring_rows < slots:
        step(
            RingAction.FILL_RING,
            f"ring has {0 if ring_missing else observed.ring_rows} of {slots} slots",
        )
    missing_seqs = [s for s in n.sequences if s not in observed.sequences]
    if missing_seqs:
        step(RingAction.CREATE_SEQUENCES, f"sequences {', '.join(missing_seqs)} do not exist")
    elif ring_missing:
        # The sequences outlived the ring (dropped behind our back): the messages are gone, so
        # positions restart level, or poppers would wait on positions nobody will write.
        step(RingAction.RESET_POSITIONS, "ring re-created while its sequences remained")
    missing_tables = [t for t in n.tables if t != n.ring and t not in observed.tables]
    if missing_tables:
        step(RingAction.CREATE_SIDE_TABLES, f"{', '.join(missing_tables)} missing")
    if (
        recorded is not None
        and recorded.schema_version in DEAD_LETTERS_KEYED_BY_ID
        and n.dead in observed.tables
    ):
        step(
            RingAction.KEY_DEAD_LETTERS,
            f"dead-letter table {n.schema}.{n.dead} is of version {recorded.schema_version}: keyed by id alone",
        )
    if recorded is not None and recorded.schema_version < SPILL_INDEXED_SINCE and n.spill in observed.tables:
        step(
            RingAction.INDEX_SPILL,
            f"spill table {n.schema}.{n.spill} is of version {recorded.schema_version}: not indexed by due time",
        )
    if recorded is not None and recorded.schema_version < HEADERS_SINCE:
        step(
            RingAction.ADD_HEADERS,
            f"message tables are of version {recorded.schema_version}: no headers column",
        )
    if recorded is not None and recorded.schema_version < CONTENT_SINCE and n.spill in observed.tables:
        step(
            RingAction.ALLOW_CONTENT,
            f"spill table {n.schema}.{n.spill} is of version {recorded.schema_version}: its body cannot be elsewhere",
        )
    recompress = bool(target.compression) and (recorded is None or recorded.compression != target.compression)
    if recompress:
        step(
            RingAction.SET_COMPRESSION,
            f"stored bodies are compressed with {(recorded.compression if recorded else '') or 'the server default'},"
            f" spec.messages.compression wants {target.compression}",
        )
    elif target.compression and (ring_missing or missing_tables):
        step(
            RingAction.SET_COMPRESSION,
            f"tables made now start with the server default, not {target.compression}",
        )
    if n.counter("settled") in missing_seqs and not ring_missing:
        # A queue of schema version 6 or older: its leases held so far were never settled.
        step(
            RingAction.SEED_SETTLED, f"total {n.counter('settled')} is new: start it at acquired - in flight"
        )
    if n.history not in observed.tables:
        step(RingAction.CREATE_HISTORY, f"statistics history table {n.schema}.{n.history} does not exist")
    missing_routines = [r for r in routines if n.routine(r) not in observed.routines]
    stale = recorded is not None and (
        recorded.schema_version != RING_SCHEMA_VERSION
        or recorded.message_bytes != target.message_bytes
        or recorded.max_attempts != target.max_attempts
        or recorded.archive != target.archive
        or recorded.dead_letter_queue != target.dead_letter_queue
        or recorded.header_bytes != target.header_bytes
        or recorded.max_headers != target.max_headers
        or recorded.max_body_bytes != target.max_body_bytes
    )
    if missing_routines or stale or ring_missing:
        why = (
            f"routines {', '.join(n.routine(r) for r in missing_routines)} do not exist"
            if missing_routines
            else "routines are older than the spec"
        )
        step(RingAction.CREATE_ROUTINES, why)
    if recorded is None or stale or recompress:
        step(RingAction.RECORD_VERSION, f"record schema version {RING_SCHEMA_VERSION} and settings")
    made = [s.action for s in steps if s.action in MAKING]
    if made or not observed.secured:
        # Last: objects made now start as the operator's, and routines as PUBLIC's.
        step(
            RingAction.SECURE,
            f"{made[0]} made objects" if made else "an object or a grant is not as dbq gives it",
        )
    steps += plan_pgmq(target, observed, secure=bool(made) or not observed.secured)
    return steps


def plan_pgmq(target: RingTarget, observed: Observed, secure: bool) -> list[RingStep]:
    """PGMQ's API for spec.pgmq: the facade installed at this version, the name mapped to the
    queue, and its group roles granted the facade's functions (again whenever SECURE runs)."""
    wanted = target.pgmq_name
    if not wanted:
        if observed.pgmq_name:
            return [
                RingStep(
                    RingAction.UNPUBLISH_PGMQ,
                    f"PGMQ name {observed.pgmq_name} maps to the queue, spec.pgmq is absent",
                )
            ]
        return []
    if observed.facade_version < PGMQ_FACADE_VERSION:  # never one a newer operator installed
        why = f"PGMQ facade is at version {observed.facade_version or 'none'}, dbq's is {PGMQ_FACADE_VERSION}"
        return [RingStep(RingAction.INSTALL_PGMQ, why)]
    if observed.pgmq_name != wanted:
        why = f"PGMQ name {wanted} does not map to the queue yet"
    elif observed.pgmq_topics != target.pgmq_topics:
        why = f"PGMQ topic bindings are {list(observed.pgmq_topics)}, spec.pgmq.topics {list(target.pgmq_topics)}"
    elif secure:
        why = "grants were given again"
    else:
        return []
    return [RingStep(RingAction.PUBLISH_PGMQ, why)]
