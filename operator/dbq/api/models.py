"""The Queue resource: spec and status as pydantic models.

These models are the one source of truth: they validate manifests in `dbq apply`, give the
defaults, and generate the CRD's schema (with its CEL admission rules) in `dbq.api.crd`.
Field names are camelCase on the wire (Kubernetes style) and snake_case in Python.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from dbq.api.durations import Duration
from dbq.api.limits import DEFAULT_MAX_BODY_BYTES, MAX_PIPES_BODY_BYTES, MAX_PIPES_HEADER_BYTES

GROUP = "dbq.dev"
VERSION = "v1alpha1"
KIND = "Queue"
PLURAL = "queues"

# Identifiers dbq creates in databases: lower case, digits and underscores, starting with a
# letter, short enough that every derived object name fits PostgreSQL's 63-byte limit.
IDENTIFIER_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
IDENTIFIER_HINT = (
    "use lower-case letters, digits and underscores, starting with a letter, at most 40 characters"
)
# metadata.name doubles as the queue name when spec.queueName is absent ('-' becomes '_').
DERIVABLE_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,39}$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Cron schedules: five fields (or a macro), each a list of '*', a value or a range, with an
# optional step. The same patterns make the API server's admission rules (CEL) and the models'
# validation, so both name the field that is wrong.
CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly")
CRON_HINT = "e.g. '0 3 * * *' (minute hour day-of-month month day-of-week) or @daily"


def _cron_field(value: str, extras: str = "") -> str:
    item = rf"(\*|({value})(-({value}))?)(/[0-9]{{1,2}})?" + (f"|{extras}" if extras else "")
    return rf"^({item})(,({item}))*$"


_DAY = r"0?[1-9]|[12][0-9]|3[01]"
_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_WEEKDAYS = "sun|mon|tue|wed|thu|fri|sat"
CRON_FIELDS = (  # name, what it takes, pattern
    ("minute", "0-59", _cron_field(r"[0-5]?[0-9]")),
    ("hour", "0-23", _cron_field(r"[01]?[0-9]|2[0-3]")),
    ("day-of-month", "1-31 (or L, ?, nW)", _cron_field(_DAY, rf"\?|L|LW|({_DAY})W")),
    ("month", "1-12 or jan-dec", _cron_field(rf"0?[1-9]|1[0-2]|(?i:{_MONTHS})")),
    (
        "day-of-week",
        "0-7 or sun-sat (or ?, L, nL, n#k)",
        _cron_field(rf"[0-7]|(?i:{_WEEKDAYS})", r"\?|L|[0-7]L|[0-7]#[1-5]"),
    ),
)


def cron_problem(value: str) -> str | None:
    """What is wrong with a cron schedule, naming the field; None when nothing is."""
    if value.startswith("@"):
        return (
            None
            if value in CRON_MACROS
            else f"{value!r} is not a cron macro: use one of {', '.join(CRON_MACROS)}"
        )
    fields = value.split()
    if len(fields) != 5:
        return f"{value!r} has {len(fields)} fields, not five: {CRON_HINT}"
    for (name, takes, pattern), field in zip(CRON_FIELDS, fields, strict=True):
        if not re.fullmatch(pattern, field):
            return f"the {name} field {field!r} of {value!r} must be {takes}, '*', a range a-b, a step */n or a list: {CRON_HINT}"
    return None


def _cron_rules() -> list[dict[str, str]]:
    """The checks of `cron_problem` as CEL rules, for the API server."""
    fields = "self.split(' ').filter(f, f != '')"
    rules = [
        {"rule": f"!self.startsWith('@') || self in [{', '.join(repr(m) for m in CRON_MACROS)}]",
         "message": f"spec.reindex.schedule: a macro is one of {', '.join(CRON_MACROS)}"},
        {"rule": f"self.startsWith('@') || {fields}.size() == 5",
         "message": f"spec.reindex.schedule: write five fields, {CRON_HINT}"},
    ]  # fmt: skip
    for i, (name, takes, pattern) in enumerate(CRON_FIELDS):
        cel_pattern = pattern.replace("\\", "\\\\")
        rules.append({
            "rule": f"self.startsWith('@') || {fields}.size() != 5 || {fields}[{i}].matches('{cel_pattern}')",
            "message": f"spec.reindex.schedule: the {name} field must be {takes}, '*', a range a-b, a step */n"
            f" or a list: {CRON_HINT}",
        })  # fmt: skip
    return rules


# backend -> designs it offers
DESIGNS: dict[str, tuple[str, ...]] = {
    "postgres": ("ring",),
    "sqlserver": ("ring", "servicebroker"),
    "cassandra": ("pipes",),
}


def immutable(what: str, instead: str) -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": f"{what} cannot change after creation; {instead}"}
        ]
    }


class Backend(StrEnum):
    postgres = "postgres"
    sqlserver = "sqlserver"
    cassandra = "cassandra"


class Design(StrEnum):
    ring = "ring"
    servicebroker = "servicebroker"
    pipes = "pipes"


class Compression(StrEnum):
    lz4 = "lz4"
    pglz = "pglz"
    none = "none"


class DeletionPolicy(StrEnum):
    Retain = "Retain"
    Delete = "Delete"
    DeleteIfEmpty = "DeleteIfEmpty"


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", use_enum_values=True
    )

    def wire(self) -> dict[str, Any]:
        """As the API server stores it: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class SecretRef(Model):
    name: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)] = Field(
        description="Secret in the Queue's namespace with `url`, or host/port/database/username/password[/driver]."
    )


