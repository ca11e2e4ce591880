"""Every database identifier dbq uses is derived, validated and quoted here, in one place.

A name that is not a safe identifier never reaches SQL/CQL text: `QueueNames` refuses it, and
each dialect's quoting (`QUOTE`, `LITERAL`) validates again before it quotes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from dbq.api.models import IDENTIFIER_HINT, IDENTIFIER_PATTERN, derived_queue_name
from dbq.errors import UnsafeName

_IDENT = re.compile(IDENTIFIER_PATTERN)
META_TABLE = "dbq_queues"
HISTORY_TABLE = "dbq_stats_history"  # statistics samples of every queue in the schema/keyspace
# Running totals of a ring queue. Each is a sequence: advancing one is not transactional and
# leaves no row version behind, so a long transaction elsewhere cannot bloat it. `settled`
# counts leases ended (acked, nacked or expired), so in flight = acquired - settled; `dead`
# counts messages moved to the dead-letter table (`QueueNames.dead`), `redriven` those moved
# back and `purged` those deleted there; `archived` counts messages kept in the archive table
# (spec.archive) and `scavenged` those removed from it past the retention.
COUNTERS = (
    "pushed", "popped", "acquired", "expired", "settled", "dead", "redriven", "purged", "archived", "scavenged",
)  # fmt: skip


def check_identifier(value: str, field: str) -> str:
    if not isinstance(value, str) or not _IDENT.fullmatch(value):
        raise UnsafeName(
            f"{field} {value!r} is not a safe identifier: {IDENTIFIER_HINT} (such as {nearest_identifier(value)!r})"
        )
    return value


def nearest_identifier(value: object) -> str:
    """The safe identifier closest to `value`, for error messages: lower case, anything else
    than letters and digits as '_', a letter first, at most 40 characters."""
    text = re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_")
    if not text or not text[0].isalpha():
        text = f"q_{text}".rstrip("_")
    return text[:40].rstrip("_")


def queue_identifier(name: str) -> str:
    """The name of a queue's database objects, given either that name (`orders_eu`) or the Queue
    resource's metadata.name (`orders-eu`), which maps to it as the operator maps it."""
    return derived_queue_name(name) or check_identifier(name, "queue name")


