"""Planning for Service Broker queues (SQL Server): spec + one catalog observation -> the steps
that make them match, the health checks a DBA would run, and what cleanup and teardown may do.

Pure functions over `BrokerObserved` (tests build observations by hand, since no SQL Server runs
here). Every step is idempotent ("properties-based" setup: run it twice, the second run does
nothing). Database-wide steps (ENABLE_BROKER, NEW_BROKER, TRUSTWORTHY) cannot run inside a
transaction, so the backend runs them first, each on its own; the rest run in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dbq.backends.base import Finding
from dbq.backends.maintenance import MIN_INDEX_PAGES, MaintenanceStep
from dbq.backends.sqlserver.server import refuse_below_floor
from dbq.contract.broker import BROKER_COUNTERS, BROKER_SCHEMA_VERSION
from dbq.errors import ActivationProcedureMissing, BrokerNotUnique, ConflictingObjects
from dbq.names import QueueNames


@dataclass(frozen=True)
class BrokerTarget:
    """What the spec asks for, in the planner's terms."""

    names: QueueNames
    database: str  # for statements a DBA runs by hand, and the roles' names (never run by dbq with this name)
    activation_procedure: str | None = None
    activation_enabled: bool = True
    max_readers: int = 1
    execute_as: str = "OWNER"
    poison_message_handling: bool = True
    re_enable_on_poison: bool = False
    new_broker: bool = False
    trustworthy: bool = False
    notified_after_s: float = 10.0
    open_conversations: int = 1000

    @property
    def message_types(self) -> tuple[str, str]:
        return (self.names.broker("message"), self.names.broker("tracer"))

    @property
    def contract(self) -> str:
        return self.names.broker("contract")

    @property
    def service(self) -> str:
        return self.names.broker()

    @property
    def sender_service(self) -> str:
        return self.names.broker("sender")


@dataclass(frozen=True)
class DatabaseState:
    broker_enabled: bool = True
    broker_guid: str = ""
    guid_shared: bool = False  # another database of the instance has the same broker GUID
    trustworthy: bool = False
    major_version: int = 16  # 14 = SQL Server 2017, dbq's floor
    schema_exists: bool = False
    compatibility_level: int = 150
    activation_procedure_exists: bool = True  # the spec's; True when it names none


@dataclass(frozen=True)
class QueueState:
    name: str
    receive_enabled: bool = True
    enqueue_enabled: bool = True
    activation_enabled: bool = False
    activation_procedure: str | None = None  # as the catalog names it: [db].[schema].[proc]
    procedure_exists: bool = True
    max_readers: int = 0
    execute_as: str | None = None  # OWNER, or a user name (SELF shows as its user)
    poison_handling: bool = True
    internal_table: str | None = None
    rows: int = 0


@dataclass(frozen=True)
class MonitorState:
    state: str  # INACTIVE | NOTIFIED | RECEIVES_OCCURRING | DROPPED
    seconds_in_state: float
    tasks_waiting: int


@dataclass(frozen=True)
class Transmission:
    """A message of this queue's services still in sys.transmission_queue."""

    to_service: str
    status: str  # transmission_status: why it was not delivered ('' while in transit)
    age_s: float


@dataclass(frozen=True)
class BrokerObserved:
    database: DatabaseState = field(default_factory=DatabaseState)
    message_types: frozenset[str] = frozenset()
    contract_messages: frozenset[str] | None = None  # None: no contract
    queues: dict[str, QueueState] = field(default_factory=dict)  # by object name (main, sender)
    services: dict[str, tuple[str, bool]] = field(default_factory=dict)  # name -> (queue, has contract)
    sequences: frozenset[str] = frozenset()
    tables: frozenset[str] = frozenset()  # metadata and history tables of the schema
    recorded_version: int | None = None
    endpoints: dict[str, int] = field(default_factory=dict)  # state -> count, this queue's services
    transmission: tuple[Transmission, ...] = ()
    transmission_total: int = 0
    monitor: MonitorState | None = None
    monitor_visible: bool = True  # VIEW SERVER STATE granted (queue monitors are a DMV)

    @property
    def open_conversations(self) -> int:
        return sum(n for state, n in self.endpoints.items() if state != "CD")