class Connection(Model):
    secret_ref: SecretRef = Field(description="The Secret to connect with, in the Queue's namespace.")
    schema_: Annotated[
        str,
        Field(
            alias="schema",
            pattern=IDENTIFIER_PATTERN,
            json_schema_extra=immutable(
                "spec.connection.schema", "create a new Queue in the other schema and drain this one"
            ),
        ),
    ] = Field(default="dbq", description="Schema (SQL) or keyspace (Cassandra) that holds the queue.")


class AutoGrow(Model):
    max_size: Annotated[int, Field(ge=16, le=10_000_000)] = Field(
        description="The most slots the operator grows the ring to; at least spec.ring.size."
    )
    when_full_above: Annotated[int, Field(ge=1, le=99)] = Field(
        default=80,
        description="Grow when the messages waiting stay above this percentage of the ring's slots (two"
        " statistics samples in a row).",
    )
    factor: Annotated[float, Field(ge=1.1, le=10)] = Field(
        default=2.0, description="Each growth multiplies the ring's slots by this, up to maxSize."
    )


class Ring(Model):
    size: Annotated[int, Field(ge=16, le=10_000_000)] = Field(
        default=100_000,
        description="Preallocated slots: the most messages the ring holds at once. Changed, the ring is resized"
        " online: new pushes land in a new ring while the older one drains (status condition Resizing).",
    )
    auto_grow: AutoGrow | None = Field(
        default=None,
        description="The operator grows the ring online before it fills (status.ring.grownTo),"
        " from spec.ring.size up to maxSize; removed, the ring goes back to spec.ring.size.",
    )
    message_bytes: Annotated[int, Field(ge=16, le=7_000)] = Field(
        default=300,
        description="Largest body a slot holds in its row; a larger one (up to spec.messages.maxBytes) waits in"
        " the queue's content table, the slot keeping its id.",
    )


DATACENTER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATACENTER_HINT = (
    "spec.pipes.replication.datacenters: a datacenter name is letters, digits, '_', '.' or '-'"
    " (at most 64), as `nodetool status` shows it"
)


class Replication(Model):
    factor: Annotated[int, Field(ge=1, le=7)] = Field(
        default=1, description="Replicas (SimpleStrategy) when no datacenters are named."
    )
    datacenters: Annotated[
        dict[str, Annotated[int, Field(ge=1, le=7)]],
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {"rule": f"self.all(dc, dc.matches('{DATACENTER_PATTERN}'))", "message": DATACENTER_HINT}
                ]
            }
        ),
    ] = Field(default_factory=dict, description="NetworkTopologyStrategy: replicas per datacenter.")

    @field_validator("datacenters")
    @classmethod
    def _dc_names(cls, value: dict[str, int]) -> dict[str, int]:
        for dc in value:
            if not re.fullmatch(DATACENTER_PATTERN, dc):
                raise ValueError(f"{dc!r}: {DATACENTER_HINT}")
        return value


