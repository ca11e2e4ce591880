"""The CQL that provisions the Cassandra "pipes" design: keyspace, tables, observation.

The statements a client runs on the tables are the contract in `dbq.contract.pipes`.

Identifiers come from `QueueNames` (validated) and are double-quoted here; every value is a bind
marker of a prepared statement, except the keyspace replication map, whose datacenter names the
API validates and which is rendered by `replication_literal` with quotes escaped.

Tables (per queue, in the keyspace `spec.connection.schema`):
- `<q>_pipes`: one partition listing the queue's pipes in creation order (timeuuid), with status
  active -> finished -> drained. Retired pipes are removed as one range at the head, so a listing
  never reads past row tombstones, and starts after the queue's watermark anyway.
- `<q>_state`: one row per pipe: its counters (pushed/requeued by its one pusher;
  popped/acquired/expired by its one leaseholder), its cursor, and its lease (owner,
  lease_until, written only by lightweight transactions). A row of its own, so reading a pipe's
  state never touches the deleted messages of its partition in `waiting`.
- `<q>_waiting`: one partition per pipe, messages in push order. A popper deletes what it took
  as one range behind its cursor and reads only after the cursor, so reads at the head never
  scan tombstones, and a pipe holds at most maxPushesPerPipe messages.
- `<q>_pending`: leased messages, partitioned like `waiting`; also rows marking content on its
  way in or out (lease `ENDING`), which repair finishes once their deadline passes.
- `<q>_content`: bodies past 32 KiB, in chunks of 256 KiB, one partition per message id (or per
  archive key, with the archive's TTL); the message's row leaves its body unset.
`state`, `waiting` and `pending` share the partition key (the pipe id), so a batch touching one
pipe in all three is a single mutation: a push (rows + count) or a take (delete + count + pending
rows) is atomic on every replica.
- `dbq_queues` (shared by the keyspace's queues): settings, schema version, the watermark below
  which pipes are retired and the totals of retired pipes (both moved by one conditional
  update), and the maintenance lock.

Compaction and tombstones: every queue table uses LeveledCompactionStrategy, so a partition
lives in few sstables (a pipe is written, read and deleted within minutes and every read is a
head read), with `unchecked_tombstone_compaction` so sstables full of deleted pipes are compacted
on their own. `gc_grace_seconds` is 3 hours, the default hint window: a replica down longer than
that needs a repair before it rejoins (as for any table), and tombstones of retired pipes are
purged after 3 hours instead of the default 10 days.
"""

from __future__ import annotations

from dbq.api.models import Replication
from dbq.contract.pipes import BUCKET, META_COLUMNS, PipesStatements
from dbq.names import QueueNames, pg_quote

GC_GRACE_SECONDS = 3 * 3600
COMPACTION = {"class": "org.apache.cassandra.db.compaction.LeveledCompactionStrategy"}
COMPACTION_OPTIONS = {"unchecked_tombstone_compaction": "true", "tombstone_threshold": "0.2"}

OBSERVE_KEYSPACE = "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?"
OBSERVE_COLUMNS = "SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?"
OBSERVE_TABLES = (
    "SELECT table_name, gc_grace_seconds, compaction FROM system_schema.tables WHERE keyspace_name = ?"
)


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def replication_map(replication: Replication) -> dict[str, str]:
    """The keyspace replication Cassandra should report for the spec."""
    if replication.datacenters:
        dcs = {dc: str(n) for dc, n in sorted(replication.datacenters.items())}
        return {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", **dcs}
    return {
        "class": "org.apache.cassandra.locator.SimpleStrategy",
        "replication_factor": str(replication.factor),
    }


def map_literal(values: dict[str, str]) -> str:
    return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in values.items()) + "}"


TABLE_OPTIONS = (
    f"compaction = {map_literal(COMPACTION | COMPACTION_OPTIONS)} AND gc_grace_seconds = {GC_GRACE_SECONDS}"
)

# Samples expire by TTL and are written in time order: time windows drop whole sstables.
HISTORY_OPTIONS = (
    "compaction = {'class': 'org.apache.cassandra.db.compaction.TimeWindowCompactionStrategy',"
    f" 'compaction_window_unit': 'HOURS', 'compaction_window_size': '6'}} AND gc_grace_seconds = {GC_GRACE_SECONDS}"
)


