"""All T-SQL of the ring queue on SQL Server: DDL per planning step, procedures, observation.

The same ring as on PostgreSQL (see `dbq.backends.postgres.sql`), rendered for SQL Server:
a clustered key on `slot` only, ROWLOCK updates that touch no indexed column, sequences with a
server-wide CACHE (SQL Server hands cached values out in order to every session; an unclean
shutdown loses the rest of the cache, which is a hole the poppers skip), and
`sys.sp_sequence_get_range` to reserve a contiguous range for a batch. READPAST is SQL
Server's SKIP LOCKED. Procedures answer like the PostgreSQL functions (take/pop/pop_many with
packed records, see `RECORD`), so the client reads both alike.

Identifiers come from `QueueNames` (validated) and are bracket-quoted by `quote()`; numbers are
validated integers; values are bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from dbq.backends.ring_sql import RingSqlBase
from dbq.backends.sqlserver import server
from dbq.contract.access import RING_RIGHTS, Right
from dbq.contract.broker import SEQUENCE_DRAWN
from dbq.contract.ring import RING_SCHEMA_VERSION, RingTarget
from dbq.names import check_identifier, check_role, qualified_literal
from dbq.names import ms_literal as literal
from dbq.names import ms_quote as quote

SEQUENCE_CACHE = 1000
# What a resize's switch raises when the pushes kept the fence past its wait.
FENCE_BUSY = "dbq: the resize fence is busy"
MAX_BODY = 7000  # spec.ring.messageBytes at most: a row stays within one 8 KB page


def _record(status: str, msg_id: str, lease: str, attempts: str, headers: str, body: str) -> str:
    """One packed take/pop record (see `dbq.contract.ring.RECORD`) built from T-SQL expressions;
    the headers as nvarchar's bytes (UTF-16LE)."""
    return (
        f"CAST(CAST({status} AS tinyint) AS binary(1)) + CAST(CAST(ISNULL({msg_id}, 0) AS bigint) AS binary(8))"
        f" + CAST(CAST(ISNULL({lease}, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL({attempts}, 0) AS int) AS binary(4))"
        f" + CAST(CAST(ISNULL(DATALENGTH({headers}), 0) AS int) AS binary(4))"
        f" + CAST(CAST(ISNULL(DATALENGTH({body}), 0) AS int) AS binary(4))"
        f" + ISNULL(CAST({headers} AS varbinary(max)), 0x) + ISNULL({body}, 0x)"
    )


def _dead_headers(headers: str, error: str, attempts: str) -> str:
    """A dead letter's headers from T-SQL expressions: the message's, with why it died (when
    known) and after how many attempts (JSON_MODIFY with a NULL value adds nothing)."""
    return (
        f"JSON_MODIFY(JSON_MODIFY(ISNULL({headers}, N'{{}}'), N'$.\"dbq-error\"', {error}),"
        f" N'$.\"dbq-attempts\"', {attempts})"
    )


# Releases a session-owned applock (parameter: its name) only when held: sp_releaseapplock of a
# lock not held is an error.
_RELEASE_SESSION_LOCK = (
    "DECLARE @lock nvarchar(255) = ?, @released int;"
    " IF APPLOCK_MODE('public', @lock, 'Session') <> 'NoLock'"
    " EXEC @released = sys.sp_releaseapplock @Resource = @lock, @LockOwner = 'Session';"
)


