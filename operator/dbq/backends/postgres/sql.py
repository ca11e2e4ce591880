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

from dbq.backends.names import check_identifier
from dbq.backends.ring_plan import RING_SCHEMA_VERSION, RingTarget
from dbq.backends.ring_plan import ROUTINES as PG_ROUTINES
from dbq.backends.ring_sql import CALL_ARGS, RingSqlBase

FILLFACTOR = 50


def quote(identifier: str) -> str:
    """Quote an identifier that `QueueNames`/`check_identifier` already validated."""
    if not identifier or '"' in identifier or "\0" in identifier:
        raise ValueError(f"refusing to quote {identifier!r}")
    return f'"{identifier}"'


def literal(identifier: str) -> str:
    """A validated identifier as a string literal (for metadata rows keyed by queue name)."""
    check_identifier(identifier, "name")
    return f"'{identifier}'"


class PgRing(RingSqlBase):
    ROUTINES: tuple[str, ...] = PG_ROUTINES

    def __init__(self, target: RingTarget) -> None:
        super().__init__(target, quote, literal)
        self.TEMPLATE = _ROUTINES

    def _create_routines(self) -> list[str]:
        # Older versions' signatures go first, in the same transaction: CREATE OR REPLACE cannot
        # change a result type, and a leftover overload would make calls ambiguous.
        drops = [f"DROP FUNCTION IF EXISTS {self.fn[verb]}({args})" for verb, args in _OLD_SIGNATURES.items()]
        return drops + super()._create_routines()

    def _fmt(self) -> dict[str, object]:
        return super()._fmt() | {
            "record": _record("o_status", "o_id", "o_lease", "o_attempts", "o_body"),
            "row_record": _record("0", "msg_id", "lease", "attempts", "body"),
        }

    # --- provisioning, one method per planning step ------------------------------------------
    def _create_schema(self) -> list[str]:
        return [f"CREATE SCHEMA IF NOT EXISTS {self.schema}"]

    def _create_meta(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.meta} (
  queue text PRIMARY KEY,
  design text NOT NULL,
  schema_version int NOT NULL,
  ring_size bigint NOT NULL,
  message_bytes int NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now())"""
        ]

    def _create_ring(self) -> list[str]:
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
  body bytea) WITH (fillfactor = {FILLFACTOR}, autovacuum_vacuum_scale_factor = 0.05)"""
        ]

    def _fill_ring(self) -> list[str]:
        # Slots start with a body of full size so later pushes do not grow rows off their page.
        return [
            f"""INSERT INTO {self.ring} (slot, state, body)
SELECT g, 0, decode(repeat('00', {self.message_bytes}), 'hex') FROM generate_series(0, {self.size - 1}) g
ON CONFLICT (slot) DO NOTHING"""
        ]

    def _create_sequences(self) -> list[str]:
        # CACHE 1: a per-session cache would hand positions out of order and lose a block of
        # them whenever a session ends.
        return [
            f"CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 START 1 CACHE 1"
            for seq in self.sequences
        ]

    def _reset_positions(self) -> list[str]:
        return [
            f"SELECT setval('{self.pop_seq}', greatest((SELECT last_value FROM {self.push_seq}),"
            f" (SELECT last_value FROM {self.pop_seq})), true)",
            f"SELECT setval('{self.push_seq}', (SELECT last_value FROM {self.pop_seq}), true)",
        ]

    def _create_side_tables(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.spill} (
  msg_id bigint PRIMARY KEY,
  state smallint NOT NULL,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at timestamptz NOT NULL,
  visible_at timestamptz NOT NULL,
  expires_at timestamptz,
  body bytea NOT NULL)""",
            f"""CREATE TABLE IF NOT EXISTS {self.gap} (
  pos bigint PRIMARY KEY,
  reason text NOT NULL CHECK (reason IN ('void', 'skipped')),
  noted_at timestamptz NOT NULL DEFAULT now())""",
        ]

    def _create_history(self) -> list[str]:
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.history} (
  queue text NOT NULL,
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

    def purge_history(self) -> str:
        """Drop this queue's samples older than the retention (parameter: seconds)."""
        return f"DELETE FROM {self.history} WHERE queue = {literal(self.t.names.queue)} AND at < now() - make_interval(secs => ?)"

    def sample_since(self) -> str:
        """The oldest sample at most `window` s old (parameter: window seconds): its age in
        seconds, pushed and taken (popped + acquired) totals."""
        return (
            f"SELECT extract(epoch FROM now() - at)::float8, pushed, popped + acquired FROM {self.history}"
            f" WHERE queue = {literal(self.t.names.queue)} AND at >= now() - make_interval(secs => ?)"
            " ORDER BY at LIMIT 1"
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

    def _record_version(self) -> list[str]:
        return [
            f"""INSERT INTO {self.meta} (queue, design, schema_version, ring_size, message_bytes)
VALUES ({literal(self.t.names.queue)}, 'ring', {RING_SCHEMA_VERSION}, {self.size}, {self.message_bytes})
ON CONFLICT (queue) DO UPDATE SET schema_version = EXCLUDED.schema_version,
  message_bytes = EXCLUDED.message_bytes, updated_at = now()"""
        ]

    # --- teardown (drop() is shared) ---------------------------------------------------------
    def drop_schema_if_unused(self) -> list[str]:
        return [
            # The schema goes only when nothing else lives in it (RESTRICT refuses otherwise).
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM {self.meta}) THEN DROP TABLE {self.meta};"
            f" DROP TABLE IF EXISTS {self.history};"
            f" BEGIN DROP SCHEMA IF EXISTS {self.schema} RESTRICT;"
            " EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END; END IF; END $$"
        ]

    # --- observation (parameters: schema name, then object names) ------------------------------
    OBSERVE_SCHEMA = "SELECT count(*) FROM pg_namespace WHERE nspname = ?"
    OBSERVE_RELATIONS = (
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = ?"
    )
    OBSERVE_ROUTINES = (
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ?"
    )

    def advisory_lock(self) -> str:
        """Serialises provisioning of one queue across operator replicas and restarts."""
        return "SELECT pg_advisory_xact_lock(hashtext(?))"

    # --- data plane calls -----------------------------------------------------------------
    def call(self, verb: str) -> str:
        args = CALL_ARGS[verb]
        if verb in _SET_RETURNING:
            return f"SELECT * FROM {self.fn[verb]}({args})"
        return f"SELECT {self.fn[verb]}({args})"  # one value: a plain call skips the function scan

    def depth_sql(self) -> str:
        return (
            f"SELECT (SELECT count(*) FROM {self.ring} WHERE state = 1) + "
            f"(SELECT count(*) FROM {self.spill} WHERE state = 1), "
            f"(SELECT count(*) FROM {self.ring} WHERE state = 2) + "
            f"(SELECT count(*) FROM {self.spill} WHERE state = 2)"
        )