class PipesCql(PipesStatements):
    """The data-plane statements of one queue, and those that provision it."""

    def __init__(self, names: QueueNames, dead_letter_keeper: QueueNames | None = None) -> None:
        super().__init__(names, dead_letter_keeper)
        m = self.meta
        # --- provisioning --------------------------------------------------------------------
        self.record = (
            f"UPDATE {m} SET design = 'pipes', schema_version = ?, max_pushes_per_pipe = ?, max_push_time_ms = ?,"
            " max_attempts = ?, archive_ttl_s = ?, dead_letter_queue = ?, header_bytes = ?, max_headers = ?,"
            " max_body_bytes = ? WHERE queue = ?"
        )
        self.recorded = f"SELECT JSON * FROM {m} WHERE queue = ?"
        added = ", ".join(f"{column} {kind}" for column, kind in META_COLUMNS.items())
        self.add_meta_columns = f"ALTER TABLE {m} ADD IF NOT EXISTS ({added})"
        # Version 3: the dead table's rows name their source queue; older rows are this queue's.
        self.add_dead_source = f"ALTER TABLE {self.own_dead} ADD IF NOT EXISTS (source text)"
        self.unsourced_dead = f"SELECT id, source FROM {self.own_dead} WHERE bucket = {BUCKET}"
        self.set_dead_source = f"UPDATE {self.own_dead} SET source = ? WHERE bucket = {BUCKET} AND id = ?"
        self.forget = f"DELETE FROM {m} WHERE queue = ?"
        self.queues_in_keyspace = f"SELECT queue FROM {m}"

    # --- DDL, one method per planning step ---------------------------------------------------
    def create_keyspace(self, replication: dict[str, str]) -> str:
        return f"CREATE KEYSPACE IF NOT EXISTS {self.keyspace} WITH replication = {map_literal(replication)}"

    def alter_keyspace(self, replication: dict[str, str]) -> str:
        return f"ALTER KEYSPACE {self.keyspace} WITH replication = {map_literal(replication)}"

    def create_table(self, table: str) -> str:
        return {
            self.names.meta: f"""CREATE TABLE IF NOT EXISTS {self.meta} (
    queue text PRIMARY KEY, design text, schema_version int,
    max_pushes_per_pipe int, max_push_time_ms bigint, max_attempts int, archive_ttl_s int, dead_letter_queue text,
    header_bytes int, max_headers int, max_body_bytes int,
    watermark timeuuid, retired_pushed bigint, retired_requeued bigint, retired_popped bigint,
    retired_acquired bigint, retired_expired bigint, retired_pipes bigint,
    maintainer text, maintainer_until timestamp
) WITH gc_grace_seconds = {GC_GRACE_SECONDS}""",
            self.names.history: f"""CREATE TABLE IF NOT EXISTS {self.history} (
    queue text, at timestamp, depth bigint, in_flight bigint, pushed bigint, popped bigint,
    acquired bigint, expired bigint, oldest_age_s double,
    PRIMARY KEY ((queue), at)
) WITH CLUSTERING ORDER BY (at DESC) AND {HISTORY_OPTIONS}""",
            self.names.pipes: f"""CREATE TABLE IF NOT EXISTS {self.pipes} (
    bucket int, pipe timeuuid, pusher text, status text, changed timestamp,
    PRIMARY KEY ((bucket), pipe)
) WITH CLUSTERING ORDER BY (pipe ASC) AND {TABLE_OPTIONS}""",
            self.names.pipe_state: f"""CREATE TABLE IF NOT EXISTS {self.state} (
    pipe timeuuid PRIMARY KEY, pusher text, created timestamp, finished boolean,
    pushed int, requeued int, owner text, lease_until timestamp, cursor timeuuid,
    popped int, acquired int, expired int
) WITH {TABLE_OPTIONS}""",
            self.names.waiting: f"""CREATE TABLE IF NOT EXISTS {self.waiting} (
    pipe timeuuid, msg timeuuid, id timeuuid, body blob, attempts int, expires timestamp, headers text,
    PRIMARY KEY ((pipe), msg)
) WITH CLUSTERING ORDER BY (msg ASC) AND {TABLE_OPTIONS}""",
            self.names.pending: f"""CREATE TABLE IF NOT EXISTS {self.pending} (
    pipe timeuuid, msg timeuuid, id timeuuid, body blob, attempts int, expires timestamp,
    deadline timestamp, lease uuid, headers text,
    PRIMARY KEY ((pipe), msg)
) WITH CLUSTERING ORDER BY (msg ASC) AND {TABLE_OPTIONS}""",
            self.names.dead: f"""CREATE TABLE IF NOT EXISTS {self.own_dead} (
    bucket int, id timeuuid, source text, attempts int, error text, dead_at timestamp, body blob,
    moving_until timestamp, headers text,
    PRIMARY KEY ((bucket), id)
) WITH CLUSTERING ORDER BY (id ASC) AND {TABLE_OPTIONS}""",
            self.names.delayed: f"""CREATE TABLE IF NOT EXISTS {self.delayed} (
    bucket int, due timestamp, id timeuuid, body blob, expires timestamp, moving_until timestamp, headers text,
    PRIMARY KEY ((bucket), due, id)
) WITH CLUSTERING ORDER BY (due ASC, id ASC) AND {TABLE_OPTIONS}""",
            self.names.archive: f"""CREATE TABLE IF NOT EXISTS {self.archive} (
    hour int, acked timeuuid, id timeuuid, attempts int, body blob, headers text,
    PRIMARY KEY ((hour), acked, id)
) WITH CLUSTERING ORDER BY (acked ASC, id ASC) AND {TABLE_OPTIONS}""",
            self.names.content: f"""CREATE TABLE IF NOT EXISTS {self.content} (
    id timeuuid, chunk int, data blob, size bigint static,
    PRIMARY KEY ((id), chunk)
) WITH CLUSTERING ORDER BY (chunk ASC) AND {TABLE_OPTIONS}""",
            self.names.staged: f"""CREATE TABLE IF NOT EXISTS {self.staged} (
    stage text, seq bigint, first_seq bigint, packed blob,
    PRIMARY KEY ((stage), seq)
) WITH CLUSTERING ORDER BY (seq ASC) AND {TABLE_OPTIONS}""",
        }[table]

    def add_headers(self, table: str) -> str:
        """Version 4: a message table made before it gains the headers column (NULL: none)."""
        return f"ALTER TABLE {self.keyspace}.{pg_quote(table)} ADD IF NOT EXISTS (headers text)"

    def tune_table(self, table: str) -> str:
        """Bring a queue table's compaction and gc_grace back to what dbq chose."""
        return f"ALTER TABLE {self.keyspace}.{pg_quote(table)} WITH {TABLE_OPTIONS}"

    def drop_table(self, table: str) -> str:
        return f"DROP TABLE IF EXISTS {self.keyspace}.{pg_quote(table)}"

    def drop_keyspace(self) -> str:
        return f"DROP KEYSPACE IF EXISTS {self.keyspace}"