class Pipes(Model):
    max_pushes_per_pipe: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=500, description="A pusher starts a new pipe after this many messages."
    )
    max_push_time: Duration("1s", "24h") = Field(  # type: ignore[valid-type]
        default="1m", description="...or after this long, whichever comes first."
    )
    replication: Replication = Field(
        default_factory=Replication,
        description="Replication of the keyspace dbq creates (ALTER KEYSPACE when changed).",
    )


EXECUTE_AS_PATTERN = r"^(OWNER|SELF|[a-z][a-z0-9_]{0,39})$"


class Activation(Model):
    procedure: Annotated[str, Field(pattern=IDENTIFIER_PATTERN)] = Field(
        description="Stored procedure in the queue's schema that Service Broker starts when messages arrive."
    )
    max_readers: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=1, description="MAX_QUEUE_READERS: how many copies of the procedure run at most."
    )
    execute_as: Annotated[str, Field(pattern=EXECUTE_AS_PATTERN)] = Field(
        default="OWNER", description="EXECUTE AS: OWNER, SELF or a database user name."
    )
    enabled: bool = Field(
        default=True, description="Activation STATUS; false keeps the procedure set but off."
    )


class BrokerChecks(Model):
    notified_after: Duration("1s", "1h") = Field(  # type: ignore[valid-type]
        default="10s",
        description="An activated queue's monitor NOTIFIED this long with no task waiting is reported stuck.",
    )
    open_conversations: Annotated[int, Field(ge=1, le=100_000_000)] = Field(
        default=1000, description="More conversation endpoints than this not CLOSED is reported as a leak."
    )


class ServiceBroker(Model):
    activation: Activation | None = Field(
        default=None,
        description="Internal activation; absent: applications receive (dbq's client, `dbq pop`).",
    )
    poison_message_handling: bool = Field(
        default=True,
        description="With an activation procedure: let SQL Server disable the queue after five rollbacks of"
        " one message in a row. Without one it stays off: dbq's clients nack by rolling back.",
    )
    re_enable_on_poison: bool = Field(
        default=False,
        description="Turn a queue that poison-message detection disabled back on (else only reported).",
    )
    new_broker: bool = Field(
        default=False,
        description="On a restored copy whose broker GUID is not unique, run SET NEW_BROKER (ends every "
        "conversation of the database and needs exclusive access); else only reported.",
    )
    trustworthy: bool = Field(default=False, description="Set the database TRUSTWORTHY (only when true).")
    checks: BrokerChecks = Field(
        default_factory=BrokerChecks, description="Thresholds of the health checks that set Degraded."
    )


class DeadLetter(Model):
    max_attempts: Annotated[int, Field(ge=1, le=1000)] = Field(
        description="A message acquired this many times and not acked (nacked, or its lease expired) moves to the"
        " dead-letter table, with its attempts and last error; `dbq dead-letters` lists and redrives them."
    )
    queue: Annotated[str | None, Field(pattern=DNS_LABEL_PATTERN, max_length=63)] = Field(
        default=None,
        description="Another Queue of this namespace whose dead-letter table keeps this queue's dead letters"
        " (several queues can share one); it must have the same backend, design and Secret, so a message moves"
        " there in the transaction that takes it. Absent: the queue's own dead-letter table.",
    )