_SET_RETURNING = {"repair", "void_holes", "stats"}
# Earlier schema versions' signatures of the routines whose result or parameters changed since.
_OLD_SIGNATURES = {
    "take": "bigint, bigint",
    "pop": "bigint",
    "pop_many": "int, bigint",
    "push_many": "text, bigint",  # version 4 took its bodies base64-encoded
}


def _record(status: str, msg_id: str, lease: str, attempts: str, body: str) -> str:
    """One packed take/pop record (see `RECORD`) built from SQL expressions."""
    return (
        f"substring(int4send({status}) FROM 4) || int8send(coalesce({msg_id}, 0))"
        f" || int8send(coalesce({lease}, 0)) || int4send(coalesce({attempts}, 0))"
        f" || int4send(coalesce(octet_length({body}), 0)) || coalesce({body}, '')"
    )


# Routines, separated by `--;;` lines. Placeholders: {ring} {spill} {gap} {push_seq} {pop_seq}
# {n_pushed} {n_popped} {n_acquired} {n_expired} {size} {max_bytes} {queue} {fn_<verb>};
# literal braces are doubled. Arrays travel as text ('{1,2,3}'), which every ODBC driver binds.
#
# take/pop/pop_many answer with packed records (see `RECORD`). Status codes: 0 message; 1 queue
# empty; 2 position `id` was drawn but its message is not written yet (call take(id) until it
# arrives, or release it); 3 position gone (draw again). In a ring row, state 1 always has
# lease 0 and state 2 a lease > 0.
_ROUTINES = r"""
CREATE OR REPLACE FUNCTION {fn_place}(p_id bigint, p_body bytea, p_ttl_ms bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE v_popped bigint; v_try int := 0;
BEGIN
  LOOP
    UPDATE {ring} SET msg_id = p_id, state = 1, lease = 0, attempts = 0, pushed_at = p_now,
      visible_at = NULL, body = p_body,
      expires_at = CASE WHEN p_ttl_ms > 0 THEN p_now + p_ttl_ms * interval '1 millisecond' END
    WHERE slot = p_id % {size} AND state = 0;
    IF FOUND THEN RETURN true; END IF;
    -- The slot still holds an earlier lap's message. A leased one moves to the spill table (its
    -- ack finds it there). A ready one whose position a popper drew but has not claimed after a
    -- few tries is an orphan and moves there too. Otherwise its popper is about to take it.
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_popped FROM {pop_seq};
    WITH moved AS (
      UPDATE {ring} SET state = 0
      WHERE slot = p_id % {size} AND (state = 2 OR (state = 1 AND v_try >= 4 AND msg_id <= v_popped))
      RETURNING msg_id, lease, attempts, pushed_at, visible_at, expires_at, body)
    INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body)
    SELECT m.msg_id, CASE WHEN m.lease > 0 THEN 2 ELSE 1 END, m.lease, m.attempts, m.pushed_at,
      CASE WHEN m.lease > 0 THEN m.visible_at ELSE clock_timestamp() END, m.expires_at, m.body
    FROM moved m;
    v_try := v_try + 1;
    IF v_try > 20 THEN
      -- The ring is full after all (pushers raced past the check): give the position up as void,
      -- so its popper skips it, and let the caller report the queue full.
      INSERT INTO {gap} (pos, reason) VALUES (p_id, 'void') ON CONFLICT (pos) DO NOTHING;
      RETURN false;
    END IF;
    PERFORM pg_sleep(0.0005);
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_push}(p_body bytea, p_ttl_ms bigint, OUT o_id bigint)
LANGUAGE plpgsql AS $fn$
DECLARE v_used bigint; v_now timestamptz := clock_timestamp();
BEGIN
  IF octet_length(p_body) > {max_bytes} THEN
    RAISE EXCEPTION 'dbq: message of % bytes is larger than ring.messageBytes ({max_bytes}) of queue {queue}',
      octet_length(p_body) USING ERRCODE = '22001';
  END IF;
  -- Draw a position only if the ring has room (one statement reads both positions and draws).
  SELECT nextval('{push_seq}') INTO o_id FROM {push_seq} u, {pop_seq} o
  WHERE CASE WHEN u.is_called THEN u.last_value ELSE 0 END - CASE WHEN o.is_called THEN o.last_value ELSE 0 END
    < {size};
  IF NOT FOUND THEN
    o_id := -1;  -- full: nothing drawn, so nothing to repair
    RETURN;
  END IF;
  -- The fast path inline (RETURNING counts the push); place() handles a slot an earlier lap
  -- still holds.
  UPDATE {ring} SET msg_id = o_id, state = 1, lease = 0, attempts = 0, pushed_at = v_now,
    visible_at = NULL, body = p_body,
    expires_at = CASE WHEN p_ttl_ms > 0 THEN v_now + p_ttl_ms * interval '1 millisecond' END
  WHERE slot = o_id % {size} AND state = 0
  RETURNING nextval('{n_pushed}') INTO v_used;
  IF NOT FOUND THEN
    IF NOT {fn_place}(o_id, p_body, p_ttl_ms, v_now) THEN
      o_id := -1;
      RETURN;
    END IF;
    PERFORM nextval('{n_pushed}');
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_push_many}(p_bodies bytea, p_lengths text, p_ttl_ms bigint, OUT o_ids text)
LANGUAGE plpgsql AS $fn$
DECLARE
  v_bodies bytea[]; v_n int; v_k int; v_ids bigint[]; v_placed bigint[]; v_out bigint[] := '{{}}';
  v_pushed bigint; v_popped bigint; v_now timestamptz := clock_timestamp(); v_big int; v_total bigint; v_i int;
BEGIN
  -- The bodies arrive end to end in one bytea, with their lengths as comma-separated text: two
  -- parameters any driver binds, and no encoding to undo.
  SELECT array_agg(substring(coalesce(p_bodies, '') FROM (e - n + 1)::int FOR n) ORDER BY i), max(n), max(e)
  INTO v_bodies, v_big, v_total
  FROM (SELECT i, n, sum(n) OVER (ORDER BY i) AS e
        FROM unnest(string_to_array(p_lengths, ',')::int[]) WITH ORDINALITY AS x(n, i)) s;
  v_n := coalesce(cardinality(v_bodies), 0);
  IF coalesce(v_total, 0) <> coalesce(octet_length(p_bodies), 0) THEN
    RAISE EXCEPTION 'dbq: push_many got % bytes of bodies but lengths adding up to %',
      coalesce(octet_length(p_bodies), 0), coalesce(v_total, 0) USING ERRCODE = '22023';
  END IF;
  IF v_big > {max_bytes} THEN
    RAISE EXCEPTION 'dbq: message of % bytes is larger than ring.messageBytes ({max_bytes}) of queue {queue}',
      v_big USING ERRCODE = '22001';
  END IF;
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_pushed FROM {push_seq};
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_popped FROM {pop_seq};
  v_k := least(v_n, greatest({size} - (v_pushed - v_popped), 0));
  IF v_k > 0 THEN
    -- Reserve k positions in one statement, then fill their slots in one set-based update.
    SELECT array_agg(nextval('{push_seq}') ORDER BY g) INTO v_ids FROM generate_series(1, v_k) g;
    WITH placed AS (
      UPDATE {ring} r SET msg_id = u.id, state = 1, lease = 0, attempts = 0, pushed_at = v_now,
        visible_at = NULL, body = u.body,
        expires_at = CASE WHEN p_ttl_ms > 0 THEN v_now + p_ttl_ms * interval '1 millisecond' END
      FROM unnest(v_ids, v_bodies[1:v_k]) AS u(id, body)
      WHERE r.slot = u.id % {size} AND r.state = 0
      RETURNING u.id)
    SELECT array_agg(id) INTO v_placed FROM placed;
    -- Slots still held by an earlier lap take the slow path, one by one.
    IF coalesce(cardinality(v_placed), 0) = v_k THEN
      v_out := v_ids;
    ELSE FOR v_i IN 1..v_k LOOP
      IF v_ids[v_i] = ANY (coalesce(v_placed, '{{}}'))
         OR {fn_place}(v_ids[v_i], v_bodies[v_i], p_ttl_ms, v_now) THEN
        v_out := v_out || v_ids[v_i];
      ELSE
        v_out := v_out || -1::bigint;
      END IF;
    END LOOP; END IF;
    PERFORM nextval('{n_pushed}') FROM unnest(v_out) i WHERE i > 0;
  END IF;
  FOR v_i IN (v_k + 1)..v_n LOOP
    v_out := v_out || -1::bigint;
  END LOOP;
  o_ids := array_to_string(v_out, ',');
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_take}(p_pos bigint, p_lease_ms bigint, p_count boolean DEFAULT true)
RETURNS bytea
LANGUAGE plpgsql AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_msg bigint; v_state smallint; v_exp timestamptz;
  o_status int := 2; o_id bigint := p_pos; o_body bytea; o_lease bigint; o_attempts int;
BEGIN
  -- A few rounds: a message written just after the update's snapshot is seen by the next
  -- statement (READ COMMITTED takes a snapshot per statement), so the update is repeated; and a
  -- position a pusher has drawn is usually written within microseconds, so it is looked at again
  -- at once, then waited for briefly here rather than with a round trip per look from the client.
  FOR v_round IN 1..12 LOOP
    IF p_lease_ms <= 0 THEN
      UPDATE {ring} SET state = 0 WHERE slot = p_pos % {size} AND msg_id = p_pos AND state = 1
        AND (expires_at IS NULL OR expires_at > v_now)
      RETURNING body, attempts INTO o_body, o_attempts;
      IF FOUND THEN
        IF p_count THEN PERFORM nextval('{n_popped}'); END IF;
        o_status := 0; RETURN {record};
      END IF;
    ELSE
      o_lease := (random() * 9007199254740991)::bigint + 1;
      UPDATE {ring} SET state = 2, lease = o_lease, attempts = attempts + 1,
        visible_at = v_now + p_lease_ms * interval '1 millisecond'
      WHERE slot = p_pos % {size} AND msg_id = p_pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
      RETURNING body, attempts INTO o_body, o_attempts;
      IF FOUND THEN
        IF p_count THEN PERFORM nextval('{n_acquired}'); END IF;
        o_status := 0; RETURN {record};
      END IF;
      o_lease := NULL;
    END IF;
    -- Not taken: find out whether it is still to come or will never come.
    SELECT msg_id, state, expires_at INTO v_msg, v_state, v_exp FROM {ring} WHERE slot = p_pos % {size};
    IF v_msg = p_pos AND v_state = 1 THEN
      IF v_exp IS NULL OR v_exp > v_now THEN
        CONTINUE;  -- written after the update looked: take it now
      END IF;
      UPDATE {ring} SET state = 0 WHERE slot = p_pos % {size} AND msg_id = p_pos AND state = 1;
      IF FOUND THEN PERFORM nextval('{n_expired}'); END IF;  -- expired (TTL): dropped
      o_status := 3; RETURN {record};
    END IF;
    IF v_msg >= p_pos THEN  -- taken by repair, or the ring has lapped a void position
      DELETE FROM {gap} WHERE pos = p_pos;
      o_status := 3; RETURN {record};
    END IF;
    DELETE FROM {gap} WHERE pos = p_pos AND reason = 'void';
    IF FOUND THEN o_status := 3; RETURN {record}; END IF;
    EXIT WHEN v_round = 12 OR p_pos > (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {push_seq});
    IF v_round > 2 THEN PERFORM pg_sleep(0.0002); END IF;
  END LOOP;
  o_body := NULL; o_attempts := NULL;
  RETURN {record};  -- status 2: not written yet
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_pop}(p_lease_ms bigint, p_count boolean DEFAULT true) RETURNS bytea
LANGUAGE plpgsql AS $fn$
DECLARE v_exp timestamptz; v_ahead bigint; v_pos bigint; v_i int := 0; v_now timestamptz := clock_timestamp();
  v_rec bytea; o_status int := 1; o_id bigint; o_body bytea; o_lease bigint; o_attempts int;
  -- Redeliveries (nacked messages, expired leases, rescued orphans) wait in the spill table.
  -- One pop in {spill_share} looks there first while the ring has messages, and every pop when
  -- it has none: looking costs a statement most pops can skip, and none waits for ever.
  v_look boolean := random() * {spill_share} < 1;
BEGIN
  <<attempt>>
  LOOP
    -- 1. Redeliveries.
    WHILE v_look LOOP
      SELECT msg_id, body, attempts, expires_at INTO o_id, o_body, o_attempts, v_exp
      FROM {spill} WHERE state = 1 AND visible_at <= clock_timestamp()
      ORDER BY visible_at LIMIT 1 FOR UPDATE SKIP LOCKED;
      EXIT WHEN NOT FOUND;
      IF v_exp IS NOT NULL AND v_exp <= clock_timestamp() THEN  -- expired while waiting
        DELETE FROM {spill} WHERE msg_id = o_id;
        PERFORM nextval('{n_expired}');
        CONTINUE;
      END IF;
      IF p_lease_ms <= 0 THEN
        DELETE FROM {spill} WHERE msg_id = o_id;
        IF p_count THEN PERFORM nextval('{n_popped}'); END IF;
      ELSE
        o_lease := (random() * 9007199254740991)::bigint + 1;
        o_attempts := o_attempts + 1;
        UPDATE {spill} SET state = 2, lease = o_lease, attempts = o_attempts,
          visible_at = clock_timestamp() + p_lease_ms * interval '1 millisecond' WHERE msg_id = o_id;
        IF p_count THEN PERFORM nextval('{n_acquired}'); END IF;
      END IF;
      o_status := 0; RETURN {record};
    END LOOP;
    o_id := NULL; o_body := NULL; o_attempts := NULL;
    -- 2. The ring, in push order.
    LOOP
      -- Draw a position only if a push is ahead of the pops (one statement reads both and draws).
      SELECT nextval('{pop_seq}') INTO v_pos FROM {push_seq} u, {pop_seq} o
      WHERE CASE WHEN u.is_called THEN u.last_value ELSE 0 END > CASE WHEN o.is_called THEN o.last_value ELSE 0 END;
      IF NOT FOUND THEN
        IF NOT v_look THEN v_look := true; CONTINUE attempt; END IF;
        -- Nothing new. A position whose popper gave up may have received its message since.
        SELECT g.pos INTO v_pos FROM {gap} g JOIN {ring} r ON r.slot = g.pos % {size} AND r.msg_id = g.pos
        WHERE g.reason = 'skipped' AND r.state = 1 LIMIT 1 FOR UPDATE OF g SKIP LOCKED;
        IF FOUND THEN
          DELETE FROM {gap} WHERE pos = v_pos;
          v_rec := {fn_take}(v_pos, p_lease_ms, p_count);
          IF get_byte(v_rec, 0) = 0 THEN RETURN v_rec; END IF;
        END IF;
        o_status := 1; o_lease := NULL;
        RETURN {record};  -- empty
      END IF;
      IF p_lease_ms <= 0 THEN  -- the fast path inline (RETURNING counts it); take() covers the rest
        UPDATE {ring} SET state = 0 WHERE slot = v_pos % {size} AND msg_id = v_pos AND state = 1
          AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, attempts, CASE WHEN p_count THEN nextval('{n_popped}') END
          INTO o_id, o_body, o_attempts, v_ahead;
        IF FOUND THEN o_status := 0; RETURN {record}; END IF;
      ELSE
        o_lease := (random() * 9007199254740991)::bigint + 1;
        UPDATE {ring} SET state = 2, lease = o_lease, attempts = attempts + 1,
          visible_at = v_now + p_lease_ms * interval '1 millisecond'
        WHERE slot = v_pos % {size} AND msg_id = v_pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, attempts, CASE WHEN p_count THEN nextval('{n_acquired}') END
          INTO o_id, o_body, o_attempts, v_ahead;
        IF FOUND THEN o_status := 0; RETURN {record}; END IF;
        o_lease := NULL;
      END IF;
      v_rec := {fn_take}(v_pos, p_lease_ms, p_count);
      IF get_byte(v_rec, 0) <> 3 THEN RETURN v_rec; END IF;
      v_i := v_i + 1;
      IF v_i >= 1000 THEN o_status := 1; RETURN {record}; END IF;
    END LOOP;
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_pop_many}(p_max int, p_lease_ms bigint) RETURNS bytea
LANGUAGE plpgsql AS $fn$
DECLARE
  v_rec bytea; v_out bytea := ''; v_got int := 0; v_k int; v_pos bigint[]; v_pushed bigint; v_popped bigint;
  v_p bigint; v_now timestamptz := clock_timestamp(); v_taken bigint[]; v_msgs int := 0; v_wait boolean := false;
BEGIN
  -- Counted once, at the end: the totals are sequences, which a rollback (a deadlock victim
  -- retried by its client) does not undo, so nothing is counted before the last lock is taken.
  -- 1. Redeliveries and the empty-ring case go through the single pop, one by one.
  WHILE v_got < p_max AND EXISTS (SELECT 1 FROM {spill} WHERE state = 1 AND visible_at <= v_now) LOOP
    v_rec := {fn_pop}(p_lease_ms, false);
    EXIT WHEN get_byte(v_rec, 0) = 1;
    v_out := v_out || v_rec;
    IF get_byte(v_rec, 0) = 2 THEN v_wait := true; EXIT; END IF;  -- the caller waits for that position
    v_got := v_got + 1;
  END LOOP;
  v_msgs := v_got;
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_pushed FROM {push_seq};
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_popped FROM {pop_seq};
  v_k := least(p_max - v_got, greatest(v_pushed - v_popped, 0));
  IF v_k <= 0 OR v_wait THEN
    IF v_out = '' THEN
      v_rec := {fn_pop}(p_lease_ms, false);
      IF get_byte(v_rec, 0) <> 1 THEN v_out := v_rec; END IF;
      IF get_byte(v_rec, 0) = 0 THEN v_msgs := 1; END IF;
    END IF;
  ELSE
    -- 2. The ring: draw k positions in one statement, claim their slots in one update, and
    -- pack what it took into one value, in push order.
    SELECT array_agg(nextval('{pop_seq}') ORDER BY g) INTO v_pos FROM generate_series(1, v_k) g;
    IF p_lease_ms <= 0 THEN
      WITH t AS (
        UPDATE {ring} SET state = 0 FROM unnest(v_pos) p(pos)
        WHERE slot = p.pos % {size} AND msg_id = p.pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, NULL::bigint AS lease, attempts)
      SELECT coalesce(string_agg({row_record}, ''::bytea ORDER BY msg_id), ''), coalesce(array_agg(msg_id), '{{}}')
      INTO v_rec, v_taken FROM t;
    ELSE
      WITH t AS (
        UPDATE {ring} SET state = 2, lease = (random() * 9007199254740991)::bigint + 1, attempts = attempts + 1,
          visible_at = v_now + p_lease_ms * interval '1 millisecond'
        FROM unnest(v_pos) p(pos)
        WHERE slot = p.pos % {size} AND msg_id = p.pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, lease, attempts)
      SELECT coalesce(string_agg({row_record}, ''::bytea ORDER BY msg_id), ''), coalesce(array_agg(msg_id), '{{}}')
      INTO v_rec, v_taken FROM t;
    END IF;
    v_out := v_out || v_rec;
    v_msgs := v_msgs + cardinality(v_taken);
    -- 3. Positions not claimed above: expired, gone, or not written yet (status 2 for the caller).
    IF cardinality(v_taken) < v_k THEN
      FOREACH v_p IN ARRAY v_pos LOOP
        CONTINUE WHEN v_p = ANY (v_taken);
        v_rec := {fn_take}(v_p, p_lease_ms, false);
        IF get_byte(v_rec, 0) IN (0, 2) THEN v_out := v_out || v_rec; END IF;
        IF get_byte(v_rec, 0) = 0 THEN v_msgs := v_msgs + 1; END IF;
      END LOOP;
    END IF;
  END IF;
  PERFORM CASE WHEN p_lease_ms <= 0 THEN nextval('{n_popped}') ELSE nextval('{n_acquired}') END
  FROM generate_series(1, v_msgs);
  RETURN v_out;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_release}(p_positions text, OUT o_released int)
LANGUAGE plpgsql AS $fn$
BEGIN
  -- The popper that drew these positions gives up waiting: remember them, so whoever finds
  -- their messages later (pop on an empty ring, or repair) delivers them.
  INSERT INTO {gap} (pos, reason)
  SELECT unnest(string_to_array(p_positions, ',')::bigint[]), 'skipped' ON CONFLICT (pos) DO NOTHING;
  GET DIAGNOSTICS o_released = ROW_COUNT;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_ack}(p_id bigint, p_lease bigint, OUT o_ok int)
LANGUAGE plpgsql AS $fn$
DECLARE v_n bigint;
BEGIN
  -- o_ok is an int: psqlODBC hands booleans over as '0'/'1' text. RETURNING counts the ack.
  UPDATE {ring} SET state = 0 WHERE slot = p_id % {size} AND msg_id = p_id AND state = 2 AND lease = p_lease
  RETURNING nextval('{n_popped}') INTO v_n;
  IF NOT FOUND THEN
    DELETE FROM {spill} WHERE msg_id = p_id AND state = 2 AND lease = p_lease
    RETURNING nextval('{n_popped}') INTO v_n;
  END IF;
  o_ok := CASE WHEN FOUND THEN 1 ELSE 0 END;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_ack_many}(p_ids text, p_leases text, OUT o_acked text)
LANGUAGE plpgsql AS $fn$
DECLARE v_ids bigint[] := string_to_array(p_ids, ',')::bigint[];
  v_leases bigint[] := string_to_array(p_leases, ',')::bigint[]; v_done bigint[];
BEGIN
  -- Two statements, not one: a lease moved from the ring to the spill table while the first
  -- ran is seen by the second, which takes a fresh snapshot.
  WITH acked AS (
    UPDATE {ring} r SET state = 0 FROM unnest(v_ids, v_leases) a(id, lease)
    WHERE r.slot = a.id % {size} AND r.msg_id = a.id AND r.state = 2 AND r.lease = a.lease
    RETURNING r.msg_id)
  SELECT coalesce(array_agg(msg_id), '{{}}') INTO v_done FROM acked;
  WITH acked AS (
    DELETE FROM {spill} s USING unnest(v_ids, v_leases) a(id, lease)
    WHERE s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.msg_id <> ALL (v_done)
    RETURNING s.msg_id)
  SELECT v_done || coalesce(array_agg(msg_id), '{{}}') INTO v_done FROM acked;
  PERFORM nextval('{n_popped}') FROM unnest(v_done);
  o_acked := coalesce(array_to_string(v_done, ','), '');
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_nack}(p_id bigint, p_lease bigint, p_delay_ms bigint, OUT o_ok int)
LANGUAGE plpgsql AS $fn$
DECLARE v_visible timestamptz := clock_timestamp() + greatest(p_delay_ms, 0) * interval '1 millisecond';
BEGIN
  WITH moved AS (
    UPDATE {ring} SET state = 0
    WHERE slot = p_id % {size} AND msg_id = p_id AND state = 2 AND lease = p_lease
    RETURNING msg_id, attempts, pushed_at, expires_at, body)
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body)
  SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_visible, m.expires_at, m.body FROM moved m;
  IF NOT FOUND THEN
    UPDATE {spill} SET state = 1, lease = 0, visible_at = v_visible
    WHERE msg_id = p_id AND state = 2 AND lease = p_lease;
  END IF;
  o_ok := CASE WHEN FOUND THEN 1 ELSE 0 END;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_repair}(p_orphan_grace_ms bigint,
  OUT o_expired_leases bigint, OUT o_orphans bigint, OUT o_expired bigint, OUT o_gaps_purged bigint)
LANGUAGE plpgsql AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_popped bigint; v_n bigint;
BEGIN
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_popped FROM {pop_seq};
  -- Rows a client is changing right now are skipped (SKIP LOCKED): they are in use, the next
  -- run looks again, and repair never waits on a client or deadlocks with one.
  -- Leases past their visibility timeout: ready again, out of ring order.
  WITH due AS (
    SELECT slot FROM {ring} WHERE state = 2 AND visible_at < v_now ORDER BY slot FOR UPDATE SKIP LOCKED),
  moved AS (
    UPDATE {ring} r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 2
    RETURNING r.msg_id, r.attempts, r.pushed_at, r.expires_at, r.body)
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body)
  SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_now, m.expires_at, m.body FROM moved m;
  GET DIAGNOSTICS o_expired_leases = ROW_COUNT;
  UPDATE {spill} s SET state = 1, lease = 0 FROM (
    SELECT msg_id FROM {spill} WHERE state = 2 AND visible_at < v_now ORDER BY msg_id FOR UPDATE SKIP LOCKED) due
  WHERE s.msg_id = due.msg_id;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  o_expired_leases := o_expired_leases + v_n;
  -- Orphans: ready messages whose pop position was drawn but never claimed (the popper died
  -- mid-call or gave up waiting). Their position is spent, so they leave ring order.
  WITH due AS (
    SELECT slot FROM {ring}
    WHERE state = 1 AND msg_id <= v_popped AND pushed_at <= v_now - p_orphan_grace_ms * interval '1 millisecond'
      AND (expires_at IS NULL OR expires_at > v_now)
    ORDER BY slot FOR UPDATE SKIP LOCKED),
  moved AS (
    UPDATE {ring} r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 1
    RETURNING r.msg_id, r.attempts, r.pushed_at, r.expires_at, r.body)
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body)
  SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_now, m.expires_at, m.body FROM moved m;
  GET DIAGNOSTICS o_orphans = ROW_COUNT;
  -- Expired messages (TTL) still in the ring: free the slot; a position not drawn yet becomes void.
  WITH due AS (
    SELECT slot FROM {ring} WHERE state = 1 AND expires_at <= v_now ORDER BY slot FOR UPDATE SKIP LOCKED),
  freed AS (
    UPDATE {ring} r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 1 RETURNING r.msg_id),
  voided AS (
    INSERT INTO {gap} (pos, reason) SELECT msg_id, 'void' FROM freed WHERE msg_id > v_popped
    ON CONFLICT (pos) DO NOTHING)
  SELECT count(*) INTO o_expired FROM freed;
  DELETE FROM {spill} s USING (
    SELECT msg_id FROM {spill} WHERE state = 1 AND expires_at <= v_now ORDER BY msg_id FOR UPDATE SKIP LOCKED) due
  WHERE s.msg_id = due.msg_id;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  o_expired := o_expired + v_n;
  PERFORM nextval('{n_expired}') FROM generate_series(1, o_expired);
  -- Gaps a whole lap behind the pop position can never be written any more.
  DELETE FROM {gap} g WHERE g.pos <= v_popped - {size}
    AND NOT EXISTS (SELECT 1 FROM {ring} r WHERE r.slot = g.pos % {size} AND r.msg_id = g.pos AND r.state = 1);
  GET DIAGNOSTICS o_gaps_purged = ROW_COUNT;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_void_holes}(p_grace_ms bigint, OUT o_holes bigint)
LANGUAGE plpgsql AS $fn$
DECLARE v_popped bigint; v_bound bigint;
BEGIN
  -- Holes: positions a pusher drew and never wrote (it died). A position drawn before a message
  -- that is already older than the grace has been unwritten at least that long: void it, so
  -- the popper that draws it moves on at once. (Should the pusher write it after all, the
  -- message is an orphan, and repair delivers it.)
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO v_popped FROM {pop_seq};
  SELECT max(msg_id) INTO v_bound FROM {ring}
  WHERE state = 1 AND msg_id > v_popped AND pushed_at <= clock_timestamp() - p_grace_ms * interval '1 millisecond';
  o_holes := 0;
  IF v_bound IS NULL THEN RETURN; END IF;
  -- Each slot stands for the one position of (v_popped, v_bound) that maps to it.
  INSERT INTO {gap} (pos, reason)
  SELECT c.p, 'void' FROM (
    SELECT r.msg_id, v_popped + 1 + ((r.slot - (v_popped + 1) % {size} + {size}) % {size}) AS p FROM {ring} r) c
  WHERE c.p < v_bound AND c.msg_id IS DISTINCT FROM c.p
  ON CONFLICT (pos) DO NOTHING;
  GET DIAGNOSTICS o_holes = ROW_COUNT;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_stats}(
  OUT o_depth bigint, OUT o_in_flight bigint, OUT o_pushed bigint, OUT o_popped bigint,
  OUT o_acquired bigint, OUT o_expired bigint, OUT o_oldest_age_s double precision)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE v_depth bigint; v_flight bigint; v_oldest timestamptz; o_oldest timestamptz;
BEGIN
  SELECT count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2), min(pushed_at) FILTER (WHERE state = 1)
  INTO o_depth, o_in_flight, o_oldest FROM {ring};
  SELECT count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2), min(pushed_at) FILTER (WHERE state = 1)
  INTO v_depth, v_flight, v_oldest FROM {spill};
  o_depth := o_depth + v_depth;
  o_in_flight := o_in_flight + v_flight;
  o_oldest_age_s := coalesce(extract(epoch FROM clock_timestamp() - least(o_oldest, v_oldest)), 0);
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO o_pushed FROM {n_pushed};
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO o_popped FROM {n_popped};
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO o_acquired FROM {n_acquired};
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO o_expired FROM {n_expired};
END $fn$
"""
