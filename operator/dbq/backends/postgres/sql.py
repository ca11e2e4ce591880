"""All PostgreSQL text of the ring queue: DDL per planning step, routines, observation queries.

Identifiers come from `QueueNames` (validated) and are quoted by `quote()`; numbers are
validated integers. Values (bodies, ids, durations) are always bound parameters.

The ring: `size` preallocated rows, one per slot, keyed by `slot` (the only index). Position
`n` of the push sequence lives in slot `n % size`. A slot's `state` is 0 free, 1 ready,
2 leased. Every operation is one call of a routine (one round trip), and every hot update
touches no indexed column, so it stays a HOT update on the same page (fillfactor leaves room).
The spill table takes what must leave ring order: nacked messages, expired leases, orphans
whose pop position was lost; the gap table remembers positions that will never be written
(void) or whose popper gave up (skipped).
"""

from __future__ import annotations

from collections.abc import Sequence

from dbq.api.models import Compression
from dbq.backends.postgres import pgmq
from dbq.backends.ring_plan import ROUTINES as PG_ROUTINES
from dbq.backends.ring_sql import RingSqlBase
from dbq.contract.access import EVERY_RIGHT, RING_RIGHTS
from dbq.contract.ring import RING_SCHEMA_VERSION, RingTarget
from dbq.names import check_identifier, check_role, owner_role, qualified_literal
from dbq.names import pg_literal as literal
from dbq.names import pg_quote as quote

# The SQLSTATE of a lock wait that ran past lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"

FILLFACTOR = 50