class Messages(Model):
    header_bytes: Annotated[int, Field(ge=64, le=65_536)] = Field(
        default=1024,
        description="Largest headers of one message, as the compact JSON dbq stores (keys sorted);"
        " a push with more is refused with an error naming this field.",
    )
    max_headers: Annotated[int, Field(ge=1, le=256)] = Field(
        default=32, description="Most header keys on one message."
    )
    max_bytes: Annotated[int | None, Field(ge=16, le=67_108_864)] = Field(
        default=None,
        description="Largest body of one message, in bytes; a push with a larger one is refused with an error"
        " naming this field. Ring: default 1 MiB, at most 64 MiB; a body past spec.ring.messageBytes waits in a"
        " content table beside the ring. Pipes: default 1 MiB, at most 8 MiB; a body past 32 KiB is stored in chunks"
        " of 256 KiB beside the pipes, and headerBytes is at most 16 KiB."
        " Service Broker: not used (SQL Server's own limit, 2 GB a message).",
    )
    compression: Compression | None = Field(
        default=None,
        description="PostgreSQL: how bodies larger than about 2 KB are compressed where they are stored (the"
        " column's TOAST compression): lz4 (fast; the default where the server offers it, else pglz), pglz, or"
        " none for bodies that do not compress (images, archives, encrypted data), which then skip the attempt."
        " Changed in place; bodies written before a change keep theirs. Other backends: leave unset (Cassandra"
        " compresses its SSTables itself; SQL Server stores bodies as they come).",
    )


class Archive(Model):
    enabled: bool = Field(
        default=False,
        description="Keep acked and popped messages (id, body, pushed and acked times, attempts) in the queue's"
        " archive table instead of discarding them; `dbq archive` reads them.",
    )
    retention: Duration("1m", "8760h") = Field(  # type: ignore[valid-type]
        default="168h",
        description="Ring: cleanup removes archived messages older than this, in bounded batches (also after"
        " the archive is turned off, until none is left). Pipes: each archived row lives this long (a TTL).",
    )


# A PGMQ topic pattern (spec.pgmq.topics), as PGMQ 1.13 takes it: dot-separated words of letters,
# digits, '_' and '-', where * stands for one word and # for any words, never two wildcards side by
# side. The facade's SQL (pgmq._dbq_topic_problem) says the same of the routing keys sent.
_TOPIC_WORD = r"(?:(?:[*#]?[a-zA-Z0-9_-]+)+[*#]?|[*#])"
TOPIC_PATTERN = rf"^{_TOPIC_WORD}(?:[.]{_TOPIC_WORD})*$"  # [.], not an escape: CEL refuses it
TOPIC_HINT = (
    "spec.pgmq.topics: a pattern is dot-separated words of letters, digits, '_' and '-', where * stands for"
    " one word and # for any words (logs.*, orders.#, #.error), at most 255 characters, with no two wildcards"
    " side by side"
)
MAX_TOPICS = 32


class Pgmq(Model):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,46}$")] = Field(
        description="The name PGMQ's clients use for this queue (pgmq.send('NAME', ...)): lower-case letters,"
        " digits and underscores, at most 47, unique in the database. The operator installs PGMQ 1.13's API"
        " (schema pgmq) in the database and maps this name to the queue; see the Coming from PGMQ page."
    )
    topics: Annotated[
        list[Annotated[str, Field(max_length=255)]],
        Field(
            max_length=MAX_TOPICS,
            json_schema_extra={
                "x-kubernetes-validations": [
                    {"rule": f"self.all(p, p.matches('{TOPIC_PATTERN}'))", "message": TOPIC_HINT}
                ]
            },
        ),
    ] = Field(
        default_factory=list,
        description="PGMQ topic patterns bound to this queue: pgmq.send_topic('KEY', ...) sends to every queue"
        " with a pattern KEY matches (* one word, # any words). The operator makes the bindings; PGMQ's"
        " bind_topic succeeds for one listed here and is refused for any other.",
    )

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not re.fullmatch(TOPIC_PATTERN, pattern):
                raise ValueError(f"{pattern!r}: {TOPIC_HINT}")
            if value.count(pattern) > 1:
                raise ValueError(f"spec.pgmq.topics lists {pattern!r} twice: list each pattern once")
        return value