class MsRing(RingSqlBase):
    # Client-facing verbs plus the internal place/claim/next (INSERT ... EXEC cannot nest, so
    # procedures call each other through OUTPUT parameters).
    ROUTINES: tuple[str, ...] = ("place", "claim", "next", "push", "push_many", "take", "pop", "pop_many",
                                 "release", "ack", "ack_many", "nack", "repair", "void_holes", "stats",
                                 "defer", "extend", "redrive", "purge_dead", "scavenge", "body_of",
                                 "read", "send", "send_batch", "delete", "archive", "set_vt")  # fmt: skip
    ROUTINE_KIND = "PROCEDURE"
    NOW = "SYSUTCDATETIME()"

    TEMPLATE_PACKAGE = __package__ or "dbq.backends.sqlserver"
    TEMPLATE_FILE = "ring_procedures.sql"
    BACKEND = "sqlserver"
    # Checked when planning; below the floor the queue is refused (dbq.backends.sqlserver.server).
    SERVER_VERSION: str | None = server.SERVER_VERSION

    def __init__(self, target: RingTarget) -> None:
        super().__init__(target, quote, literal)
        if not 16 <= self.message_bytes <= MAX_BODY:
            raise ValueError(f"message_bytes {self.message_bytes} outside 16..{MAX_BODY}")

    @property
    def fence_lock(self) -> str:
        """The applock pushes take shared and a resize's switch exclusively, as an N'' literal."""
        return f"N'dbq-fence:{self.t.names.schema}.{self.t.names.queue}'"

    def slot_of(self, position: str) -> str:
        """The slot of `position` (a T-SQL expression), from the generation holding it: NULL for a
        position older than every generation alive."""
        return (
            f"(SELECT TOP (1) gen.slot_base + ({position}) % gen.size FROM {self.gens} gen"
            f" WHERE gen.first_pos <= ({position}) ORDER BY gen.first_pos DESC)"
        )

    def template_values(self) -> dict[str, object]:
        # The last positions both sequences drew, from one read of sys.sequences.
        drawn = (
            f"(SELECT MAX(CASE WHEN object_id = OBJECT_ID(N'{self.push_seq}') THEN {SEQUENCE_DRAWN} END) AS pushed,"
            f" MAX(CASE WHEN object_id = OBJECT_ID(N'{self.pop_seq}') THEN {SEQUENCE_DRAWN} END) AS popped"
            f" FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'{self.push_seq}'), OBJECT_ID(N'{self.pop_seq}')))"
        )

        def room_in(gen: str) -> str:  # the free slots of generation row `gen`, beside `drawn` as s
            return f"{gen}.size - (s.pushed - CASE WHEN s.popped > {gen}.first_pos - 1 THEN s.popped ELSE {gen}.first_pos - 1 END)"

        return super().template_values() | {
            # Resizing (version 24 on), as on PostgreSQL: the slot of a position from its
            # generation; the free slots and the size of the newest generation; the fence, taken
            # inside the transaction push and push_many open (hence @@TRANCOUNT is known).
            "slot_of": self.slot_of,
            "room_in": room_in,
            "drawn_pair": drawn,
            "room": f"(SELECT TOP (1) {room_in('gen')} FROM {self.gens} gen CROSS JOIN {drawn} s ORDER BY gen.first_pos DESC)",
            "newest_size": f"(SELECT TOP (1) gen.size FROM {self.gens} gen ORDER BY gen.first_pos DESC)",
            "fence": f"EXEC @fenced = sys.sp_getapplock @Resource = {self.fence_lock}, @LockMode = 'Shared',"
            " @LockOwner = 'Transaction';\n"
            "  IF @fenced < 0 OR @@TRANCOUNT = 0\n"
            f"    THROW 50010, N'dbq: a push to queue {self.t.names.queue} did not get the resize fence', 1;",
            "record": _record("@status", "@id", "@lease", "@attempts", "@headers", "@body"),
            "drawn": SEQUENCE_DRAWN,
            "take_record": _record("@status", "@pos", "@lease", "@attempts", "@headers", "@body"),
            "out_record": _record("o_status", "o_id", "o_lease", "o_attempts", "o_headers", "o_body"),
            "nack_dead_headers": _dead_headers("t.headers", "LEFT(@error, 4000)", "t.attempts"),
            "repair_dead_headers": _dead_headers(
                "l.headers", "N'lease expired (visibility timeout)'", "l.attempts"
            ),
        }

    def _object_missing(self, qualified: str, kind: str) -> str:
        return f"IF OBJECT_ID(N'{qualified}', N'{kind}') IS NULL"

    # --- provisioning, one method per planning step ------------------------------------------
    def create_schema(self) -> list[str]:
        # CREATE SCHEMA must be alone in its batch, hence EXEC.
        return [f"IF SCHEMA_ID({literal(self.schema_name)}) IS NULL EXEC(N'CREATE SCHEMA {self.schema}')"]

    def create_meta(self) -> list[str]:
        return [
            f"""{self._object_missing(self.meta, "U")}
CREATE TABLE {self.meta} (
  queue nvarchar(128) NOT NULL PRIMARY KEY,
  design nvarchar(16) NOT NULL,
  schema_version int NOT NULL,
  ring_size bigint NOT NULL,
  message_bytes int NOT NULL,
  max_attempts int NOT NULL DEFAULT 0,
  archive int NOT NULL DEFAULT 0,
  dead_letter_queue nvarchar(300) NOT NULL DEFAULT N'',
  header_bytes int NOT NULL DEFAULT 1024,
  max_headers int NOT NULL DEFAULT 32,
  max_body_bytes int NOT NULL DEFAULT 1048576,
  created_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME(),
  updated_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME())"""
        ]

    def create_ring(self) -> list[str]:
        return [
            f"""{self._object_missing(self.ring, "U")}
CREATE TABLE {self.ring} (
  slot bigint NOT NULL PRIMARY KEY CLUSTERED,
  msg_id bigint NULL,
  state tinyint NOT NULL DEFAULT 0,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at datetime2(3) NULL,
  visible_at datetime2(3) NULL,
  expires_at datetime2(3) NULL,
  body varbinary({MAX_BODY}) NULL,
  headers nvarchar(max) NULL)"""
        ]

    def fill_ring(self) -> list[str]:
        # A new table, no client yet: one table lock rather than a lock per row.
        return [self._insert_slots(0, self.size, " WITH (TABLOCK)")]

    def _insert_slots(self, lo: int, hi: int, hint: str = "") -> str:
        # Slots start with a body of full size, so later pushes never grow a row (no page splits).
        return f"""WITH n AS (
  SELECT TOP ({int(hi) - int(lo)}) {int(lo)} + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS slot
  FROM sys.all_columns a CROSS JOIN sys.all_columns b CROSS JOIN sys.all_columns c)
INSERT INTO {self.ring}{hint} (slot, state, body)
SELECT n.slot, 0, CAST(REPLICATE(CAST(0x00 AS varbinary(max)), {self.message_bytes}) AS varbinary({MAX_BODY}))
FROM n WHERE NOT EXISTS (SELECT 1 FROM {self.ring} r WHERE r.slot = n.slot)"""

    def create_sequences(self) -> list[str]:
        return [
            f"{self._object_missing(seq, 'SO')}\n"
            f"CREATE SEQUENCE {seq} AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE {SEQUENCE_CACHE}"
            for seq in self.sequences
        ]

    def reset_positions(self) -> list[str]:
        # ALTER SEQUENCE takes no variables: build it from the validated name and an integer.
        return [
            f"""DECLARE @level bigint = (SELECT MAX({SEQUENCE_DRAWN}) + 1
  FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'{self.push_seq}'), OBJECT_ID(N'{self.pop_seq}')));
DECLARE @sql nvarchar(max) =
  N'ALTER SEQUENCE {self.push_seq} RESTART WITH ' + CAST(@level AS nvarchar(20)) + N'; ' +
  N'ALTER SEQUENCE {self.pop_seq} RESTART WITH ' + CAST(@level AS nvarchar(20)) + N'; ' +
  N'DECLARE @n bigint; SET @n = NEXT VALUE FOR {self.push_seq}; SET @n = NEXT VALUE FOR {self.pop_seq};';
EXEC sys.sp_executesql @sql"""
        ]

    def key_dead_letters(self) -> list[str]:
        """A version 8 or 9 dead-letter table gains its source column (every row is this queue's)
        and the key (source, msg_id). The statements that use the new column are compiled when
        run (sp_executesql), after the column exists."""
        dead = self.own_dead
        return [
            f"""IF COL_LENGTH(N'{dead}', 'source') IS NULL
BEGIN
  ALTER TABLE {dead} ADD source nvarchar(300) NULL;
  EXEC sys.sp_executesql N'UPDATE {dead} SET source = @source', N'@source nvarchar(300)',
    @source = {qualified_literal("sqlserver", self.t.names)};
  EXEC sys.sp_executesql N'ALTER TABLE {dead} ALTER COLUMN source nvarchar(300) NOT NULL';
  DECLARE @sql nvarchar(max) = N'ALTER TABLE {dead} DROP CONSTRAINT ' + QUOTENAME((SELECT name
    FROM sys.key_constraints WHERE parent_object_id = OBJECT_ID(N'{dead}') AND type = 'PK'));
  EXEC sys.sp_executesql @sql;
  EXEC sys.sp_executesql N'ALTER TABLE {dead} ADD PRIMARY KEY CLUSTERED (source, msg_id)';
END"""
        ]

    def seed_settled(self) -> list[str]:
        # ALTER SEQUENCE takes no variables: built from the validated name and an integer. The
        # NEXT VALUE after the restart makes the settled total the last value given out.
        settled, acquired = self.count["settled"], self.count["acquired"]
        return [
            f"""DECLARE @settled bigint = (SELECT {SEQUENCE_DRAWN} FROM sys.sequences
  WHERE object_id = OBJECT_ID(N'{acquired}'))
  - (SELECT COUNT_BIG(*) FROM {self.ring} WHERE state = 2) - (SELECT COUNT_BIG(*) FROM {self.spill} WHERE state = 2);
IF @settled > 0
BEGIN
  DECLARE @sql nvarchar(max) = N'ALTER SEQUENCE {settled} RESTART WITH ' + CAST(@settled AS nvarchar(20));
  EXEC sys.sp_executesql @sql;
  SET @sql = N'DECLARE @n bigint; SET @n = NEXT VALUE FOR {settled};';
  EXEC sys.sp_executesql @sql;
END"""
        ]

    def create_side_tables(self) -> list[str]:
        return [
            f"""{self._object_missing(self.spill, "U")}
CREATE TABLE {self.spill} (
  msg_id bigint NOT NULL PRIMARY KEY CLUSTERED,
  state tinyint NOT NULL,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at datetime2(3) NOT NULL,
  visible_at datetime2(3) NOT NULL,
  expires_at datetime2(3) NULL,
  body varbinary(max) NULL,
  headers nvarchar(max) NULL)""",
            f"""{self._object_missing(self.gap, "U")}
CREATE TABLE {self.gap} (
  pos bigint NOT NULL PRIMARY KEY CLUSTERED,
  reason varchar(8) NOT NULL CHECK (reason IN ('void', 'skipped')),
  noted_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME())""",
            f"""{self._object_missing(self.staged, "U")}
CREATE TABLE {self.staged} (
  stage nvarchar(200) NOT NULL,
  seq bigint NOT NULL,
  first_seq bigint NOT NULL,
  packed varbinary(max) NOT NULL,
  PRIMARY KEY CLUSTERED (stage, seq))""",
            # Keyed by source queue (schema.queue) too: other queues may keep theirs here.
            f"""{self._object_missing(self.own_dead, "U")}
CREATE TABLE {self.own_dead} (
  source nvarchar(300) NOT NULL,
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  error nvarchar(4000) NULL,
  pushed_at datetime2(3) NOT NULL,
  dead_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME(),
  body varbinary(max) NOT NULL,
  headers nvarchar(max) NULL,
  PRIMARY KEY CLUSTERED (source, msg_id))""",
            # Kept like PostgreSQL's (SQL Server has no LISTEN/NOTIFY: its clients poll).
            f"""{self._object_missing(self.waiters, "U")}
CREATE TABLE {self.waiters} (
  id int NOT NULL PRIMARY KEY CHECK (id = 1),
  until datetime2(3) NOT NULL)""",
            f"IF NOT EXISTS (SELECT 1 FROM {self.waiters}) INSERT INTO {self.waiters} (id, until) VALUES (1, '0001-01-01')",
            # Insert-only, read and scavenged by time: clustered on the time.
            f"""{self._object_missing(self.archive, "U")}
CREATE TABLE {self.archive} (
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  pushed_at datetime2(3) NOT NULL,
  acked_at datetime2(3) NOT NULL,
  body varbinary(max) NOT NULL,
  headers nvarchar(max) NULL,
  INDEX {quote(self.t.names.archive_index)} CLUSTERED (acked_at))""",
            *self.index_spill(),
            *self.create_content(),
        ]

    def create_content(self) -> list[str]:
        # A body larger than a slot while its message is in the ring or the spill table (see
        # PgRing.create_content): the key leads with msg_id % buckets.
        return [
            f"""{self._object_missing(self.content, "U")}
CREATE TABLE {self.content} (
  bucket smallint NOT NULL,
  msg_id bigint NOT NULL,
  body varbinary(max) NOT NULL,
  PRIMARY KEY CLUSTERED (bucket, msg_id))""",
            # The ring's generations (version 24 on), as on PostgreSQL: one, the ring as made.
            f"""{self._object_missing(self.gens, "U")}
CREATE TABLE {self.gens} (
  first_pos bigint NOT NULL PRIMARY KEY CLUSTERED,
  slot_base bigint NOT NULL,
  size bigint NOT NULL CHECK (size > 0),
  started_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME())""",
            f"""INSERT INTO {self.gens} (first_pos, slot_base, size)
SELECT 1, 0, coalesce((SELECT ring_size FROM {self.meta} WHERE queue = {self.literal(self.t.names.queue)}), {self.size})
WHERE NOT EXISTS (SELECT 1 FROM {self.gens})""",
        ]

    def set_compression(self) -> list[str]:
        """Never planned: SQL Server stores bodies as they come (spec.messages.compression is
        PostgreSQL's, refused at admission on this backend)."""
        return []

    def allow_content(self) -> list[str]:
        """A queue of version 17 or older: spilled, dead and archived messages may hold a body past
        a slot (varbinary(max)), a spilled one's may be in the content table (NULL; the table
        itself comes with the missing side tables)."""
        return [
            f"ALTER TABLE {self.spill} ALTER COLUMN body varbinary(max) NULL",
            f"ALTER TABLE {self.own_dead} ALTER COLUMN body varbinary(max) NOT NULL",
            f"ALTER TABLE {self.archive} ALTER COLUMN body varbinary(max) NOT NULL",
        ]

    def add_headers(self) -> list[str]:
        """A queue of version 15 or older: its message tables gain the headers column (NULL: no
        headers, a metadata-only change)."""
        return [
            f"IF COL_LENGTH(N'{table}', 'headers') IS NULL ALTER TABLE {table} ADD headers nvarchar(max) NULL"
            for table in (self.ring, self.spill, self.own_dead, self.archive)
        ]

    def index_spill(self) -> list[str]:
        index = self.t.names.spill_index
        return [
            f"IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'{self.spill}') AND name = {literal(index)})"
            f" CREATE INDEX {quote(index)} ON {self.spill} (state, visible_at)"
        ]

    def create_history(self) -> list[str]:
        return [
            f"""{self._object_missing(self.history, "U")}
CREATE TABLE {self.history} (
  queue nvarchar(128) NOT NULL,
  at datetime2(3) NOT NULL,
  depth bigint NOT NULL,
  in_flight bigint NOT NULL,
  pushed bigint NOT NULL,
  popped bigint NOT NULL,
  acquired bigint NOT NULL,
  expired bigint NOT NULL,
  oldest_age_s float NOT NULL,
  PRIMARY KEY CLUSTERED (queue, at))"""
        ]

    def purge_histories(self, queues: Sequence[str]) -> str:
        """Drop the samples of `queues` older than the retention (parameter: seconds)."""
        return (
            f"DELETE FROM {self.history} WHERE {self.history_of(queues)}"
            " AND at < DATEADD(second, -CAST(? AS int), SYSUTCDATETIME())"
        )

    def sample_since(self) -> str:
        """The oldest sample at most `window` s old (parameter: window seconds): its age in
        seconds, pushed and taken (popped + acquired) totals."""
        return (
            f"SELECT TOP 1 DATEDIFF_BIG(millisecond, at, SYSUTCDATETIME()) / 1000.0, pushed, popped + acquired"
            f" FROM {self.history} WHERE queue = {literal(self.t.names.queue)}"
            " AND at >= DATEADD(second, -CAST(? AS int), SYSUTCDATETIME()) ORDER BY at"
        )

    # --- maintenance (parameter: schema name) ---------------------------------------------------
    def maintenance_tables(self) -> str:
        """SQL Server has no dead rows to vacuum (ghost cleanup is automatic): no table figures."""
        return "SELECT name, 0, 0 FROM sys.objects WHERE 1 = 0 AND schema_id = SCHEMA_ID(?)"

    def maintenance_indexes(self) -> str:
        """Per leaf level of a queue table's index: index, table, pages, rows, fragmentation %."""
        return (
            "SELECT i.name, o.name, ps.page_count, 0, ps.avg_fragmentation_in_percent"
            " FROM sys.dm_db_index_physical_stats(DB_ID(), NULL, NULL, NULL, 'LIMITED') AS ps"
            " JOIN sys.indexes AS i ON i.object_id = ps.object_id AND i.index_id = ps.index_id"
            " JOIN sys.objects AS o ON o.object_id = ps.object_id"
            f" WHERE o.schema_id = SCHEMA_ID(?) AND o.name IN ({self._queue_tables_list()})"
            " AND ps.index_level = 0 AND i.name IS NOT NULL"
        )

    def online_capable(self) -> str:
        """Online rebuilds need Enterprise or Developer (3), Azure SQL Database (5) or Managed Instance (8)."""
        return "SELECT CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END"

    def maintenance_action(self, action: str, target: str, table: str, online: bool) -> str:
        index = quote(check_identifier(target, "index name"))
        on = f"{self.schema}.{quote(check_identifier(table, 'table name'))}"
        if action == "reorganize":
            return f"ALTER INDEX {index} ON {on} REORGANIZE"
        if action == "rebuild":
            return f"ALTER INDEX {index} ON {on} REBUILD{' WITH (ONLINE = ON)' if online else ''}"
        raise ValueError(f"SQL Server has no maintenance action {action!r}")

    def try_maintenance_lock(self) -> str:
        """A session application lock (parameter: lock name), not waited for: 1 when granted."""
        return (
            "DECLARE @granted int; EXEC @granted = sp_getapplock @Resource = ?, @LockMode = 'Exclusive',"
            " @LockOwner = 'Session', @LockTimeout = 0; SELECT CASE WHEN @granted >= 0 THEN 1 ELSE 0 END"
        )

    def maintenance_unlock(self) -> str:
        return _RELEASE_SESSION_LOCK + " SELECT 1"

    def record_version(self) -> list[str]:
        # The columns come first, in batches of their own: the MERGE is compiled against them.
        attempts, archive = int(self.t.max_attempts), int(self.t.archive)
        keeper = self._dead_letter_queue()
        return [
            *(
                f"IF COL_LENGTH(N'{self.meta}', '{column}') IS NULL\n"
                f"ALTER TABLE {self.meta} ADD {column} int NOT NULL DEFAULT 0"
                for column in ("max_attempts", "archive")
            ),
            f"IF COL_LENGTH(N'{self.meta}', 'dead_letter_queue') IS NULL\n"
            f"ALTER TABLE {self.meta} ADD dead_letter_queue nvarchar(300) NOT NULL DEFAULT N''",
            *(
                f"IF COL_LENGTH(N'{self.meta}', '{column}') IS NULL\n"
                f"ALTER TABLE {self.meta} ADD {column} int NOT NULL DEFAULT {default}"
                for column, default in (
                    ("header_bytes", 1024),
                    ("max_headers", 32),
                    ("max_body_bytes", 1048576),
                )
            ),
            f"""MERGE {self.meta} WITH (HOLDLOCK) AS m
USING (SELECT {literal(self.t.names.queue)} AS queue) AS s ON m.queue = s.queue
WHEN MATCHED THEN UPDATE SET schema_version = {RING_SCHEMA_VERSION}, message_bytes = {self.message_bytes},
  max_attempts = {attempts}, archive = {archive}, dead_letter_queue = {keeper}, header_bytes = {self.header_bytes},
  max_headers = {self.max_headers}, max_body_bytes = {self.max_body_bytes}, updated_at = SYSUTCDATETIME()
WHEN NOT MATCHED THEN INSERT (queue, design, schema_version, ring_size, message_bytes, max_attempts, archive,
    dead_letter_queue, header_bytes, max_headers, max_body_bytes)
  VALUES (s.queue, N'ring', {RING_SCHEMA_VERSION}, {self.size}, {self.message_bytes}, {attempts}, {archive}, {keeper},
    {self.header_bytes}, {self.max_headers}, {self.max_body_bytes});""",
        ]

    def secure(self) -> list[str]:
        """A database role owns the schema (its objects, owned by the schema's owner, with it), so
        the procedures reach the tables by ownership chaining; each right's database role holds
        EXECUTE on its procedures. A client on SQL Server reads the metadata row, peeks, the
        history, dead letters and the archive with SELECTs (its routines for those are
        PostgreSQL's): those tables are granted to the rights that read them."""
        n, owner = self.t.names, quote(self.owner)
        out = [*self.create_roles(), f"ALTER AUTHORIZATION ON SCHEMA::{self.schema} TO {owner}"]
        reads = {
            Right.PEEK: (self.ring, self.spill, self.content),
            Right.MONITOR: (self.history,),
            Right.MANAGE: (self.own_dead, self.dead, self.archive),
        }
        for right, verbs in RING_RIGHTS.items():
            group = quote(self.groups[right])
            procedures = [self.fn[v] for v in verbs if v in self.fn]
            out += [f"GRANT EXECUTE ON OBJECT::{p} TO {group}" for p in procedures]
            out += [f"GRANT SELECT ON OBJECT::{t} TO {group}" for t in (self.meta, *reads.get(right, ()))]
        keeper = self.t.dead_letter_keeper
        if keeper is not None and keeper.schema != n.schema:
            out.append(f"GRANT SELECT, INSERT, UPDATE, DELETE ON OBJECT::{self.dead} TO {owner}")
        return out

    def create_roles(self) -> list[str]:
        """The schema's owner role and the queue's group roles (owned by it), made if missing."""
        owner = quote(self.owner)
        out = [f"IF DATABASE_PRINCIPAL_ID({_role(self.owner)}) IS NULL CREATE ROLE {owner}"]
        out += [
            f"IF DATABASE_PRINCIPAL_ID({_role(g)}) IS NULL CREATE ROLE {quote(g)} AUTHORIZATION {owner}"
            for g in self.groups.values()
        ]
        return out

    def drop_roles(self) -> list[str]:
        """After drop(): each group role, its members dropped first; the owner role once its
        schema is gone."""
        out = []
        for group in self.groups.values():
            role = _role(group)
            out.append(
                f"IF DATABASE_PRINCIPAL_ID({role}) IS NOT NULL BEGIN\n"
                "  DECLARE @drop nvarchar(max) = N'';\n"
                f"  SELECT @drop = @drop + N'ALTER ROLE {quote(group)} DROP MEMBER ' + QUOTENAME(USER_NAME(member_principal_id))"
                f" + N'; ' FROM sys.database_role_members WHERE role_principal_id = DATABASE_PRINCIPAL_ID({role});\n"
                "  EXEC(@drop);\n"
                f"  DROP ROLE {quote(group)};\n"
                "END"
            )
        out.append(
            f"IF SCHEMA_ID({literal(self.schema_name)}) IS NULL AND DATABASE_PRINCIPAL_ID({_role(self.owner)})"
            f" IS NOT NULL DROP ROLE {quote(self.owner)}"
        )
        return out

    # --- teardown (drop() is shared) ---------------------------------------------------------
    def drop_schema_if_unused(self) -> list[str]:
        return [
            f"IF NOT EXISTS (SELECT 1 FROM {self.meta}) DROP TABLE IF EXISTS {self.meta}, {self.history};\n"
            f"IF NOT EXISTS (SELECT 1 FROM sys.objects WHERE schema_id = SCHEMA_ID({literal(self.schema_name)}))\n"
            f"  EXEC(N'DROP SCHEMA {self.schema}')"
        ]

    # --- online resize (`dbq.backends.ring_resize`; the dialect's part) --------------------------
    # Below SQL Server's lock escalation (5,000 locks a statement), so a chunk never locks the
    # whole ring table.
    RESIZE_CHUNK = 4_000

    def last_drawn(self, sequence: str) -> str:
        return f"(SELECT {SEQUENCE_DRAWN} FROM sys.sequences WHERE object_id = OBJECT_ID(N'{sequence}'))"

    def try_resize_lock(self) -> str:
        return (
            "SET NOCOUNT ON; DECLARE @got int;\n"
            "EXEC @got = sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session',"
            " @LockTimeout = 0;\n"
            "SELECT CASE WHEN @got >= 0 THEN 1 ELSE 0 END"
        )

    def resize_unlock(self) -> str:
        return _RELEASE_SESSION_LOCK

    def prepare_slots(self, lo: int, hi: int) -> str:
        return self._insert_slots(lo, hi)

    def switch(self, base: int, size: int, wait_ms: int) -> str:
        return f"""SET NOCOUNT ON; SET XACT_ABORT ON;
DECLARE @fenced int, @boundary bigint, @updated int;
BEGIN TRANSACTION;
EXEC @fenced = sys.sp_getapplock @Resource = {self.fence_lock}, @LockMode = 'Exclusive',
  @LockOwner = 'Transaction', @LockTimeout = {int(wait_ms)};
IF @fenced < 0 OR @@TRANCOUNT = 0 THROW 50011, N'{FENCE_BUSY}', 1;
SET @boundary = {self.last_drawn(self.push_seq)} + 1;
UPDATE {self.gens} SET slot_base = {int(base)}, size = {int(size)}, started_at = SYSUTCDATETIME()
WHERE first_pos = @boundary;
SET @updated = @@ROWCOUNT;
IF @updated = 0
  INSERT INTO {self.gens} (first_pos, slot_base, size) VALUES (@boundary, {int(base)}, {int(size)});
UPDATE {self.meta} SET ring_size = {int(size)}, updated_at = SYSUTCDATETIME() WHERE queue = {literal(self.t.names.queue)};
COMMIT TRANSACTION;"""

    def fence_busy(self, state: str, text: str) -> bool:
        return FENCE_BUSY in text

    def retire(self, first_pos: int, lo: int, hi: int) -> tuple[str, str]:
        in_range = f"slot >= {int(lo)} AND slot < {int(hi)}"
        return (
            # In chunks below lock escalation; READPAST skips the rows a client holds right now.
            f"""SET NOCOUNT ON;
DECLARE @moved int = 1;
WHILE @moved > 0 BEGIN
  UPDATE TOP ({self.RESIZE_CHUNK}) {self.ring} WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, CASE WHEN deleted.lease > 0 THEN 2 ELSE 1 END, deleted.lease, deleted.attempts,
    deleted.pushed_at, CASE WHEN deleted.lease > 0 THEN deleted.visible_at ELSE SYSUTCDATETIME() END,
    deleted.expires_at, deleted.body, deleted.headers
  INTO {self.spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  WHERE {in_range} AND state <> 0;
  SET @moved = @@ROWCOUNT;
END""",
            f"""SET NOCOUNT ON;
DECLARE @gone int;
DELETE FROM {self.gens} WHERE first_pos = {int(first_pos)}
  AND first_pos < (SELECT MAX(first_pos) FROM {self.gens})
  AND NOT EXISTS (SELECT 1 FROM {self.ring} WHERE {in_range} AND state <> 0);
SET @gone = @@ROWCOUNT;
SELECT @gone""",
        )

    # --- observation: the same shapes as the PostgreSQL queries (kinds r = table, S = sequence)
    OBSERVE_SCHEMA = "SELECT COUNT(*) FROM sys.schemas WHERE name = ?"
    OBSERVE_RELATIONS = (
        "SELECT o.name, CASE o.type WHEN 'U' THEN 'r' WHEN 'SO' THEN 'S' END FROM sys.objects o "
        "WHERE o.schema_id = SCHEMA_ID(?) AND o.type IN ('U', 'SO') AND o.name IN (SELECT value FROM STRING_SPLIT(?, ','))"
    )
    OBSERVE_ROUTINES = (
        "SELECT o.name FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(?) AND o.type = 'P'"
        " AND o.name IN (SELECT value FROM STRING_SPLIT(?, ','))"
    )

    def advisory_lock(self) -> str:
        """Serialises changes to one schema. Session-owned, released by `advisory_unlock` after
        the transaction: a Transaction-owned applock needs an open transaction, which pyodbc's
        implicit transactions have not opened yet when this runs first (sp_getapplock then
        returns -999 and raises nothing), and an explicit BEGIN TRANSACTION would nest a second
        one under IMPLICIT_TRANSACTIONS. Not granted (deadlock victim, cancelled): an error."""
        return (
            "DECLARE @granted int;\n"
            "EXEC @granted = sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session';\n"
            "IF @granted < 0 BEGIN\n"
            "  DECLARE @why nvarchar(200) = CONCAT(N'dbq: the schema lock was not granted (sp_getapplock returned ',"
            " @granted, N')');\n"
            "  THROW 51000, @why, 1;\n"
            "END;"
        )

    def advisory_unlock(self) -> str | None:
        return _RELEASE_SESSION_LOCK

    def depth_sql(self) -> str:
        return (
            f"SELECT (SELECT COUNT_BIG(*) FROM {self.ring} WHERE state = 1) + "
            f"(SELECT COUNT_BIG(*) FROM {self.spill} WHERE state = 1), "
            f"(SELECT COUNT_BIG(*) FROM {self.ring} WHERE state = 2) + "
            f"(SELECT COUNT_BIG(*) FROM {self.spill} WHERE state = 2)"
        )


def _role(name: str) -> str:
    """A role name dbq derives, as an N'' literal."""
    return f"N'{check_role(name)}'"