@dataclass(frozen=True)
class QueueNames:
    """Names of one queue's objects, unquoted; all lower-case, digits and underscores."""

    schema: str
    queue: str

    def __post_init__(self) -> None:
        check_identifier(self.schema, "spec.connection.schema")
        check_identifier(self.queue, "queue name")

    def _(self, suffix: str) -> str:
        return f"{self.queue}_{suffix}"

    @property
    def meta(self) -> str:
        return META_TABLE

    @property
    def history(self) -> str:
        return HISTORY_TABLE

    @property
    def ring(self) -> str:
        return self._("ring")

    @property
    def spill(self) -> str:
        return self._("spill")

    @property
    def gap(self) -> str:
        return self._("gap")

    @property
    def push_seq(self) -> str:
        return self._("push_seq")

    @property
    def pop_seq(self) -> str:
        return self._("pop_seq")

    @property
    def swept_seq(self) -> str:
        """When read last swept expired leases back (ms since the epoch; version 23 on)."""
        return self._("swept")

    def routine(self, verb: str) -> str:
        return self._(verb)

    def counter(self, total: str) -> str:
        """A running total (`COUNTERS`), kept in a sequence."""
        if total not in COUNTERS:
            raise ValueError(f"unknown counter {total!r}")
        return self._(f"n_{total}")

    @property
    def staged(self) -> str:
        """Messages on their way between the queue and a Spark job (`dbq.spark`), keyed by
        (stage, seq): a streaming read's offsets, a write's rows before it is published."""
        return self._("staged")

    @property
    def delayed(self) -> str:
        """Cassandra: messages pushed with a delay, waiting until due (repair moves them to a pipe)."""
        return self._("delayed")

    @property
    def dead(self) -> str:
        """Dead letters: messages acquired and not acked `deadLetter.maxAttempts` times; also
        those of the queues whose spec.deadLetter.queue names this queue (column `source`)."""
        return self._("dead")

    @property
    def qualified(self) -> str:
        """schema.queue: unique in its database; the `source` of the queue's dead letters."""
        return f"{self.schema}.{self.queue}"

    @classmethod
    def of_qualified(cls, text: str) -> QueueNames:
        """The names of the queue `qualified` wrote as `text` (validated again)."""
        schema, _, queue = text.partition(".")
        return cls(schema=schema, queue=queue)

    @property
    def waiters(self) -> str:
        """One row: until when consumers wait on the queue (they renew it), so that pushes notify
        them (PostgreSQL's LISTEN/NOTIFY, `dbq.client.notify`) only then."""
        return self._("waiters")

    @property
    def archive(self) -> str:
        """Messages acked or popped, kept until `spec.archive.retention` (when archive is on)."""
        return self._("archive")

    @property
    def archive_index(self) -> str:
        return self._("archive_at")

    @property
    def spill_index(self) -> str:
        """The spill table's messages by state and due time: what a pop looks for there."""
        return self._("spill_due")

    @property
    def content(self) -> str:
        """Bodies too large for their message's row, keyed by message id: on a ring, past
        ring.messageBytes while the message is in the ring or the spill table; on pipes, in chunks
        past 32 KiB."""
        return self._("content")

    @property
    def generations(self) -> str:
        """The ring's generations (version 24 on): per ring alive, the first position it holds,
        its first slot and its size; more than one while an online resize drains the older."""
        return self._("gens")

    @property
    def tables(self) -> tuple[str, ...]:
        return (
            self.ring, self.spill, self.gap, self.staged, self.dead, self.waiters, self.archive, self.content,
            self.generations,
        )  # fmt: skip

    @property
    def pipes(self) -> str:
        """Cassandra: the queue's pipe descriptors (one partition, ordered by pipe id)."""
        return self._("pipes")

    @property
    def pipe_state(self) -> str:
        """Cassandra: one row per pipe with its counters, cursor and lease."""
        return self._("state")

    @property
    def waiting(self) -> str:
        """Cassandra: messages waiting to be taken, one partition per pipe."""
        return self._("waiting")

    @property
    def pending(self) -> str:
        """Cassandra: leased messages waiting for ack/nack, one partition per pipe."""
        return self._("pending")

    @property
    def pipes_tables(self) -> tuple[str, ...]:
        """Cassandra: the tables of one pipes queue."""
        return (
            self.pipes, self.pipe_state, self.waiting, self.pending, self.staged, self.dead, self.delayed, self.archive,
            self.content,
        )  # fmt: skip

    @property
    def message_tables(self) -> tuple[str, ...]:
        """Cassandra: the tables of a pipes queue whose rows are messages (they carry headers)."""
        return (self.waiting, self.pending, self.dead, self.delayed, self.archive)

    @property
    def sender_queue(self) -> str:
        """Service Broker: the queue of the sending service (end-of-conversation replies)."""
        return self._("sender")

    def broker(self, part: str = "") -> str:
        """Service Broker: a database-wide name (message type, contract, service), qualified by
        schema and queue, since those objects live in no schema. `ms_broker_quote` quotes it."""
        return f"dbq/{self.schema}/{self.queue}" + (f"/{part}" if part else "")

    @property
    def sequences(self) -> tuple[str, ...]:
        return (self.push_seq, self.pop_seq, *(self.counter(c) for c in COUNTERS), self.swept_seq)


# --- quoting, per dialect -----------------------------------------------------------------------
# A derived object name: a validated name plus a suffix, within PostgreSQL's 63-byte limit.
_DERIVED = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def _derived(identifier: str) -> str:
    if not isinstance(identifier, str) or not _DERIVED.fullmatch(identifier):
        raise UnsafeName(f"refusing to quote {identifier!r}: not a name dbq derives ({IDENTIFIER_HINT})")
    return identifier


def pg_quote(identifier: str) -> str:
    """A validated identifier, double-quoted for PostgreSQL (and CQL)."""
    return f'"{_derived(identifier)}"'