class PgRing(RingSqlBase):
    # stats calls oldest_age; pushes check headers and split batches, nack and repair write dead
    # letters' headers; takes read a body kept in the content table
    ROUTINES: tuple[str, ...] = (
        *PG_ROUTINES,
        "oldest_age",
        "check_headers",
        "split_headers",
        "split_bodies",
        "headers_of_dead",
        "body_of",
        # what a login reads, through routines (version 20 on)
        "describe",
        "wait",
        "peek",
        "history",
        "dead_letters",
        "archived",
        # the row contract (version 21 on); check_send is its refusals, push_array the batch
        # push that push_many and send_batch share
        "read",
        "send",
        "send_batch",
        "check_send",
        "push_array",
        # by id, with no lease asked (version 22 on)
        "delete",
        "archive",
        "set_vt",
        # PGMQ's semantics (version 23 on): read sweeps expired leases back; purge ends every message
        "expire_leases",
        "purge",
    )
    TEMPLATE_PACKAGE = __package__ or "dbq.backends.postgres"
    TEMPLATE_FILE = "ring_routines.sql"
    BACKEND = "postgres"
    PGMQ = True

    def __init__(self, target: RingTarget) -> None:
        super().__init__(target, quote, literal)

    def batches(self, statements: list[str]) -> list[str]:
        """All in one round trip: a new queue's 54 statements sent one by one take a quarter
        longer (psqlODBC wraps each in a savepoint; bench/provision_cost.py), which 1,000 queues
        applied at once feel."""
        return [";\n".join(statements)] if statements else []

    def create_routines(self) -> list[str]:
        # Older versions' signatures go first, in the same transaction: CREATE OR REPLACE cannot
        # change a result type, and a leftover overload would make calls ambiguous.
        drops = [f"DROP FUNCTION IF EXISTS {self.fn[verb]}({args})" for verb, args in _OLD_SIGNATURES]
        return drops + super().create_routines()

    @property
    def fence_key(self) -> str:
        """The advisory lock pushes take shared and a resize's switch exclusively."""
        return f"{_regclass(self.push_seq)}::oid::bigint | (2::bigint << 40)"

    def slot_of(self, position: str) -> str:
        """The slot of `position` (an SQL expression), from the generation holding it: NULL for a
        position older than every generation alive."""
        return (
            f"(SELECT gen.slot_base + ({position}) % gen.size FROM {self.gens} gen"
            f" WHERE gen.first_pos <= ({position}) ORDER BY gen.first_pos DESC LIMIT 1)"
        )

    def slot_near(self, position: str) -> str:
        """The slot of `position` computed in the newest generation, read before into the
        routine's v_first, v_base and v_size; looked up (`slot_of`) for an older position."""
        return (
            f"CASE WHEN {position} >= v_first THEN v_base + {position} % v_size"
            f" ELSE {self.slot_of(position)} END"
        )

    def template_values(self) -> dict[str, object]:
        sweep_every_ms = max(1000, self.size // 100)
        last_pushed = _last_drawn(self.push_seq)
        last_popped = _last_drawn(self.pop_seq)
        newest = f"(SELECT slot_base, size, first_pos FROM {self.gens} ORDER BY first_pos DESC LIMIT 1)"

        def room_in(gen: str) -> str:
            return f"{gen}.size - ({last_pushed} - greatest({last_popped}, {gen}.first_pos - 1))"

        # The sequences stats reads, as regclass constants: pg_sequence_last_value plans no scan
        # of each sequence, as a SELECT from it would.
        read = {"pop_seq": self.pop_seq} | {f"n_{c}": seq for c, seq in self.count.items()}
        return (
            super().template_values()
            | {f"{key}_class": _regclass(seq) for key, seq in read.items()}
            | {
                # The last position drawn (0 before the first), read the same way: cheaper than a
                # SELECT from both sequences, which pops pay for each position they draw.
                "last_pushed": last_pushed,
                "last_popped": last_popped,
                "last_swept": _last_drawn(self.swept_seq),
                # read's sweep of expired leases: while leases are held (acquired > settled) at
                # most every second, or every slots/100 ms past 100,000 slots (it scans the ring:
                # about 20 ms at 100,000 slots; bench/results/lease_sweep.txt); ten times as
                # seldom otherwise
                "leases_held": f"{_last_drawn(self.count['acquired'])}"
                f" > {_last_drawn(self.count['settled'])}",
                "sweep_every_ms": sweep_every_ms,
                "sweep_idle_ms": 10 * sweep_every_ms,
                # The sweep's transaction lock, keyed by its sequence's oid above 2^40: out of reach
                # of the hashtext() keys (32 bits) dbq's other advisory locks use.
                "sweep_lock": f"{_regclass(self.swept_seq)}::oid::bigint | (1::bigint << 40)",
                # Resizing (version 24 on): the slot of a position, from its generation; the free
                # slots of the newest generation; the fence a switch takes exclusively, keyed by the
                # push sequence's oid above 2^41.
                "slot_of": self.slot_of,
                "slot_near": self.slot_near,
                "newest": newest,
                "room_in": room_in,
                "room": f"(SELECT {room_in('gen')} FROM {newest} gen)",
                "fence": f"pg_advisory_xact_lock_shared({self.fence_key}) IS NOT NULL",
                "record": _record("o_status", "o_id", "o_lease", "o_attempts", "o_headers", "o_body"),
                "row_record": _record("0", "msg_id", "lease", "attempts", "headers", "body"),
                # The routines a login calls run as the owner role, finding nothing but
                # pg_catalog and the queue's schema by an unqualified name (pg_temp last).
                "definer": f"SECURITY DEFINER SET search_path = pg_catalog, {self.schema}, pg_temp",
                # A message's routines plan their statements once per session (ring_routines.sql).
                "plan_once": "SET plan_cache_mode = force_generic_plan",
                "meta": self.meta,
                "history": self.history,
                "own_dead": self.own_dead,
                "queue_literal": literal(self.t.names.queue),
            }
        )

    # --- provisioning, one method per planning step ------------------------------------------
    def create_schema(self) -> list[str]:
        return [f"CREATE SCHEMA IF NOT EXISTS {self.schema}"]

    # Names and reasons are bounded (varchar), not text: a table whose rows cannot outgrow a page
    # gets no TOAST table and TOAST index, so each queue costs PostgreSQL fewer files, catalog
    # rows and index builds (each synced to disk). Only the tables holding bodies need TOAST.
    def create_meta(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.meta} (
  queue varchar(63) PRIMARY KEY,
  design varchar(16) NOT NULL,
  schema_version int NOT NULL,
  ring_size bigint NOT NULL,
  message_bytes int NOT NULL,
  max_attempts int NOT NULL DEFAULT 0,
  archive int NOT NULL DEFAULT 0,
  dead_letter_queue varchar(127) NOT NULL DEFAULT '',
  header_bytes int NOT NULL DEFAULT 1024,
  max_headers int NOT NULL DEFAULT 32,
  max_body_bytes int NOT NULL DEFAULT 1048576,
  compression varchar(8) NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now())"""
        ]

    def create_ring(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.ring} (
  slot bigint PRIMARY KEY,
  msg_id bigint,
  state smallint NOT NULL DEFAULT 0,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at timestamptz,
  visible_at timestamptz,
  expires_at timestamptz,
  body bytea,
  headers text) WITH (fillfactor = {FILLFACTOR}, autovacuum_vacuum_scale_factor = 0.05)"""
        ]

    def fill_ring(self) -> list[str]:
        return [self.prepare_slots(0, self.size)]

    def create_sequences(self) -> list[str]:
        # CACHE 1: a per-session cache would hand positions out of order and lose a block of
        # them whenever a session ends.
        return [
            f"CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 START 1 CACHE 1"
            for seq in self.sequences
        ]

    def reset_positions(self) -> list[str]:
        return [
            f"SELECT setval('{self.pop_seq}', greatest((SELECT last_value FROM {self.push_seq}),"
            f" (SELECT last_value FROM {self.pop_seq})), true)",
            f"SELECT setval('{self.push_seq}', (SELECT last_value FROM {self.pop_seq}), true)",
        ]

    def key_dead_letters(self) -> list[str]:
        """A version 8 or 9 dead-letter table gains its source column (every row is this queue's)
        and the key (source, msg_id), in the plan's transaction."""
        n = self.t.names
        return [
            f"ALTER TABLE {self.own_dead} ADD COLUMN IF NOT EXISTS source text NOT NULL"
            f" DEFAULT {qualified_literal('postgres', n)}",
            f"ALTER TABLE {self.own_dead} ALTER COLUMN source DROP DEFAULT",
            f"""DO $$ DECLARE v_key text; BEGIN
  SELECT c.conname INTO v_key FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
    JOIN pg_namespace s ON s.oid = t.relnamespace
  WHERE s.nspname = {literal(n.schema)} AND t.relname = {literal(n.dead)} AND c.contype = 'p';
  EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I, ADD PRIMARY KEY (source, msg_id)',
    {literal(n.schema)}, {literal(n.dead)}, v_key);
END $$""",
        ]

    def seed_settled(self) -> list[str]:
        settled, acquired = self.count["settled"], self.count["acquired"]
        return [
            f"""SELECT setval('{settled}', greatest(v, 1), v > 0) FROM (SELECT greatest(
  (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {acquired})
  - (SELECT count(*) FROM {self.ring} WHERE state = 2) - (SELECT count(*) FROM {self.spill} WHERE state = 2), 0) AS v) s"""
        ]

    def create_side_tables(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.spill} (
  msg_id bigint PRIMARY KEY,
  state smallint NOT NULL,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at timestamptz NOT NULL,
  visible_at timestamptz NOT NULL,
  expires_at timestamptz,
  body bytea,
  headers text)""",
            f"""CREATE TABLE IF NOT EXISTS {self.gap} (
  pos bigint PRIMARY KEY,
  reason varchar(7) NOT NULL CHECK (reason IN ('void', 'skipped')),
  noted_at timestamptz NOT NULL DEFAULT now())""",
            f"""CREATE TABLE IF NOT EXISTS {self.staged} (
  stage text NOT NULL,
  seq bigint NOT NULL,
  first_seq bigint NOT NULL,
  packed bytea NOT NULL,
  PRIMARY KEY (stage, seq))""",
            # Keyed by source queue (schema.queue) too: other queues may keep theirs here.
            f"""CREATE TABLE IF NOT EXISTS {self.own_dead} (
  source text NOT NULL,
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  error text,
  pushed_at timestamptz NOT NULL,
  dead_at timestamptz NOT NULL DEFAULT now(),
  body bytea NOT NULL,
  headers text,
  PRIMARY KEY (source, msg_id))""",
            f"""CREATE TABLE IF NOT EXISTS {self.waiters} (
  id int PRIMARY KEY CHECK (id = 1),
  until timestamptz NOT NULL)""",
            f"INSERT INTO {self.waiters} (id, until) VALUES (1, '-infinity') ON CONFLICT (id) DO NOTHING",
            # Insert-only, read and scavenged by time: one index, on the time.
            f"""CREATE TABLE IF NOT EXISTS {self.archive} (
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  pushed_at timestamptz NOT NULL,
  acked_at timestamptz NOT NULL,
  body bytea NOT NULL,
  headers text)""",
            f"CREATE INDEX IF NOT EXISTS {quote(self.t.names.archive_index)} ON {self.archive} (acked_at)",
            *self.index_spill(),
            *self.create_content(),
            *self.create_generations(),
        ]

    def create_generations(self) -> list[str]:
        """The generations table with the ring's first: from position 1, slots 0 .. size - 1 (the
        recorded size for a queue made before version 24, whatever the spec says now)."""
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.gens} (
  first_pos bigint PRIMARY KEY,
  slot_base bigint NOT NULL,
  size bigint NOT NULL CHECK (size > 0),
  started_at timestamptz NOT NULL DEFAULT now())""",
            f"""INSERT INTO {self.gens} (first_pos, slot_base, size)
SELECT 1, 0, coalesce((SELECT ring_size FROM {self.meta} WHERE queue = {literal(self.t.names.queue)}), {self.size})
WHERE NOT EXISTS (SELECT 1 FROM {self.gens})""",
        ]

    def create_content(self) -> list[str]:
        # A body larger than a slot, while its message is in the ring (whose slot's body is NULL)
        # or the spill table. Keyed by (msg_id % buckets, msg_id): consecutive ids from concurrent
        # pushes go to `buckets` places in the index, not all to its right edge.
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.content} (
  bucket smallint NOT NULL,
  msg_id bigint NOT NULL,
  body bytea NOT NULL,
  PRIMARY KEY (bucket, msg_id))"""
        ]

    def allow_content(self) -> list[str]:
        """A queue of version 17 or older: a spilled message's body may be in the content table
        (the spill row's NULL; the table itself comes with the missing side tables)."""
        return [f"ALTER TABLE {self.spill} ALTER COLUMN body DROP NOT NULL"]

    def add_headers(self) -> list[str]:
        """A queue of version 15 or older: its message tables gain the headers column (NULL: no
        headers, so existing rows need no rewrite)."""
        return [
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS headers text"
            for table in (self.ring, self.spill, self.own_dead, self.archive)
        ]

    def set_compression(self) -> list[str]:
        """spec.messages.compression on every column holding bodies: lz4 or pglz (compressed past
        about 2 KB, as PostgreSQL does by default), or none (kept out of line uncompressed, with no
        attempt). A catalog change: bodies already stored keep theirs."""
        compression = self.t.compression
        if compression not in {c.value for c in Compression}:  # resolved by the plan: never '' here
            raise ValueError(f"compression {compression!r} is not one of lz4, pglz, none")
        storage = (
            "EXTERNAL"
            if compression == "none"
            else f"EXTENDED, ALTER COLUMN body SET COMPRESSION {compression}"
        )
        return [
            f"ALTER TABLE {table} ALTER COLUMN body SET STORAGE {storage}"
            for table in (self.ring, self.spill, self.content, self.own_dead, self.archive)
        ]

    def index_spill(self) -> list[str]:
        return [
            f"CREATE INDEX IF NOT EXISTS {quote(self.t.names.spill_index)} ON {self.spill} (state, visible_at)"
        ]

    def create_history(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.history} (
  queue varchar(63) NOT NULL,
  at timestamptz NOT NULL,
  depth bigint NOT NULL,
  in_flight bigint NOT NULL,
  pushed bigint NOT NULL,
  popped bigint NOT NULL,
  acquired bigint NOT NULL,
  expired bigint NOT NULL,
  oldest_age_s double precision NOT NULL,
  PRIMARY KEY (queue, at))"""
        ]

    def purge_histories(self, queues: Sequence[str]) -> str:
        """Drop the samples of `queues` older than the retention (parameter: seconds)."""
        return f"DELETE FROM {self.history} WHERE {self.history_of(queues)} AND at < now() - make_interval(secs => ?)"

    def sample_since(self) -> str:
        """The oldest sample at most `window` s old (parameter: window seconds): its age in
        seconds, pushed and taken (popped + acquired) totals."""
        return (
            f"SELECT extract(epoch FROM now() - at)::float8, pushed, popped + acquired FROM {self.history}"
            f" WHERE queue = {literal(self.t.names.queue)} AND at >= now() - make_interval(secs => ?)"
            " ORDER BY at LIMIT 1"
        )

    # --- online resize (`dbq.backends.ring_resize`; the dialect's part) --------------------------
    def last_drawn(self, sequence: str) -> str:
        return _last_drawn(sequence)

    def try_resize_lock(self) -> str:
        return "SELECT CASE WHEN pg_try_advisory_lock(hashtext(?)) THEN 1 ELSE 0 END"

    def resize_unlock(self) -> str:
        return "SELECT pg_advisory_unlock(hashtext(?))"

    def prepare_slots(self, lo: int, hi: int) -> str:
        """Free slots [lo, hi) (the ring's first fill, or a resize's new generation), each with a
        body of full size, so that later pushes do not grow rows off their page."""
        return (
            f"INSERT INTO {self.ring} (slot, state, body) SELECT g, 0, decode(repeat('00', {self.message_bytes}), 'hex')"
            f" FROM generate_series({int(lo)}, {int(hi) - 1}) g ON CONFLICT (slot) DO NOTHING"
        )

    def switch(self, base: int, size: int, wait_ms: int) -> str:
        boundary = f"{_last_drawn(self.push_seq)} + 1"
        return f"""DO $switch$ BEGIN
  PERFORM set_config('lock_timeout', '{int(wait_ms)}', true);
  PERFORM pg_advisory_xact_lock({self.fence_key});
  INSERT INTO {self.gens} (first_pos, slot_base, size) VALUES ({boundary}, {int(base)}, {int(size)})
  ON CONFLICT (first_pos) DO UPDATE SET slot_base = EXCLUDED.slot_base, size = EXCLUDED.size, started_at = now();
  UPDATE {self.meta} SET ring_size = {int(size)}, updated_at = now() WHERE queue = {literal(self.t.names.queue)};
END $switch$"""

    def fence_busy(self, state: str, text: str) -> bool:
        return state == LOCK_NOT_AVAILABLE

    def retire(self, first_pos: int, lo: int, hi: int) -> tuple[str, str]:
        return (
            f"""WITH held AS (
  SELECT slot FROM {self.ring} WHERE slot >= {int(lo)} AND slot < {int(hi)} AND state <> 0 FOR UPDATE SKIP LOCKED),
moved AS (
  UPDATE {self.ring} r SET state = 0 FROM held WHERE r.slot = held.slot
  RETURNING r.msg_id, r.lease, r.attempts, r.pushed_at, r.visible_at, r.expires_at, r.body, r.headers)
INSERT INTO {self.spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
SELECT m.msg_id, CASE WHEN m.lease > 0 THEN 2 ELSE 1 END, m.lease, m.attempts, m.pushed_at,
  CASE WHEN m.lease > 0 THEN m.visible_at ELSE clock_timestamp() END, m.expires_at, m.body, m.headers
FROM moved m""",
            f"""WITH gone AS (
  DELETE FROM {self.gens} WHERE first_pos = {int(first_pos)}
    AND first_pos < (SELECT max(first_pos) FROM {self.gens})
    AND NOT EXISTS (SELECT 1 FROM {self.ring} WHERE slot >= {int(lo)} AND slot < {int(hi)} AND state <> 0)
  RETURNING 1)
SELECT count(*) FROM gone""",
        )

    # --- maintenance (parameter: schema name) ---------------------------------------------------
    def maintenance_tables(self) -> str:
        """Per queue table: name, live rows, dead rows."""
        return (
            "SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables"
            f" WHERE schemaname = ? AND relname IN ({self._queue_tables_list()})"
        )

    def maintenance_indexes(self) -> str:
        """Per index of a queue table: index, table, pages now, rows of its table, no fragmentation."""
        return (
            "SELECT i.relname, t.relname, pg_relation_size(i.oid) / 8192, GREATEST(t.reltuples, 0)::bigint, NULL"
            " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid"
            f" JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = ? AND t.relname IN ({self._queue_tables_list()})"
        )

    def maintenance_action(self, action: str, target: str, table: str, online: bool) -> str:
        obj = f"{self.schema}.{quote(check_identifier(target, 'object name'))}"
        if action == "vacuum":
            return f"VACUUM (ANALYZE) {obj}"
        if action == "reindex":
            return f"REINDEX INDEX {'CONCURRENTLY ' if online else ''}{obj}"
        raise ValueError(f"PostgreSQL has no maintenance action {action!r}")

    def online_capable(self) -> str:
        """Every PostgreSQL since 12 reindexes CONCURRENTLY."""
        return "SELECT 1"

    def try_maintenance_lock(self) -> str:
        """A session lock (parameter: lock name): held while the session lives, so a run the
        operator left behind when it died keeps it until the server finishes that statement."""
        return "SELECT CASE WHEN pg_try_advisory_lock(hashtext(?)) THEN 1 ELSE 0 END"

    def maintenance_unlock(self) -> str:
        return "SELECT CASE WHEN pg_advisory_unlock(hashtext(?)) THEN 1 ELSE 0 END"

    def record_version(self) -> list[str]:
        return [
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS max_attempts int NOT NULL DEFAULT 0",
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS archive int NOT NULL DEFAULT 0",
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS dead_letter_queue varchar(127) NOT NULL DEFAULT ''",
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS header_bytes int NOT NULL DEFAULT 1024",
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS max_headers int NOT NULL DEFAULT 32",
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS max_body_bytes int NOT NULL DEFAULT 1048576",
            f"ALTER TABLE {self.meta} ADD COLUMN IF NOT EXISTS compression varchar(8) NOT NULL DEFAULT ''",
            f"""INSERT INTO {self.meta} (queue, design, schema_version, ring_size, message_bytes, max_attempts, archive,
  dead_letter_queue, header_bytes, max_headers, max_body_bytes, compression)
VALUES ({literal(self.t.names.queue)}, 'ring', {RING_SCHEMA_VERSION}, {self.size}, {self.message_bytes},
  {int(self.t.max_attempts)}, {int(self.t.archive)}, {self._dead_letter_queue()}, {self.header_bytes},
  {self.max_headers}, {self.max_body_bytes}, {literal(self.t.compression)})
ON CONFLICT (queue) DO UPDATE SET schema_version = EXCLUDED.schema_version, message_bytes = EXCLUDED.message_bytes,
  max_attempts = EXCLUDED.max_attempts, archive = EXCLUDED.archive, dead_letter_queue = EXCLUDED.dead_letter_queue,
  header_bytes = EXCLUDED.header_bytes, max_headers = EXCLUDED.max_headers,
  max_body_bytes = EXCLUDED.max_body_bytes, compression = EXCLUDED.compression, updated_at = now()""",
        ]

    def secure(self) -> list[str]:
        """The schema and every object of the queue to the owner role; nothing to PUBLIC; USAGE on
        the schema and EXECUTE on each right's routines to the right's group role. The roles come
        from the role helper a DBA installed (`access_helper.sql`)."""
        owner, n = quote(self.owner), self.t.names
        tables = ", ".join(f"{self.schema}.{quote(t)}" for t in (n.meta, n.history, *n.tables))
        sequences = ", ".join(self.sequences)
        routines = ", ".join(self.fn.values())
        groups = {right: quote(role) for right, role in self.groups.items()}
        out = [f"SELECT dbq_access.ensure_owner({literal_role(self.owner)})"]
        out += [f"SELECT dbq_access.ensure_group({literal_role(role)})" for role in self.groups.values()]
        out.append(f"ALTER SCHEMA {self.schema} OWNER TO {owner}")
        out += [
            f"ALTER TABLE {self.schema}.{quote(t)} OWNER TO {owner}" for t in (n.meta, n.history, *n.tables)
        ]
        out += [f"ALTER SEQUENCE {seq} OWNER TO {owner}" for seq in self.sequences]
        out += [f"ALTER ROUTINE {fn} OWNER TO {owner}" for fn in self.fn.values()]
        out += [
            f"REVOKE ALL ON SCHEMA {self.schema} FROM PUBLIC",
            f"REVOKE ALL ON TABLE {tables} FROM PUBLIC",
            f"REVOKE ALL ON SEQUENCE {sequences} FROM PUBLIC",
            f"REVOKE ALL ON ROUTINE {routines} FROM PUBLIC",
            f"GRANT USAGE ON SCHEMA {self.schema} TO {', '.join(groups.values())}",
        ]
        for right, verbs in RING_RIGHTS.items():
            granted = ", ".join(self.fn[v] for v in (*verbs, *EVERY_RIGHT))
            out.append(f"GRANT EXECUTE ON ROUTINE {granted} TO {groups[right]}")
        keeper = self.t.dead_letter_keeper
        if keeper is not None and keeper.schema != n.schema:
            # The routines run as this schema's owner and move dead letters to the keeper's table.
            out.append(f"GRANT USAGE ON SCHEMA {quote(keeper.schema)} TO {owner}")
            out.append(f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {self.dead} TO {owner}")
        return out

    def publish_pgmq(self, install: bool = False) -> list[str]:
        n = self.t.names
        return pgmq.publish(
            n.schema,
            n.queue,
            self.t.pgmq_name,
            self.t.pgmq_topics,
            self.groups.values(),
            self.pgmq_owner,
            install,
        )

    def unpublish_pgmq(self) -> list[str]:
        return pgmq.unpublish(self.t.names.schema, self.t.names.queue, self.pgmq_owner)

    @property
    def pgmq_owner(self) -> str:
        """The role owning the database's PGMQ facade (schema pgmq), as a queue schema's owner."""
        return owner_role(self.t.database, "pgmq")

    def drop(self) -> list[str]:
        # PGMQ's name for the queue and the facade's grants to its roles go first.
        return self.unpublish_pgmq() + super().drop()

    def drop_roles(self) -> list[str]:
        """After drop(): the queue's group roles (their grants on routines went with them), and the
        owner role once its schema is gone."""
        schema, owner = literal(self.t.names.schema), literal_role(self.owner)
        groups = ", ".join(literal_role(g) for g in self.groups.values())
        return [
            f"""DO $$ DECLARE v_role text; BEGIN
  FOR v_role IN SELECT rolname FROM pg_roles WHERE rolname IN ({groups}) LOOP
    IF to_regnamespace({schema}) IS NOT NULL THEN
      EXECUTE format('REVOKE ALL ON SCHEMA %I FROM %I', {schema}, v_role);
    END IF;
    PERFORM dbq_access.drop_group(v_role);
  END LOOP;
  IF to_regnamespace({schema}) IS NULL AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {owner}) THEN
    -- What the owner still holds elsewhere (a dead-letter keeper's table in another schema) goes
    -- first: the operator may, as a member of the role.
    EXECUTE format('DROP OWNED BY %I', {owner});
    PERFORM dbq_access.drop_owner({owner});
  END IF;
END $$"""
        ]

    # Sessions of dbq's client (`dbq.connection.postgres.CLIENT_APPLICATION`) in this database
    # logged in as the caller: applications holding the operator's login.
    SHARED_LOGIN_SESSIONS: str | None = (
        "SELECT count(*) FROM pg_stat_activity WHERE usename = current_user AND datname = current_database()"
        " AND application_name = 'dbq-client'"
    )

    # Objects of the queue not as secure() leaves them (parameters: schema, owner role, the
    # routines' names comma-separated): the schema or a routine of another owner, a routine
    # without its own privileges (PUBLIC may call it) or granted to PUBLIC.
    OBSERVE_INSECURE: str | None = (
        "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = ? AND nspowner IS DISTINCT FROM to_regrole(?))"
        " + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = ? AND p.proname = ANY (string_to_array(?, ','))"
        " AND (p.proowner IS DISTINCT FROM n.nspowner OR p.proacl IS NULL"
        " OR has_function_privilege('public', p.oid, 'EXECUTE')))"
    )

    # --- teardown (drop() is shared) ---------------------------------------------------------
    def drop_schema_if_unused(self) -> list[str]:
        return [
            # The schema goes only when nothing else lives in it (RESTRICT refuses otherwise).
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM {self.meta}) THEN DROP TABLE {self.meta};"
            f" DROP TABLE IF EXISTS {self.history};"
            f" BEGIN DROP SCHEMA IF EXISTS {self.schema} RESTRICT;"
            " EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END; END IF; END $$"
        ]

    # --- observation (parameters: schema name, then the names looked for, comma-separated) ------
    # By name, so the catalog's (name, namespace) indexes serve them: a drift check then costs the
    # same with a thousand queues' relations in the database as with one.
    OBSERVE_SCHEMA = "SELECT count(*) FROM pg_namespace WHERE nspname = ?"
    # The TOAST compressions this server was built with (PostgreSQL 14 on; no row before), and none.
    COMPRESSIONS: str | None = (
        "SELECT array_to_string(enumvals, ',') || ',none' FROM pg_settings WHERE name = 'default_toast_compression'"
    )

    # Rows inserted, updated and deleted in the catalogs a digest reads, database-wide, from the
    # cumulative statistics (what pg_stat_sys_tables shows, read by the catalogs' oids: that view
    # scans pg_class): equal, and none of those catalogs changed.
    CATALOG_CHANGES: str | None = (
        "SELECT string_agg(pg_stat_get_tuples_inserted(c) || ' ' || pg_stat_get_tuples_updated(c) || ' '"
        " || pg_stat_get_tuples_deleted(c), ',' ORDER BY c) FROM unnest(ARRAY['pg_catalog.pg_class',"
        " 'pg_catalog.pg_index', 'pg_catalog.pg_namespace', 'pg_catalog.pg_proc', 'pg_catalog.pg_sequence']::regclass[]) AS c"
    )

    def catalog_digests(self) -> str | None:
        """Digests of the schema's catalog rows (parameters: the schema's name, the suffixes of a
        queue's object names, comma-separated, then the schema-wide tables' names), summed (no
        sort): one row a queue of the metadata table, of its own relations (an index counts as
        its table's), sequences and routines, each by its oid and xmin, so a drop, a create, most
        ALTERs, a GRANT or REVOKE and an owner change show; and one row ('') of the schema and
        its schema-wide tables, each by its oid and owner: what a drift check looks at there, and
        not the grants every queue made or dropped beside it adds to or takes from the schema.
        An unchanged digest says nothing a drift check of the queue reads was changed behind the
        operator's back since a check found it whole. Rows are found by name, so the catalog's
        (name, namespace) indexes serve them: the read costs the same whatever else the database
        holds (a scan of pg_class and pg_proc grows with every queue of every schema). Column
        changes are left to the hourly full check: reading every column costs more than the rest
        together."""
        return f"""WITH ns AS (SELECT oid, nspowner FROM pg_namespace WHERE nspname = ?),
own AS (SELECT m.queue, (m.queue || '_' || x.suffix)::name AS name
        FROM {self.meta} m CROSS JOIN unnest(string_to_array(?, ',')) AS x(suffix)),
rel AS (SELECT o.queue, c.oid, c.xmin FROM own o
        JOIN pg_class c ON c.relname = o.name AND c.relnamespace = (SELECT oid FROM ns))
SELECT d.queue, coalesce(sum(hashtext(d.x)::bigint), 0)::text FROM (
  SELECT r.queue, 'c' || r.oid || ':' || r.xmin FROM rel r
  UNION ALL SELECT r.queue, 'c' || c.oid || ':' || c.xmin FROM rel r
    JOIN pg_index i ON i.indrelid = r.oid JOIN pg_class c ON c.oid = i.indexrelid
  UNION ALL SELECT r.queue, 's' || s.seqrelid || ':' || s.xmin FROM rel r JOIN pg_sequence s ON s.seqrelid = r.oid
  UNION ALL SELECT o.queue, 'p' || p.oid || ':' || p.xmin FROM own o
    JOIN pg_proc p ON p.proname = o.name AND p.pronamespace = (SELECT oid FROM ns)
  UNION ALL SELECT '', 'n' || oid || ':' || nspowner FROM ns
  UNION ALL SELECT '', 'c' || c.oid || ':' || c.relowner FROM pg_class c
    WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relname = ANY (string_to_array(?, ','))
) d(queue, x)
GROUP BY 1"""

    # How many locks one transaction may hold on average (a statement measuring many queues
    # stays within it).
    MAX_LOCKS: str | None = "SELECT current_setting('max_locks_per_transaction')::int"
    OBSERVE_RELATIONS = (
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = ? AND c.relname = ANY (string_to_array(?, ','))"
    )
    OBSERVE_ROUTINES = (
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = ? AND p.proname = ANY (string_to_array(?, ','))"
    )

    def advisory_unlock(self) -> str | None:
        return None  # pg_advisory_xact_lock ends with the transaction

    def advisory_lock(self) -> str:
        """Serialises provisioning of one queue across operator replicas and restarts."""
        return "SELECT pg_advisory_xact_lock(hashtext(?))"

    def depth_sql(self) -> str:
        return (
            f"SELECT (SELECT count(*) FROM {self.ring} WHERE state = 1) + "
            f"(SELECT count(*) FROM {self.spill} WHERE state = 1), "
            f"(SELECT count(*) FROM {self.ring} WHERE state = 2) + "
            f"(SELECT count(*) FROM {self.spill} WHERE state = 2)"
        )


def literal_role(role: str) -> str:
    """A role name dbq derives (`dbq.names.check_role`), as a string literal."""
    return f"'{check_role(role)}'"


def _regclass(qualified: str) -> str:
    """A qualified name, its parts validated and quoted, as a regclass constant."""
    if "'" in qualified:
        raise ValueError(f"not a quoted, qualified name: {qualified!r}")
    return f"'{qualified}'::regclass"


# Earlier schema versions' signatures of the routines whose result or parameters changed since.
_OLD_SIGNATURES = (
    ("take", "bigint, bigint"),
    ("pop", "bigint"),
    ("pop_many", "int, bigint"),
    ("push_many", "text, bigint"),  # version 4 took its bodies base64-encoded
    ("nack", "bigint, bigint, bigint"),  # version 8 added the error text
    ("repair", "bigint"),  # version 8 added a column (dead letters): re-created
    ("stats", ""),  # version 8 added dead letters and delayed messages, 9 the archive: re-created
    # version 16 added the headers
    ("place", "bigint, bytea, bigint, timestamptz"),
    ("push", "bytea, bigint"),
    ("push_many", "bytea, text, bigint"),
    ("defer", "bytea, text, bigint, bigint"),
)


def _record(status: str, msg_id: str, lease: str, attempts: str, headers: str, body: str) -> str:
    """One packed take/pop record (see `dbq.contract.ring.RECORD`) built from SQL expressions."""
    return (
        f"substring(int4send({status}) FROM 4) || int8send(coalesce({msg_id}, 0))"
        f" || int8send(coalesce({lease}, 0)) || int4send(coalesce({attempts}, 0))"
        f" || int4send(coalesce(octet_length(convert_to({headers}, 'UTF8')), 0))"
        f" || int4send(coalesce(octet_length({body}), 0))"
        f" || coalesce(convert_to({headers}, 'UTF8'), '') || coalesce({body}, '')"
    )


def _last_drawn(sequence: str) -> str:
    """The last value `sequence` gave out (0 before the first), read without a scan of it."""
    return f"coalesce(pg_sequence_last_value({_regclass(sequence)}), 0)"