class BrokerAction(StrEnum):
    ENABLE_BROKER = "enable_broker"
    NEW_BROKER = "new_broker"
    SET_TRUSTWORTHY = "set_trustworthy"
    CREATE_SCHEMA = "create_schema"
    CREATE_META = "create_meta"
    CREATE_HISTORY = "create_history"
    CREATE_SEQUENCES = "create_sequences"
    CREATE_MESSAGE_TYPES = "create_message_types"
    CREATE_CONTRACT = "create_contract"
    CREATE_QUEUE = "create_queue"
    CREATE_SENDER_QUEUE = "create_sender_queue"
    ALTER_QUEUE = "alter_queue"
    ENABLE_QUEUE = "enable_queue"
    CREATE_SERVICES = "create_services"
    RECORD_VERSION = "record_version"
    SECURE = "secure"


# Steps on the database itself: not allowed in a transaction, so run first, each on its own.
DATABASE_ACTIONS = frozenset(
    {BrokerAction.ENABLE_BROKER, BrokerAction.NEW_BROKER, BrokerAction.SET_TRUSTWORTHY}
)

DONE = {
    BrokerAction.ENABLE_BROKER: "enabled Service Broker in the database",
    BrokerAction.NEW_BROKER: "gave the database a new broker GUID (SET NEW_BROKER): earlier conversations ended",
    BrokerAction.SET_TRUSTWORTHY: "set the database TRUSTWORTHY",
    BrokerAction.CREATE_SCHEMA: "created the schema",
    BrokerAction.CREATE_META: "created the metadata table",
    BrokerAction.CREATE_HISTORY: "created the statistics history table",
    BrokerAction.CREATE_SEQUENCES: "created the total sequences",
    BrokerAction.CREATE_MESSAGE_TYPES: "created the message types",
    BrokerAction.CREATE_CONTRACT: "created the contract",
    BrokerAction.CREATE_QUEUE: "created the queue",
    BrokerAction.CREATE_SENDER_QUEUE: "created the sender's queue",
    BrokerAction.ALTER_QUEUE: "altered the queue's activation and poison-message handling",
    BrokerAction.ENABLE_QUEUE: "re-enabled the queue that poison-message detection had disabled",
    BrokerAction.CREATE_SERVICES: "created the services",
    BrokerAction.RECORD_VERSION: "recorded the schema version",
    BrokerAction.SECURE: "gave the schema to its owner role and each right's permissions to its group role",
}


@dataclass(frozen=True)
class BrokerStep:
    action: BrokerAction
    why: str

    def __str__(self) -> str:
        return str(self.action)

    @property
    def done(self) -> str:
        return DONE[self.action]


def new_broker_statement(database: str) -> str:
    return f"ALTER DATABASE [{database.replace(']', ']]')}] SET NEW_BROKER WITH ROLLBACK IMMEDIATE"


def enable_broker_statement(database: str) -> str:
    return f"ALTER DATABASE [{database.replace(']', ']]')}] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE"


def dba_statement(action: BrokerAction, database: str) -> str:
    """What a DBA runs by hand for a database-wide step that dbq could not run."""
    if action is BrokerAction.NEW_BROKER:
        return new_broker_statement(database)
    if action is BrokerAction.ENABLE_BROKER:
        return enable_broker_statement(database)
    return f"ALTER DATABASE [{database.replace(']', ']]')}] SET TRUSTWORTHY ON"