def ms_quote(identifier: str) -> str:
    """A validated identifier, bracket-quoted for SQL Server."""
    return f"[{_derived(identifier)}]"


_BROKER_NAME = re.compile(r"^dbq/[a-z][a-z0-9_]{0,39}/[a-z][a-z0-9_]{0,39}(/[a-z]{1,20})?$")


def ms_broker_name(name: str) -> str:
    """A Service Broker name dbq derives (`QueueNames.broker`), validated."""
    if not isinstance(name, str) or not _BROKER_NAME.fullmatch(name):
        raise UnsafeName(f"refusing to quote {name!r}: not a Service Broker name dbq derives")
    return name


def ms_broker_quote(name: str) -> str:
    """A validated Service Broker name, bracket-quoted (it contains '/')."""
    return f"[{ms_broker_name(name)}]"


def ms_broker_literal(name: str) -> str:
    """A validated Service Broker name as a string literal (catalog lookups, BEGIN DIALOG)."""
    return f"N'{ms_broker_name(name)}'"


def pg_literal(identifier: str) -> str:
    """A validated identifier as a string literal (metadata rows are keyed by queue name)."""
    return f"'{check_identifier(identifier, 'name')}'"


def ms_literal(identifier: str) -> str:
    return f"N'{check_identifier(identifier, 'name')}'"


def qualified_literal(backend: str, names: QueueNames) -> str:
    """schema.queue (`QueueNames.qualified`: both parts validated identifiers) as a literal."""
    return f"{'N' if backend == 'sqlserver' else ''}'{names.qualified}'"


# The backends reached through ODBC, and the quoting each one's SQL uses. (Cassandra's CQL
# quotes like PostgreSQL: `pg_quote`.)
QUOTE: dict[str, Callable[[str], str]] = {"postgres": pg_quote, "sqlserver": ms_quote}
LITERAL: dict[str, Callable[[str], str]] = {"postgres": pg_literal, "sqlserver": ms_literal}


# --- database roles (PostgreSQL; SQL Server database roles take the same names) -----------------
# Role names are cluster-wide on PostgreSQL: each is derived from what makes it unique (the
# database, schema and queue; a QueueUser's namespace and name) through a hash, with a readable
# part first, at most 63 bytes. The prefix tells the kind, and the role helper a DBA installs
# (`backends/postgres/access_helper.sql`) acts only on names of these shapes.
ROLE_PREFIX = {"owner": "dbq_o_", "group": "dbq_r_", "login": "dbq_u_"}
_ROLE = re.compile(r"^dbq_[oru]_[a-z0-9_]{1,57}$")


def role_name(kind: str, readable: str, *key: str) -> str:
    """A role of `kind` (owner, group, login): its prefix, up to 24 characters of `readable`
    (lower-cased, anything but letters and digits as '_'), then 8 hex digits of a hash of `key`."""
    text = re.sub(r"[^a-z0-9]+", "_", readable.lower()).strip("_")[:24].rstrip("_") or "x"
    digest = hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:8]
    return check_role(f"{ROLE_PREFIX[kind]}{text}_{digest}")


def check_role(name: str) -> str:
    if not isinstance(name, str) or not _ROLE.fullmatch(name):
        raise UnsafeName(
            f"refusing {name!r}: not a role name dbq derives (dbq_o_, dbq_r_ or dbq_u_ and a hash)"
        )
    return name


def owner_role(database: str, schema: str) -> str:
    """The NOLOGIN role that owns every object dbq makes in `schema` of `database`."""
    return role_name("owner", schema, database, schema)


def group_role(database: str, schema: str, entity: str, right: str) -> str:
    """The NOLOGIN role holding `right` (send, receive, ...) on queue or topic `entity` (a topic's
    name given as `topic:NAME`); a QueueUser's login is made a member of it."""
    return check_role(
        f"{role_name('group', entity.removeprefix('topic:'), database, schema, entity)}_{right}"
    )


def login_role(namespace: str, name: str) -> str:
    """The login of QueueUser `namespace/name`."""
    return role_name("login", name, namespace, name)