class Timeouts(Model):
    visibility: Duration("1s", "12h") = Field(  # type: ignore[valid-type]
        default="30s",
        description="Lease of an acquired message; unacknowledged past it, it is delivered again.",
    )
    pop_wait: Duration("0s", "1m") = Field(  # type: ignore[valid-type]
        default="1s", description="How long pop/acquire wait for a message by default."
    )
    push_wait: Duration("0s", "1m") = Field(  # type: ignore[valid-type]
        default="5s", description="How long a push waits on a full queue before it fails with QueueFull."
    )
    stalled_after: Duration("10s", "168h") = Field(  # type: ignore[valid-type]
        default="5m", description="A claim or pipe idle this long is stalled and repaired by cleanup."
    )
    message_ttl: Duration("1s", "8760h", allow_zero=True) = Field(  # type: ignore[valid-type]
        default="0s",
        alias="messageTTL",
        description="Messages older than this expire unread; 0s keeps them until read.",
    )


class Threshold(Model):
    fragmentation_percent: Annotated[int, Field(ge=1, le=100)] = Field(
        default=30, description="Reindex/rebuild when index fragmentation or bloat passes this percentage."
    )
    dead_tuple_percent: Annotated[int, Field(ge=1, le=100)] = Field(
        default=20, description="PostgreSQL: vacuum when dead rows pass this percentage of the table."
    )


class Reindex(Model):
    schedule: Annotated[
        str, Field(max_length=100, json_schema_extra={"x-kubernetes-validations": _cron_rules()})
    ] = Field(
        default="0 3 * * *", description="Cron schedule of the maintenance window (operator's time zone)."
    )
    threshold: Threshold = Field(
        default_factory=Threshold, description="Act only past these measured figures."
    )
    online: bool = Field(default=True, description="Prefer online operations (CONCURRENTLY, ONLINE=ON).")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        problem = cron_problem(value)
        if problem is None and not croniter.is_valid(value):
            problem = f"{value!r} is not a schedule cron can run: {CRON_HINT}"
        if problem:
            raise ValueError(problem)
        return value


class Cleanup(Model):
    interval: Duration("5s", "24h") = Field(  # type: ignore[valid-type]
        default="1m", description="How often stalled messages are repaired."
    )


class Stats(Model):
    interval: Duration("5s", "1h") = Field(  # type: ignore[valid-type]
        default="15s", description="How often statistics are measured and published."
    )
    retention: Duration("1h", "8760h") = Field(  # type: ignore[valid-type]
        default="168h", description="How long the stats history is kept in the queue's database."
    )