def is_new(target: BrokerTarget, observed: BrokerObserved) -> bool:
    """Whether nothing of the queue exists: no metadata row, neither of its queues and none of its
    sequences (the schema, the metadata and history tables may be other queues')."""
    n = target.names
    own_sequences = {n.counter(c) for c in BROKER_COUNTERS}
    return (
        observed.recorded_version is None
        and not {n.queue, n.sender_queue} & observed.queues.keys()
        and not own_sequences & observed.sequences
    )


def plan_broker(target: BrokerTarget, observed: BrokerObserved) -> list[BrokerStep]:
    n, db = target.names, observed.database
    refuse_below_floor(db.major_version, db.compatibility_level)
    steps: list[BrokerStep] = []

    def step(action: BrokerAction, why: str) -> None:
        steps.append(BrokerStep(action, why))

    if db.guid_shared:
        statement = new_broker_statement(target.database)
        if not target.new_broker:
            raise BrokerNotUnique(
                f"database {target.database} shares its broker GUID {db.broker_guid} with another database of the"
                " instance (a restored copy): Service Broker cannot be enabled until it gets a new one. A DBA runs"
                f" `{statement}` (it ends every conversation in the database and needs exclusive access),"
                " or set spec.serviceBroker.newBroker: true to let dbq run it"
            )
        step(BrokerAction.NEW_BROKER, f"broker GUID {db.broker_guid} is shared with another database")
    elif not db.broker_enabled:
        step(BrokerAction.ENABLE_BROKER, "Service Broker is disabled in the database")
    if target.trustworthy and not db.trustworthy:
        step(BrokerAction.SET_TRUSTWORTHY, "spec.serviceBroker.trustworthy is true and the database is not")
    if not db.schema_exists:
        step(BrokerAction.CREATE_SCHEMA, f"schema {n.schema} does not exist")
    if n.meta not in observed.tables:
        step(BrokerAction.CREATE_META, f"metadata table {n.schema}.{n.meta} does not exist")
    if n.history not in observed.tables:
        step(BrokerAction.CREATE_HISTORY, f"statistics history table {n.schema}.{n.history} does not exist")
    missing = [n.counter(c) for c in BROKER_COUNTERS if n.counter(c) not in observed.sequences]
    if missing:
        step(BrokerAction.CREATE_SEQUENCES, f"sequences {', '.join(missing)} do not exist")
    missing = [t for t in target.message_types if t not in observed.message_types]
    if missing:
        step(BrokerAction.CREATE_MESSAGE_TYPES, f"message types {', '.join(missing)} do not exist")
    if observed.contract_messages is None:
        step(BrokerAction.CREATE_CONTRACT, f"contract {target.contract} does not exist")
    elif observed.contract_messages != frozenset(target.message_types):
        raise_conflict(
            f"contract {target.contract} exists with message types {sorted(observed.contract_messages)}"
            " (a contract cannot be altered)"
        )
    queue = observed.queues.get(n.queue)
    drift = queue_drift(target, queue) if queue is not None else []
    if (queue is None or drift) and not db.activation_procedure_exists:
        # Checked first: CREATE/ALTER QUEUE refuse an activation procedure that does not exist.
        raise ActivationProcedureMissing(
            f"spec.serviceBroker.activation.procedure [{n.schema}].[{target.activation_procedure}] does not exist:"
            " create it first (SQL Server refuses a queue whose activation names a missing procedure); retried"
        )
    if queue is None:
        step(BrokerAction.CREATE_QUEUE, f"queue {n.schema}.{n.queue} does not exist")
    else:
        if drift:
            step(BrokerAction.ALTER_QUEUE, f"queue {n.schema}.{n.queue} has {', '.join(drift)}")
        if not queue.receive_enabled and target.re_enable_on_poison:
            step(BrokerAction.ENABLE_QUEUE, f"queue {n.schema}.{n.queue} was disabled (poison message)")
    if n.sender_queue not in observed.queues:
        step(BrokerAction.CREATE_SENDER_QUEUE, f"queue {n.schema}.{n.sender_queue} does not exist")
    want = {target.service: n.queue, target.sender_service: n.sender_queue}
    for service, on in want.items():
        found = observed.services.get(service)
        if found is not None and found[0] != on:
            raise_conflict(f"service {service} exists on queue {found[0]}, not {on}")
    # The queue's service takes the contract; the sender's only begins conversations, so needs none.
    main = observed.services.get(target.service)
    wrong = [target.service] if main is None or not main[1] else []
    wrong += [target.sender_service] if target.sender_service not in observed.services else []
    if wrong:
        step(BrokerAction.CREATE_SERVICES, f"services {', '.join(wrong)} missing or without the contract")
    if observed.recorded_version != BROKER_SCHEMA_VERSION:
        step(BrokerAction.RECORD_VERSION, f"record schema version {BROKER_SCHEMA_VERSION}")
    made = [
        s.action for s in steps if s.action.startswith("create_") or s.action == BrokerAction.RECORD_VERSION
    ]
    if made:  # last: what was made now has no grants yet (version 2 made them for earlier queues)
        step(BrokerAction.SECURE, f"{made[0]} made or changed objects")
    return steps


