"""Every CQL statement of the Cassandra "pipes" design, in one place.

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
- `<q>_pending`: leased messages, partitioned like `waiting`.
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
from dbq.backends.names import QueueNames, check_identifier

PIPES_SCHEMA_VERSION = 1
GC_GRACE_SECONDS = 3 * 3600
COMPACTION = {"class": "org.apache.cassandra.db.compaction.LeveledCompactionStrategy"}
COMPACTION_OPTIONS = {"unchecked_tombstone_compaction": "true", "tombstone_threshold": "0.2"}
BUCKET = 0  # the pipes table's single partition

OBSERVE_KEYSPACE = "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?"
OBSERVE_TABLES = (
    "SELECT table_name, gc_grace_seconds, compaction FROM system_schema.tables WHERE keyspace_name = ?"
)


def quote(name: str) -> str:
    return '"' + check_identifier(name, "identifier") + '"'


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


class PipesCql:
    """The statements of one queue; attributes are CQL text ready to prepare."""

    def __init__(self, names: QueueNames) -> None:
        self.names = names
        ks = quote(names.schema)
        self.keyspace = ks
        self.meta = f"{ks}.{quote(names.meta)}"
        self.history = f"{ks}.{quote(names.history)}"
        self.pipes = f"{ks}.{quote(names.pipes)}"
        self.state = f"{ks}.{quote(names.pipe_state)}"
        self.waiting = f"{ks}.{quote(names.waiting)}"
        self.pending = f"{ks}.{quote(names.pending)}"
        m, p, st, w, d = self.meta, self.pipes, self.state, self.waiting, self.pending
        counters = "pushed, requeued, popped, acquired, expired"

        # --- pusher --------------------------------------------------------------------------
        self.add_pipe = (
            f"INSERT INTO {p} (bucket, pipe, pusher, status, changed) VALUES ({BUCKET}, ?, ?, 'active', ?)"
        )
        self.open_pipe = (
            f"INSERT INTO {st} (pipe, pusher, created, finished, lease_until, {counters})"
            " VALUES (?, ?, ?, false, 0, 0, 0, 0, 0, 0)"
        )
        self.push = f"INSERT INTO {w} (pipe, msg, id, body, attempts, expires) VALUES (?, ?, ?, ?, ?, ?)"
        self.count_pushes = f"UPDATE {st} SET pushed = ?, requeued = ? WHERE pipe = ?"
        self.finish_pipe = f"UPDATE {st} SET finished = true WHERE pipe = ?"
        self.set_status = f"UPDATE {p} SET status = ?, changed = ? WHERE bucket = {BUCKET} AND pipe = ?"

        # --- popper ----------------------------------------------------------------------------
        self.list_pipes = f"SELECT pipe, status FROM {p} WHERE bucket = {BUCKET} AND pipe > ?"
        self.list_all_pipes = f"SELECT pipe, status FROM {p} WHERE bucket = {BUCKET}"
        self.pipe_state = (
            "SELECT toUnixTimestamp(created), finished, owner, toUnixTimestamp(lease_until), cursor,"
            f" {counters} FROM {st} WHERE pipe = ?"
        )
        self.claim = f"UPDATE {st} SET owner = ?, lease_until = ? WHERE pipe = ? IF lease_until = ?"
        self.renew = f"UPDATE {st} SET lease_until = ? WHERE pipe = ? IF owner = ?"
        self.release = f"UPDATE {st} SET lease_until = 0 WHERE pipe = ? IF owner = ?"
        take_cols = "msg, id, body, attempts, toUnixTimestamp(expires)"
        self.read_after = f"SELECT {take_cols} FROM {w} WHERE pipe = ? AND msg > ? LIMIT ?"
        self.read_head = f"SELECT {take_cols} FROM {w} WHERE pipe = ? LIMIT ?"
        self.delete_after = f"DELETE FROM {w} WHERE pipe = ? AND msg > ? AND msg <= ?"
        self.delete_head = f"DELETE FROM {w} WHERE pipe = ? AND msg <= ?"
        self.count_takes = f"UPDATE {st} SET cursor = ?, popped = ?, acquired = ?, expired = ? WHERE pipe = ?"
        self.lease_message = (
            f"INSERT INTO {d} (pipe, msg, id, body, attempts, expires, deadline, lease)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )

        # --- ack / nack / rollback ---------------------------------------------------------
        self.leases_of = f"SELECT msg, toUnixTimestamp(deadline), lease FROM {d} WHERE pipe = ? AND msg IN ?"
        self.ack = f"DELETE FROM {d} WHERE pipe = ? AND msg = ?"
        self.defer = f"UPDATE {d} SET deadline = ?, lease = ? WHERE pipe = ? AND msg = ? IF lease = ?"
        self.pending_of = (
            "SELECT msg, id, body, attempts, toUnixTimestamp(expires), toUnixTimestamp(deadline) FROM"
            f" {d} WHERE pipe = ?"
        )
        self.count_pending = f"SELECT count(*) FROM {d} WHERE pipe = ?"
        self.head_id = f"SELECT id FROM {w} WHERE pipe = ? AND msg > ? LIMIT 1"
        self.head_id_first = f"SELECT id FROM {w} WHERE pipe = ? LIMIT 1"

        # --- queue row: settings, retirement, maintenance lock -----------------------------
        retired = ", ".join(f"retired_{c}" for c in (*counters.split(", "), "pipes"))
        self.read_meta = (
            f"SELECT design, schema_version, max_pushes_per_pipe, max_push_time_ms, watermark, {retired}"
            f" FROM {m} WHERE queue = ?"
        )
        self.retire = (
            f"UPDATE {m} SET watermark = ?, "
            + ", ".join(f"{c} = ?" for c in retired.split(", "))
            + " WHERE queue = ? IF watermark = ?"
        )
        self.drop_state = f"DELETE FROM {st} WHERE pipe = ?"
        self.drop_waiting = f"DELETE FROM {w} WHERE pipe = ?"
        self.drop_pending = f"DELETE FROM {d} WHERE pipe = ?"
        self.drop_pipe_rows = f"DELETE FROM {p} WHERE bucket = {BUCKET} AND pipe <= ?"
        self.lock_state = f"SELECT maintainer, toUnixTimestamp(maintainer_until) FROM {m} WHERE queue = ?"
        self.lock = (
            f"UPDATE {m} SET maintainer = ?, maintainer_until = ? WHERE queue = ? IF maintainer_until = ?"
        )
        self.unlock = f"UPDATE {m} SET maintainer_until = 0 WHERE queue = ? IF maintainer = ?"

        # --- statistics history: timed by the operator's clock, kept for the retention (TTL) ---
        sample_cols = "depth, in_flight, pushed, popped, acquired, expired, oldest_age_s"
        self.record_sample = f"INSERT INTO {self.history} (queue, at, {sample_cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
        self.sample_since = (
            f"SELECT toUnixTimestamp(at), pushed, popped, acquired FROM {self.history}"
            " WHERE queue = ? AND at >= ? ORDER BY at ASC LIMIT 1"
        )
        self.forget_history = f"DELETE FROM {self.history} WHERE queue = ?"

        # --- provisioning --------------------------------------------------------------------
        self.record = (
            f"UPDATE {m} SET design = 'pipes', schema_version = ?, max_pushes_per_pipe = ?, max_push_time_ms = ?"
            " WHERE queue = ?"
        )
        self.recorded = (
            f"SELECT schema_version, max_pushes_per_pipe, max_push_time_ms FROM {m} WHERE queue = ?"
        )
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
    max_pushes_per_pipe int, max_push_time_ms bigint,
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
    pipe timeuuid, msg timeuuid, id timeuuid, body blob, attempts int, expires timestamp,
    PRIMARY KEY ((pipe), msg)
) WITH CLUSTERING ORDER BY (msg ASC) AND {TABLE_OPTIONS}""",
            self.names.pending: f"""CREATE TABLE IF NOT EXISTS {self.pending} (
    pipe timeuuid, msg timeuuid, id timeuuid, body blob, attempts int, expires timestamp,
    deadline timestamp, lease uuid,
    PRIMARY KEY ((pipe), msg)
) WITH CLUSTERING ORDER BY (msg ASC) AND {TABLE_OPTIONS}""",
        }[table]

    def tune_table(self, table: str) -> str:
        """Bring a queue table's compaction and gc_grace back to what dbq chose."""
        return f"ALTER TABLE {self.keyspace}.{quote(table)} WITH {TABLE_OPTIONS}"

    def drop_table(self, table: str) -> str:
        return f"DROP TABLE IF EXISTS {self.keyspace}.{quote(table)}"

    def drop_keyspace(self) -> str:
        return f"DROP KEYSPACE IF EXISTS {self.keyspace}"

    @property
    def queue_tables(self) -> tuple[str, ...]:
        return (self.names.pipes, self.names.pipe_state, self.names.waiting, self.names.pending)