class QueueSpec(Model):
    backend: Annotated[
        Backend,
        Field(json_schema_extra=immutable("spec.backend", "create a new Queue on the other backend")),
    ] = Field(description="The database: postgres, sqlserver or cassandra.")
    design: Annotated[
        Design,
        Field(json_schema_extra=immutable("spec.design", "create a new Queue with the other design")),
    ] = Field(
        description="The design: ring (postgres, sqlserver), servicebroker (sqlserver) or pipes (cassandra)."
    )
    queue_name: Annotated[
        str | None,
        Field(
            pattern=IDENTIFIER_PATTERN,
            json_schema_extra=immutable("spec.queueName", "create a new Queue with the other name"),
        ),
    ] = Field(
        default=None, description="Name of the queue's objects; defaults to metadata.name with '-' as '_'."
    )
    connection: Connection = Field(
        description="Where the queue lives: the Secret to connect with and the schema."
    )
    ring: Ring = Field(default_factory=Ring, description="Ring queues: the ring's size and slot size.")
    pipes: Pipes = Field(
        default_factory=Pipes, description="Pipes queues: when pushers start a new pipe, and replication."
    )
    service_broker: ServiceBroker = Field(
        default_factory=ServiceBroker,
        description="Service Broker queues: activation, poison handling, checks.",
    )
    dead_letter: DeadLetter | None = Field(
        default=None,
        description="Ring and pipes queues: dead-letter messages that keep failing (absent: redeliver for ever).",
    )
    messages: Messages = Field(
        default_factory=Messages,
        description="Limits of one message: its body's size and its headers (ring and pipes; Service Broker"
        " messages carry no headers).",
    )
    archive: Archive = Field(
        default_factory=Archive,
        description="Ring and pipes queues: keep acked and popped messages for a while.",
    )
    pgmq: Pgmq | None = Field(
        default=None,
        description="PostgreSQL ring queues: also reachable through PGMQ's API (schema pgmq), under this name.",
    )
    timeouts: Timeouts = Field(
        default_factory=Timeouts, description="Defaults of the clients' waits and leases."
    )
    reindex: Reindex = Field(
        default_factory=Reindex, description="The maintenance window and its thresholds."
    )
    cleanup: Cleanup = Field(default_factory=Cleanup, description="How often stalled messages are repaired.")
    stats: Stats = Field(
        default_factory=Stats, description="How often statistics are measured, and kept how long."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DeleteIfEmpty,
        description="On delete: Retain the database objects, Delete them, or DeleteIfEmpty (wait until drained).",
    )

    @model_validator(mode="after")
    def _pair(self) -> QueueSpec:
        if self.design not in DESIGNS[self.backend]:
            raise ValueError(design_error(str(self.backend), str(self.design)))
        if self.dead_letter is not None and self.design == "servicebroker":
            raise ValueError(DEAD_LETTER_HINT)
        if self.archive.enabled and self.design == "servicebroker":
            raise ValueError(ARCHIVE_HINT)
        if self.messages.compression is not None and self.backend != "postgres":
            raise ValueError(COMPRESSION_HINT)
        if self.pgmq is not None and (self.backend != "postgres" or self.design != "ring"):
            raise ValueError(PGMQ_HINT)
        if self.design == "pipes":
            body = self.messages.max_bytes or DEFAULT_MAX_BODY_BYTES
            if body > MAX_PIPES_BODY_BYTES or self.messages.header_bytes > MAX_PIPES_HEADER_BYTES:
                raise ValueError(PIPES_SIZE_HINT)
        grow = self.ring.auto_grow
        if grow is not None and grow.max_size < self.ring.size:
            raise ValueError(AUTO_GROW_HINT.format(max_size=grow.max_size, size=self.ring.size))
        for field, section in (("ring", "ring"), ("pipes", "pipes"), ("service_broker", "serviceBroker")):
            if field in self.model_fields_set and self.design != SECTION_DESIGNS[section]:
                raise ValueError(section_error(section, str(self.design)))
        return self


def design_error(backend: str, design: str) -> str:
    return (
        f"spec.design {design} does not exist on backend {backend}: "
        "use ring with postgres or sqlserver, servicebroker with sqlserver, pipes with cassandra"
    )


# Each design's own settings section, refused on a Queue of another design (not ignored).
SECTION_DESIGNS = {"ring": "ring", "pipes": "pipes", "serviceBroker": "servicebroker"}


def section_error(section: str, design: str) -> str:
    return (
        f"spec.{section} holds the settings of {SECTION_DESIGNS[section]} queues and the design of this Queue"
        f" is {design}: remove spec.{section}"
    )