def raise_conflict(what: str) -> None:
    raise ConflictingObjects(f"{what}: drop it, or name the queue differently (spec.queueName)")


def queue_drift(target: BrokerTarget, queue: QueueState) -> list[str]:
    """What differs between the queue's activation and poison handling and the spec (ALTER, not drop)."""
    drift = []
    if queue.poison_handling != target.poison_message_handling:
        drift.append(f"poison-message handling {'on' if queue.poison_handling else 'off'}")
    if target.activation_procedure is None:
        if queue.activation_procedure:
            drift.append(f"activation {queue.activation_procedure} the spec does not ask for")
        return drift
    wanted = f"[{target.names.schema}].[{target.activation_procedure}]"
    if not (queue.activation_procedure or "").endswith(wanted):
        drift.append(f"activation procedure {queue.activation_procedure or 'none'} (want {wanted})")
    if queue.activation_enabled != target.activation_enabled:
        drift.append(f"activation {'on' if queue.activation_enabled else 'off'}")
    if queue.max_readers != target.max_readers:
        drift.append(f"max readers {queue.max_readers} (want {target.max_readers})")
    if target.execute_as != "SELF" and (queue.execute_as or "").lower() != target.execute_as.lower():
        drift.append(f"execute as {queue.execute_as or 'caller'} (want {target.execute_as})")
    return drift


# --- checks -------------------------------------------------------------------------------------
def broker_checks(target: BrokerTarget, observed: BrokerObserved) -> list[Finding]:
    """The health checks of a provisioned queue, most serious first; empty when all pass."""
    n, db = target.names, observed.database
    qname = f"[{n.schema}].[{n.queue}]"
    out: list[Finding] = []
    if not db.broker_enabled:
        out.append(Finding("BrokerDisabled", f"Service Broker is disabled in database {target.database}: nothing"
                           f" is delivered; a DBA runs `{enable_broker_statement(target.database)}`"))  # fmt: skip
    queue = observed.queues.get(n.queue)
    if queue is not None and not queue.receive_enabled:
        fix = (
            "dbq re-enables it (spec.serviceBroker.reEnableOnPoison)"
            if target.re_enable_on_poison
            else f"find the message that fails, then `ALTER QUEUE {qname} WITH STATUS = ON`, or set"
            " spec.serviceBroker.reEnableOnPoison: true"
        )
        out.append(Finding("QueueDisabled", f"queue {qname} is disabled: poison-message detection turned it off"
                           f" after five rollbacks of one message in a row; {fix}"))  # fmt: skip
    if queue is not None and target.activation_procedure:
        if not queue.procedure_exists:
            out.append(Finding("ActivationProcedureMissing", f"activation procedure [{n.schema}]."
                               f"[{target.activation_procedure}] of queue {qname} does not exist: create it"))  # fmt: skip
        elif target.activation_enabled and not queue.activation_enabled:
            out.append(Finding("ActivationDisabled", f"activation of queue {qname} is off: messages wait until"
                               f" `ALTER QUEUE {qname} WITH ACTIVATION (STATUS = ON)`"))  # fmt: skip
    m = observed.monitor
    if m is not None and target.activation_procedure:
        if m.state == "DROPPED":
            out.append(Finding("MonitorDropped", f"the queue monitor of {qname} is DROPPED: activation is not"
                               " watched; re-enable activation or restart the broker"))  # fmt: skip
        elif m.state == "NOTIFIED" and m.seconds_in_state > target.notified_after_s and m.tasks_waiting == 0:
            out.append(Finding("MonitorStuck", f"the queue monitor of {qname} has been NOTIFIED for"
                               f" {m.seconds_in_state:.0f} s (over {target.notified_after_s:g} s) with no task"
                               " waiting: the activation procedure fails or does not RECEIVE; see the SQL"
                               " Server error log"))  # fmt: skip
    failing = [t for t in observed.transmission if t.status]
    if failing:
        first = failing[0]
        out.append(Finding("TransmissionErrors", f"{observed.transmission_total} messages wait in"
                           f" sys.transmission_queue; to {first.to_service}, {first.age_s:.0f} s old: {first.status}"))  # fmt: skip
    if observed.open_conversations > target.open_conversations:
        by_state = ", ".join(f"{k} {v}" for k, v in sorted(observed.endpoints.items()) if k != "CD")
        out.append(Finding("EndpointLeak", f"{observed.open_conversations} conversation endpoints are not"
                           f" CLOSED (over {target.open_conversations}: {by_state}): conversations are begun"
                           " and never ended; cleanup ends the stalled ones"))  # fmt: skip
    return out


# --- maintenance -----------------------------------------------------------------
@dataclass(frozen=True)
class QueueFigures:
    """The queue's internal table, as sys.dm_db_index_physical_stats measures its clustered index."""

    internal_table: str
    pages: int
    rows: int
    ghost_rows: int
    fragmentation: float

    @classmethod
    def of_row(cls, row: Sequence[Any]) -> QueueFigures:
        """From a row of `BrokerSql.queue_figures`: name, pages, rows, ghost rows, fragmentation."""
        return cls(str(row[0]), int(row[1]), int(row[2]), int(row[3]), float(row[4]))

    @property
    def ghost_percent(self) -> float:
        total = self.rows + self.ghost_rows
        return 100.0 * self.ghost_rows / total if total else 0.0

    def as_figures(self) -> dict[str, float]:
        return {"queue fragmentation %": self.fragmentation, "queue ghost records %": self.ghost_percent,
                "queue pages": float(self.pages)}  # fmt: skip


def plan_queue_maintenance(figures: QueueFigures, fragmentation_percent: float) -> list[MaintenanceStep]:
    """REBUILD past the threshold (fragmentation, or ghost records the ghost cleanup left behind),
    REORGANIZE past 5% fragmentation, nothing for a small table."""
    t = figures.internal_table
    if figures.pages < MIN_INDEX_PAGES:
        return []
    if figures.fragmentation >= fragmentation_percent:
        return [
            MaintenanceStep(
                "rebuild", t, t, f"{figures.fragmentation:.1f}% fragmented >= {fragmentation_percent:g}%"
            )
        ]
    if figures.ghost_percent >= fragmentation_percent:
        return [
            MaintenanceStep(
                "rebuild", t, t, f"{figures.ghost_percent:.1f}% ghost records >= {fragmentation_percent:g}%"
            )
        ]
    if figures.fragmentation >= 5:
        return [MaintenanceStep("reorganize", t, t, f"{figures.fragmentation:.1f}% fragmented")]
    return []