DEAD_LETTER_HINT = (
    "spec.deadLetter: a servicebroker queue keeps no dead letters (Service Broker disables a queue on"
    " poison messages instead, see spec.serviceBroker.poisonMessageHandling); remove it"
)
PGMQ_HINT = (
    "spec.pgmq: PGMQ's API is offered on PostgreSQL ring queues only: remove spec.pgmq, or use backend postgres"
    " with design ring"
)
ARCHIVE_HINT = (
    "spec.archive.enabled: a servicebroker queue has no archive (Service Broker keeps messages with the"
    " queue's RETENTION setting instead); set it to false"
)
PIPES_SIZE_HINT = (
    f"spec.messages: a pipes message holds a body of at most {MAX_PIPES_BODY_BYTES} bytes (maxBytes; a Spark"
    f" job stages it in one Cassandra mutation) and at most {MAX_PIPES_HEADER_BYTES} bytes of headers"
    " (headerBytes; they move in logged batches, which Cassandra refuses past 50 KiB); lower them, or use"
    " a ring queue for larger bodies"
)
COMPRESSION_HINT = (
    "spec.messages.compression chooses PostgreSQL's compression of stored bodies: remove it on this backend"
    " (Cassandra compresses its SSTables itself; SQL Server stores bodies as they come)"
)
AUTO_GROW_HINT = (
    "spec.ring.autoGrow.maxSize ({max_size}) is below spec.ring.size ({size}): raise maxSize to at least the size,"
    " or remove autoGrow"
)
# CEL equivalents of the checks above that involve more than one field (the API server runs them).
SPEC_RULES = [
    {
        "rule": "!has(self.messages) || !has(self.messages.compression) || self.backend == 'postgres'",
        "message": COMPRESSION_HINT,
    },
    {"rule": "!has(self.deadLetter) || self.design != 'servicebroker'", "message": DEAD_LETTER_HINT},
    {
        "rule": "!has(self.archive) || !has(self.archive.enabled) || !self.archive.enabled"
        " || self.design != 'servicebroker'",
        "message": ARCHIVE_HINT,
    },
    {
        "rule": "self.design == 'ring' ? self.backend in ['postgres', 'sqlserver'] : "
        "self.design == 'servicebroker' ? self.backend == 'sqlserver' : self.backend == 'cassandra'",
        "messageExpression": "'spec.design ' + self.design + ' does not exist on backend ' + self.backend + "
        "': use ring with postgres or sqlserver, servicebroker with sqlserver, pipes with cassandra'",
    },
    *(
        {
            "rule": f"!has(self.{section}) || self.design == '{design}'",
            "messageExpression": f"'spec.{section} holds the settings of {design} queues and the design of this Queue is '"
            f" + self.design + ': remove spec.{section}'",
        }
        for section, design in SECTION_DESIGNS.items()
    ),
    {
        "rule": "self.design != 'pipes' || !has(self.messages) || ("
        f"(!has(self.messages.maxBytes) || self.messages.maxBytes <= {MAX_PIPES_BODY_BYTES})"
        f" && (!has(self.messages.headerBytes) || self.messages.headerBytes <= {MAX_PIPES_HEADER_BYTES}))",
        "message": PIPES_SIZE_HINT,
    },
    {
        "rule": "!has(self.ring) || !has(self.ring.autoGrow) || self.ring.autoGrow.maxSize >= self.ring.size",
        "message": "spec.ring.autoGrow.maxSize is below spec.ring.size: raise maxSize to at least the size, or remove"
        " autoGrow",
    },
    {
        "rule": "has(self.queueName) == has(oldSelf.queueName)",
        "message": "spec.queueName cannot be added or removed after creation; create a new Queue instead",
    },
]
ROOT_RULES = [
    {
        "rule": f"has(self.spec.queueName) || self.metadata.name.matches('{DERIVABLE_NAME_PATTERN}')",
        "message": "metadata.name cannot be used as a queue name: set spec.queueName "
        "(lower-case letters, digits, '_', at most 40) or use a name of lower-case letters, digits and '-'",
    }
]


def derived_queue_name(metadata_name: str) -> str | None:
    """The queue name a Queue's metadata.name stands for ('-' as '_'); None if it stands for none."""
    if isinstance(metadata_name, str) and re.fullmatch(DERIVABLE_NAME_PATTERN, metadata_name):
        return metadata_name.replace("-", "_")
    return None


def queue_name(metadata_name: str, spec: QueueSpec) -> str:
    """The name of the queue's database objects."""
    if spec.queue_name:
        return spec.queue_name
    derived = derived_queue_name(metadata_name)
    if derived is None:
        raise ValueError(
            f"metadata.name {metadata_name!r} cannot be used as a queue name: set spec.queueName ({IDENTIFIER_HINT})"
        )
    return derived


class QueueResource(Model):
    """A whole Queue manifest, as `dbq apply -f` reads it."""

    model_config = ConfigDict(extra="ignore")
    api_version: Literal["dbq.dev/v1alpha1"]
    kind: Literal["Queue"]
    metadata: dict[str, Any]
    spec: QueueSpec

    @model_validator(mode="after")
    def _derivable_name(self) -> QueueResource:
        queue_name(self.name, self.spec)  # raises when metadata.name cannot name the queue
        return self

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))
