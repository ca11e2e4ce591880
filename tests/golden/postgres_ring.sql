-- step create_schema

CREATE SCHEMA IF NOT EXISTS "shopq"

-- step create_meta

CREATE TABLE IF NOT EXISTS "shopq"."dbq_queues" (
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
  updated_at timestamptz NOT NULL DEFAULT now())

-- step create_ring

CREATE TABLE IF NOT EXISTS "shopq"."orders_ring" (
  slot bigint PRIMARY KEY,
  msg_id bigint,
  state smallint NOT NULL DEFAULT 0,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at timestamptz,
  visible_at timestamptz,
  expires_at timestamptz,
  body bytea,
  headers text) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.05)

-- step fill_ring

INSERT INTO "shopq"."orders_ring" (slot, state, body) SELECT g, 0, decode(repeat('00', 300), 'hex') FROM generate_series(0, 999) g ON CONFLICT (slot) DO NOTHING

-- step create_sequences

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_push_seq" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_pop_seq" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_pushed" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_popped" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_acquired" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_expired" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_settled" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_dead" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_redriven" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_purged" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_archived" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_n_scavenged" AS bigint MINVALUE 1 START 1 CACHE 1

CREATE SEQUENCE IF NOT EXISTS "shopq"."orders_swept" AS bigint MINVALUE 1 START 1 CACHE 1

-- step reset_positions

SELECT setval('"shopq"."orders_pop_seq"', greatest((SELECT last_value FROM "shopq"."orders_push_seq"), (SELECT last_value FROM "shopq"."orders_pop_seq")), true)

SELECT setval('"shopq"."orders_push_seq"', (SELECT last_value FROM "shopq"."orders_pop_seq"), true)

-- step create_side_tables

CREATE TABLE IF NOT EXISTS "shopq"."orders_spill" (
  msg_id bigint PRIMARY KEY,
  state smallint NOT NULL,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at timestamptz NOT NULL,
  visible_at timestamptz NOT NULL,
  expires_at timestamptz,
  body bytea,
  headers text)

CREATE TABLE IF NOT EXISTS "shopq"."orders_gap" (
  pos bigint PRIMARY KEY,
  reason varchar(7) NOT NULL CHECK (reason IN ('void', 'skipped')),
  noted_at timestamptz NOT NULL DEFAULT now())

CREATE TABLE IF NOT EXISTS "shopq"."orders_staged" (
  stage text NOT NULL,
  seq bigint NOT NULL,
  first_seq bigint NOT NULL,
  packed bytea NOT NULL,
  PRIMARY KEY (stage, seq))

CREATE TABLE IF NOT EXISTS "shopq"."orders_dead" (
  source text NOT NULL,
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  error text,
  pushed_at timestamptz NOT NULL,
  dead_at timestamptz NOT NULL DEFAULT now(),
  body bytea NOT NULL,
  headers text,
  PRIMARY KEY (source, msg_id))

CREATE TABLE IF NOT EXISTS "shopq"."orders_waiters" (
  id int PRIMARY KEY CHECK (id = 1),
  until timestamptz NOT NULL)

INSERT INTO "shopq"."orders_waiters" (id, until) VALUES (1, '-infinity') ON CONFLICT (id) DO NOTHING

CREATE TABLE IF NOT EXISTS "shopq"."orders_archive" (
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  pushed_at timestamptz NOT NULL,
  acked_at timestamptz NOT NULL,
  body bytea NOT NULL,
  headers text)

CREATE INDEX IF NOT EXISTS "orders_archive_at" ON "shopq"."orders_archive" (acked_at)

CREATE INDEX IF NOT EXISTS "orders_spill_due" ON "shopq"."orders_spill" (state, visible_at)

CREATE TABLE IF NOT EXISTS "shopq"."orders_content" (
  bucket smallint NOT NULL,
  msg_id bigint NOT NULL,
  body bytea NOT NULL,
  PRIMARY KEY (bucket, msg_id))

CREATE TABLE IF NOT EXISTS "shopq"."orders_gens" (
  first_pos bigint PRIMARY KEY,
  slot_base bigint NOT NULL,
  size bigint NOT NULL CHECK (size > 0),
  started_at timestamptz NOT NULL DEFAULT now())

INSERT INTO "shopq"."orders_gens" (first_pos, slot_base, size)
SELECT 1, 0, coalesce((SELECT ring_size FROM "shopq"."dbq_queues" WHERE queue = 'orders'), 1000)
WHERE NOT EXISTS (SELECT 1 FROM "shopq"."orders_gens")

-- step key_dead_letters

ALTER TABLE "shopq"."orders_dead" ADD COLUMN IF NOT EXISTS source text NOT NULL DEFAULT 'shopq.orders'

ALTER TABLE "shopq"."orders_dead" ALTER COLUMN source DROP DEFAULT

DO $$ DECLARE v_key text; BEGIN
  SELECT c.conname INTO v_key FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
    JOIN pg_namespace s ON s.oid = t.relnamespace
  WHERE s.nspname = 'shopq' AND t.relname = 'orders_dead' AND c.contype = 'p';
  EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I, ADD PRIMARY KEY (source, msg_id)',
    'shopq', 'orders_dead', v_key);
END $$

-- step index_spill

CREATE INDEX IF NOT EXISTS "orders_spill_due" ON "shopq"."orders_spill" (state, visible_at)

-- step add_headers

ALTER TABLE "shopq"."orders_ring" ADD COLUMN IF NOT EXISTS headers text

ALTER TABLE "shopq"."orders_spill" ADD COLUMN IF NOT EXISTS headers text

ALTER TABLE "shopq"."orders_dead" ADD COLUMN IF NOT EXISTS headers text

ALTER TABLE "shopq"."orders_archive" ADD COLUMN IF NOT EXISTS headers text

-- step allow_content

ALTER TABLE "shopq"."orders_spill" ALTER COLUMN body DROP NOT NULL

-- step set_compression

ALTER TABLE "shopq"."orders_ring" ALTER COLUMN body SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4

ALTER TABLE "shopq"."orders_spill" ALTER COLUMN body SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4

ALTER TABLE "shopq"."orders_content" ALTER COLUMN body SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4

ALTER TABLE "shopq"."orders_dead" ALTER COLUMN body SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4

ALTER TABLE "shopq"."orders_archive" ALTER COLUMN body SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4

-- step seed_settled

SELECT setval('"shopq"."orders_n_settled"', greatest(v, 1), v > 0) FROM (SELECT greatest(
  (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM "shopq"."orders_n_acquired")
  - (SELECT count(*) FROM "shopq"."orders_ring" WHERE state = 2) - (SELECT count(*) FROM "shopq"."orders_spill" WHERE state = 2), 0) AS v) s

-- step create_history

CREATE TABLE IF NOT EXISTS "shopq"."dbq_stats_history" (
  queue varchar(63) NOT NULL,
  at timestamptz NOT NULL,
  depth bigint NOT NULL,
  in_flight bigint NOT NULL,
  pushed bigint NOT NULL,
  popped bigint NOT NULL,
  acquired bigint NOT NULL,
  expired bigint NOT NULL,
  oldest_age_s double precision NOT NULL,
  PRIMARY KEY (queue, at))

-- step create_routines

DROP FUNCTION IF EXISTS "shopq"."orders_take"(bigint, bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_pop"(bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_pop_many"(int, bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_push_many"(text, bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_nack"(bigint, bigint, bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_repair"(bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_stats"()

DROP FUNCTION IF EXISTS "shopq"."orders_place"(bigint, bytea, bigint, timestamptz)

DROP FUNCTION IF EXISTS "shopq"."orders_push"(bytea, bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_push_many"(bytea, text, bigint)

DROP FUNCTION IF EXISTS "shopq"."orders_defer"(bytea, text, bigint, bigint)

CREATE OR REPLACE FUNCTION "shopq"."orders_check_headers"(p_size int, p_type text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  -- Refuses a message's headers that are larger than 1024 bytes of JSON, or not an
  -- object (their size and JSON type, as the caller found them).
  IF p_size > 1024 THEN
    RAISE EXCEPTION 'dbq: headers of % bytes are larger than spec.messages.headerBytes (1024) of queue orders',
      p_size USING ERRCODE = '22001';
  END IF;
  IF p_type <> 'object' THEN
    RAISE EXCEPTION 'dbq: headers must be a JSON object of names to values, not a JSON %', p_type
      USING ERRCODE = '22023';
  END IF;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_split_headers"(p_headers text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE v_out text[];
BEGIN
  -- push_many's and defer's headers: a JSON array of one object (or null) per body, each kept
  -- as the client wrote it (json, unlike jsonb, keeps the text); NULL when no body has any.
  IF p_headers IS NULL THEN RETURN NULL; END IF;
  IF json_typeof(p_headers::json) <> 'array' THEN
    RAISE EXCEPTION 'dbq: headers of several messages are a JSON array of one object (or null) per body'
      USING ERRCODE = '22023';
  END IF;
  SELECT array_agg(CASE WHEN t = 'null' THEN NULL ELSE e::text END ORDER BY i) INTO v_out
  FROM json_array_elements(p_headers::json) WITH ORDINALITY AS x(e, i), json_typeof(e) AS t
  -- checked in the same pass, each element parsed once: only a refused one calls the check
  WHERE t = 'null' OR (octet_length(e::text) <= 1024 AND t = 'object')
    OR "shopq"."orders_check_headers"(octet_length(e::text), t) IS NULL;
  RETURN coalesce(v_out, '{}');
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_split_bodies"(p_bodies bytea, p_lengths text, p_verb text) RETURNS bytea[]
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE v_lengths int[] := string_to_array(p_lengths, ',')::int[]; v_out bytea[] := '{}'; v_at int := 1; v_i int;
BEGIN
  -- push_many's and defer's bodies: they arrive end to end in one bytea, with their lengths as
  -- comma-separated text (two parameters any driver binds, and no encoding to undo). A loop
  -- costs half what a query with a running sum does.
  FOR v_i IN 1..coalesce(cardinality(v_lengths), 0) LOOP
    v_out[v_i] := substring(p_bodies FROM v_at FOR v_lengths[v_i]);
    v_at := v_at + v_lengths[v_i];
  END LOOP;
  IF v_at - 1 <> coalesce(octet_length(p_bodies), 0) THEN
    RAISE EXCEPTION 'dbq: % got % bytes of bodies but lengths adding up to %',
      p_verb, coalesce(octet_length(p_bodies), 0), v_at - 1 USING ERRCODE = '22023';
  END IF;
  RETURN v_out;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_headers_of_dead"(p_headers text, p_error text, p_attempts int) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
  -- A dead letter's headers: the message's, with why it died (when known) and after how many
  -- attempts.
  SELECT (coalesce(p_headers::jsonb, '{}') - 'dbq-error' || jsonb_strip_nulls(jsonb_build_object('dbq-error', p_error))
    || jsonb_build_object('dbq-attempts', p_attempts))::text
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_body_of"(p_id bigint, p_remove boolean) RETURNS bytea
LANGUAGE plpgsql AS $fn$
DECLARE v_body bytea;
BEGIN
  -- The body of message p_id kept in "shopq"."orders_content" (its slot or spill row holds NULL), removed with
  -- p_remove: the message ends in the caller's transaction.
  IF p_remove THEN
    DELETE FROM "shopq"."orders_content" WHERE bucket = p_id % 8 AND msg_id = p_id RETURNING body INTO v_body;
  ELSE
    SELECT body INTO v_body FROM "shopq"."orders_content" WHERE bucket = p_id % 8 AND msg_id = p_id;
  END IF;
  IF v_body IS NULL THEN
    RAISE EXCEPTION 'dbq: message % of queue orders has no body in its content table', p_id
      USING ERRCODE = 'XX001';
  END IF;
  RETURN v_body;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_place"(p_id bigint, p_body bytea, p_ttl_ms bigint, p_now timestamptz,
  p_headers text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE v_popped bigint; v_try int := 0;
BEGIN
  LOOP
    UPDATE "shopq"."orders_ring" SET msg_id = p_id, state = 1, lease = 0, attempts = 0, pushed_at = p_now,
      visible_at = NULL, body = p_body, headers = p_headers,
      expires_at = CASE WHEN p_ttl_ms > 0 THEN p_now + p_ttl_ms * interval '1 millisecond' END
    WHERE slot = (SELECT gen.slot_base + (p_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_id) ORDER BY gen.first_pos DESC LIMIT 1) AND state = 0;
    IF FOUND THEN RETURN true; END IF;
    -- The slot still holds an earlier lap's message. A leased one moves to the spill table (its
    -- ack finds it there). A ready one whose position a popper drew but has not claimed after a
    -- few tries is an orphan and moves there too. Otherwise its popper is about to take it. A
    -- slot a popper's transaction holds is skipped (SKIP LOCKED), never waited for: that popper
    -- may itself be waiting for a position this push has drawn, and neither would move.
    v_popped := coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0);
    WITH held AS (
      SELECT slot FROM "shopq"."orders_ring"
      WHERE slot = (SELECT gen.slot_base + (p_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_id) ORDER BY gen.first_pos DESC LIMIT 1) AND (state = 2 OR (state = 1 AND v_try >= 4 AND msg_id <= v_popped))
      FOR UPDATE SKIP LOCKED),
    moved AS (
      UPDATE "shopq"."orders_ring" r SET state = 0 FROM held WHERE r.slot = held.slot
      RETURNING r.msg_id, r.lease, r.attempts, r.pushed_at, r.visible_at, r.expires_at, r.body, r.headers)
    INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    SELECT m.msg_id, CASE WHEN m.lease > 0 THEN 2 ELSE 1 END, m.lease, m.attempts, m.pushed_at,
      CASE WHEN m.lease > 0 THEN m.visible_at ELSE clock_timestamp() END, m.expires_at, m.body, m.headers
    FROM moved m;
    v_try := v_try + 1;
    IF v_try > 20 THEN
      -- The ring is full after all (pushers raced past the check), or a popper kept the slot:
      -- give the position up as void, so its popper skips it; the caller tries again.
      INSERT INTO "shopq"."orders_gap" (pos, reason) VALUES (p_id, 'void') ON CONFLICT (pos) DO NOTHING;
      RETURN false;
    END IF;
    -- Briefly at first (a popper claims its slot within microseconds), then up to 5 ms a try:
    -- about 75 ms in all before the position is given up.
    PERFORM pg_sleep(least(0.0005 * 2 ^ greatest(v_try - 4, 0), 0.005));
  END LOOP;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_push"(p_body bytea, p_ttl_ms bigint, p_headers text DEFAULT NULL, OUT o_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_used bigint; v_now timestamptz := clock_timestamp(); v_slot bytea := p_body; v_wake boolean;
  v_fenced boolean; v_base bigint; v_size bigint;
BEGIN
  IF octet_length(p_body) > 300 THEN
    IF octet_length(p_body) > 1048576 THEN
      RAISE EXCEPTION 'dbq: message of % bytes is larger than spec.messages.maxBytes (1048576) of queue orders',
        octet_length(p_body) USING ERRCODE = '22001';
    END IF;
    v_slot := NULL;  -- past a slot: the body waits in "shopq"."orders_content"
  END IF;
  IF p_headers IS NOT NULL AND (octet_length(p_headers) > 1024 OR json_typeof(p_headers::json) <> 'object') THEN
    PERFORM "shopq"."orders_check_headers"(octet_length(p_headers), json_typeof(p_headers::json));
  END IF;
  -- The fence first, alone (an expression, no query): a resize's switch waits for this push to
  -- commit, and this push for the switch, so the next statement sees any switch that committed.
  v_fenced := pg_advisory_xact_lock_shared('"shopq"."orders_push_seq"'::regclass::oid::bigint | (2::bigint << 40)) IS NOT NULL;
  -- Draw a position only if the newest generation has room; the same statement reads it (the
  -- position drawn is in it: no switch commits before this push), both positions, draws, and
  -- sees whether consumers wait (one query fewer: a push costs its statements).
  SELECT nextval('"shopq"."orders_push_seq"'), EXISTS (SELECT 1 FROM "shopq"."orders_waiters" WHERE until > v_now), gen.slot_base, gen.size
    INTO o_id, v_wake, v_base, v_size
  FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen WHERE gen.size - (coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) - greatest(coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0), gen.first_pos - 1)) > 0;
  IF NOT FOUND THEN
    o_id := -1;  -- full: nothing drawn, so nothing to repair
    RETURN;
  END IF;
  -- Consumers wait on the queue: wake them (sent at commit). While none waits, nothing is sent.
  IF v_wake THEN PERFORM pg_notify('dbq_e057b33b74bc7a84ecd1f81e', ''); END IF;
  -- The fast path inline (RETURNING counts the push); place() handles a slot an earlier lap
  -- still holds.
  UPDATE "shopq"."orders_ring" SET msg_id = o_id, state = 1, lease = 0, attempts = 0, pushed_at = v_now,
    visible_at = NULL, body = v_slot, headers = p_headers,
    expires_at = CASE WHEN p_ttl_ms > 0 THEN v_now + p_ttl_ms * interval '1 millisecond' END
  WHERE slot = v_base + o_id % v_size AND state = 0
  RETURNING nextval('"shopq"."orders_n_pushed"') INTO v_used;
  IF NOT FOUND THEN
    IF NOT "shopq"."orders_place"(o_id, v_slot, p_ttl_ms, v_now, p_headers) THEN
      o_id := -1;
      RETURN;
    END IF;
    PERFORM nextval('"shopq"."orders_n_pushed"');
  END IF;
  IF v_slot IS NULL THEN
    INSERT INTO "shopq"."orders_content" (bucket, msg_id, body) VALUES (o_id % 8, o_id, p_body);
  END IF;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_push_many"(p_bodies bytea, p_lengths text, p_ttl_ms bigint,
  p_headers text DEFAULT NULL, OUT o_ids text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
  o_ids := array_to_string(
    "shopq"."orders_push_array"("shopq"."orders_split_bodies"(p_bodies, p_lengths, 'push_many'), "shopq"."orders_split_headers"(p_headers), p_ttl_ms), ',');
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_push_array"(p_bodies bytea[], p_headers text[], p_ttl_ms bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
  v_slots bytea[]; v_n int := cardinality(p_bodies); v_k int; v_ids bigint[]; v_placed bigint[]; v_out bigint[] := '{}';
  v_room bigint; v_now timestamptz := clock_timestamp(); v_big int; v_i int; v_wake boolean; v_fenced boolean;
  v_base bigint; v_size bigint;
BEGIN
  -- push_many's and send_batch's bodies and headers (checked), in order: their ids, -1 for each
  -- the ring did not take.
  SELECT max(octet_length(b)) INTO v_big FROM unnest(p_bodies) b;
  IF v_big > 1048576 THEN
    RAISE EXCEPTION 'dbq: message of % bytes is larger than spec.messages.maxBytes (1048576) of queue orders',
      v_big USING ERRCODE = '22001';
  END IF;
  v_slots := p_bodies;
  IF v_big > 300 THEN  -- bodies past a slot wait in "shopq"."orders_content": their slots get NULL
    SELECT array_agg(CASE WHEN octet_length(b) > 300 THEN NULL ELSE b END ORDER BY i) INTO v_slots
    FROM unnest(p_bodies) WITH ORDINALITY AS x(b, i);
  END IF;
  IF p_headers IS NOT NULL AND cardinality(p_headers) <> v_n THEN
    RAISE EXCEPTION 'dbq: push_many got headers for % messages and % bodies', cardinality(p_headers), v_n
      USING ERRCODE = '22023';
  END IF;
  v_fenced := pg_advisory_xact_lock_shared('"shopq"."orders_push_seq"'::regclass::oid::bigint | (2::bigint << 40)) IS NOT NULL;  -- before the room is read: a resize's switch waits for this batch, and it for the switch
  SELECT gen.size - (coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) - greatest(coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0), gen.first_pos - 1)), EXISTS (SELECT 1 FROM "shopq"."orders_waiters" WHERE until > v_now), gen.slot_base, gen.size
    INTO v_room, v_wake, v_base, v_size
  FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen;
  v_k := least(v_n, greatest(v_room, 0));
  IF v_k > 0 AND v_wake THEN
    PERFORM pg_notify('dbq_e057b33b74bc7a84ecd1f81e', '');  -- consumers wait: wake them
  END IF;
  IF v_k > 0 THEN
    -- Reserve k positions in one statement, then fill their slots in one set-based update.
    SELECT array_agg(nextval('"shopq"."orders_push_seq"') ORDER BY g) INTO v_ids FROM generate_series(1, v_k) g;
    WITH placed AS (
      UPDATE "shopq"."orders_ring" r SET msg_id = u.id, state = 1, lease = 0, attempts = 0, pushed_at = v_now,
        visible_at = NULL, body = u.body, headers = u.headers,
        expires_at = CASE WHEN p_ttl_ms > 0 THEN v_now + p_ttl_ms * interval '1 millisecond' END
      FROM unnest(v_ids, v_slots[1:v_k], p_headers[1:v_k]) AS u(id, body, headers)
      WHERE r.slot = v_base + u.id % v_size AND r.state = 0  -- the newest generation's positions
      RETURNING u.id)
    SELECT array_agg(id) INTO v_placed FROM placed;
    -- Slots still held by an earlier lap take the slow path, one by one.
    IF coalesce(cardinality(v_placed), 0) = v_k THEN
      v_out := v_ids;
    ELSE FOR v_i IN 1..v_k LOOP
      IF v_ids[v_i] = ANY (coalesce(v_placed, '{}'))
         OR "shopq"."orders_place"(v_ids[v_i], v_slots[v_i], p_ttl_ms, v_now, p_headers[v_i]) THEN
        v_out := v_out || v_ids[v_i];
      ELSE
        v_out := v_out || -1::bigint;
      END IF;
    END LOOP; END IF;
    PERFORM nextval('"shopq"."orders_n_pushed"') FROM unnest(v_out) i WHERE i > 0;
    IF v_big > 300 THEN
      INSERT INTO "shopq"."orders_content" (bucket, msg_id, body)
      SELECT u.id % 8, u.id, u.body FROM unnest(v_out, p_bodies[1:v_k]) AS u(id, body)
      WHERE u.id > 0 AND octet_length(u.body) > 300;
    END IF;
  END IF;
  FOR v_i IN (v_k + 1)..v_n LOOP
    v_out := v_out || -1::bigint;
  END LOOP;
  RETURN v_out;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_take"(p_pos bigint, p_lease_ms bigint, p_count boolean DEFAULT true)
RETURNS bytea
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_msg bigint; v_state smallint; v_exp timestamptz;
  v_big boolean; o_status int := 2; o_id bigint := p_pos; o_body bytea; o_lease bigint; o_attempts int;
  o_headers text;
BEGIN
  -- A few rounds: a message written just after the update's snapshot is seen by the next
  -- statement (READ COMMITTED takes a snapshot per statement), so the update is repeated; and a
  -- position a pusher has drawn is usually written within microseconds, so it is looked at again
  -- at once, then waited for briefly here rather than with a round trip per look from the client.
  FOR v_round IN 1..12 LOOP
    IF p_lease_ms <= 0 THEN
      UPDATE "shopq"."orders_ring" SET state = 0 WHERE slot = (SELECT gen.slot_base + (p_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_pos) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = p_pos AND state = 1
        AND (expires_at IS NULL OR expires_at > v_now)
      RETURNING body, attempts, headers INTO o_body, o_attempts, o_headers;
      IF FOUND THEN
        IF o_body IS NULL THEN o_body := "shopq"."orders_body_of"(p_pos, true); END IF;
        IF p_count THEN PERFORM nextval('"shopq"."orders_n_popped"'); END IF;
        INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
        SELECT msg_id, attempts, pushed_at, clock_timestamp(), o_body, headers FROM "shopq"."orders_ring" WHERE slot = (SELECT gen.slot_base + (p_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_pos) ORDER BY gen.first_pos DESC LIMIT 1);
        IF p_count THEN PERFORM nextval('"shopq"."orders_n_archived"'); END IF;
        o_status := 0; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
      END IF;
    ELSE
      o_lease := (random() * 9007199254740991)::bigint + 1;
      UPDATE "shopq"."orders_ring" SET state = 2, lease = o_lease, attempts = attempts + 1,
        visible_at = v_now + p_lease_ms * interval '1 millisecond'
      WHERE slot = (SELECT gen.slot_base + (p_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_pos) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = p_pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
      RETURNING body, attempts, headers INTO o_body, o_attempts, o_headers;
      IF FOUND THEN
        IF o_body IS NULL THEN o_body := "shopq"."orders_body_of"(p_pos, false); END IF;
        IF p_count THEN PERFORM nextval('"shopq"."orders_n_acquired"'); END IF;
        o_status := 0; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
      END IF;
      o_lease := NULL;
    END IF;
    -- Not taken: find out whether it is still to come or will never come.
    SELECT msg_id, state, expires_at INTO v_msg, v_state, v_exp FROM "shopq"."orders_ring" WHERE slot = (SELECT gen.slot_base + (p_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_pos) ORDER BY gen.first_pos DESC LIMIT 1);
    IF v_msg = p_pos AND v_state = 1 THEN
      IF v_exp IS NULL OR v_exp > v_now THEN
        CONTINUE;  -- written after the update looked: take it now
      END IF;
      UPDATE "shopq"."orders_ring" SET state = 0 WHERE slot = (SELECT gen.slot_base + (p_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_pos) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = p_pos AND state = 1
      RETURNING body IS NULL INTO v_big;
      IF FOUND THEN  -- expired (TTL): dropped
        PERFORM nextval('"shopq"."orders_n_expired"');
        IF v_big THEN DELETE FROM "shopq"."orders_content" WHERE bucket = p_pos % 8 AND msg_id = p_pos; END IF;
      END IF;
      o_status := 3; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
    END IF;
    IF v_msg >= p_pos THEN  -- taken by repair, or the ring has lapped a void position
      DELETE FROM "shopq"."orders_gap" WHERE pos = p_pos;
      o_status := 3; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
    END IF;
    DELETE FROM "shopq"."orders_gap" WHERE pos = p_pos AND reason = 'void';
    IF FOUND THEN o_status := 3; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, ''); END IF;
    EXIT WHEN v_round = 12 OR p_pos > coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0);
    IF v_round > 2 THEN PERFORM pg_sleep(0.0002); END IF;
  END LOOP;
  o_body := NULL; o_attempts := NULL; o_headers := NULL;
  RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');  -- status 2: not written yet
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_pop"(p_lease_ms bigint, p_count boolean DEFAULT true) RETURNS bytea
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_exp timestamptz; v_ahead bigint; v_pos bigint; v_i int := 0; v_now timestamptz := clock_timestamp();
  v_rec bytea; o_status int := 1; o_id bigint; o_body bytea; o_lease bigint; o_attempts int; o_headers text;
  -- Redeliveries (nacked messages, expired leases, rescued orphans) wait in the spill table.
  -- One pop in 8 looks there first while the ring has messages, and every pop when
  -- it has none: looking costs a statement most pops can skip, and none waits for ever.
  v_look boolean := random() * 8 < 1;
BEGIN
  <<attempt>>
  LOOP
    -- 1. Redeliveries.
    WHILE v_look LOOP
      SELECT msg_id, body, attempts, expires_at, headers INTO o_id, o_body, o_attempts, v_exp, o_headers
      FROM "shopq"."orders_spill" WHERE state = 1 AND visible_at <= clock_timestamp()
      ORDER BY visible_at LIMIT 1 FOR UPDATE SKIP LOCKED;
      EXIT WHEN NOT FOUND;
      IF v_exp IS NOT NULL AND v_exp <= clock_timestamp() THEN  -- expired while waiting
        DELETE FROM "shopq"."orders_spill" WHERE msg_id = o_id;
        IF o_body IS NULL THEN DELETE FROM "shopq"."orders_content" WHERE bucket = o_id % 8 AND msg_id = o_id; END IF;
        PERFORM nextval('"shopq"."orders_n_expired"');
        CONTINUE;
      END IF;
      IF o_body IS NULL THEN o_body := "shopq"."orders_body_of"(o_id, p_lease_ms <= 0); END IF;
      IF p_lease_ms <= 0 THEN
        INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
        SELECT msg_id, attempts, pushed_at, clock_timestamp(), o_body, headers FROM "shopq"."orders_spill" WHERE msg_id = o_id;
        IF p_count THEN PERFORM nextval('"shopq"."orders_n_archived"'); END IF;
        DELETE FROM "shopq"."orders_spill" WHERE msg_id = o_id;
        IF p_count THEN PERFORM nextval('"shopq"."orders_n_popped"'); END IF;
      ELSE
        o_lease := (random() * 9007199254740991)::bigint + 1;
        o_attempts := o_attempts + 1;
        UPDATE "shopq"."orders_spill" SET state = 2, lease = o_lease, attempts = o_attempts,
          visible_at = clock_timestamp() + p_lease_ms * interval '1 millisecond' WHERE msg_id = o_id;
        IF p_count THEN PERFORM nextval('"shopq"."orders_n_acquired"'); END IF;
      END IF;
      o_status := 0; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
    END LOOP;
    o_id := NULL; o_body := NULL; o_attempts := NULL; o_headers := NULL;
    -- 2. The ring, in push order.
    LOOP
      -- Draw a position only if a push is ahead of the pops (one statement reads both and draws).
      SELECT nextval('"shopq"."orders_pop_seq"') INTO v_pos WHERE coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) > coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0);
      IF NOT FOUND THEN
        IF NOT v_look THEN v_look := true; CONTINUE attempt; END IF;
        -- Nothing new. A position whose popper gave up may have received its message since.
        SELECT g.pos INTO v_pos FROM "shopq"."orders_gap" g JOIN "shopq"."orders_ring" r ON r.slot = (SELECT gen.slot_base + (g.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (g.pos) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = g.pos
        WHERE g.reason = 'skipped' AND r.state = 1 LIMIT 1 FOR UPDATE OF g SKIP LOCKED;
        IF FOUND THEN
          DELETE FROM "shopq"."orders_gap" WHERE pos = v_pos;
          v_rec := "shopq"."orders_take"(v_pos, p_lease_ms, p_count);
          IF get_byte(v_rec, 0) = 0 THEN RETURN v_rec; END IF;
        END IF;
        o_status := 1; o_lease := NULL;
        RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');  -- empty
      END IF;
      IF p_lease_ms <= 0 THEN  -- the fast path inline (RETURNING counts it); take() covers the rest
        UPDATE "shopq"."orders_ring" SET state = 0 WHERE slot = (SELECT gen.slot_base + (v_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_pos) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = v_pos AND state = 1
          AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, attempts, headers, CASE WHEN p_count THEN nextval('"shopq"."orders_n_popped"') END
          INTO o_id, o_body, o_attempts, o_headers, v_ahead;
        IF FOUND THEN
          IF o_body IS NULL THEN o_body := "shopq"."orders_body_of"(o_id, true); END IF;
          INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
          SELECT msg_id, attempts, pushed_at, clock_timestamp(), o_body, headers FROM "shopq"."orders_ring" WHERE slot = (SELECT gen.slot_base + (v_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_pos) ORDER BY gen.first_pos DESC LIMIT 1);
          IF p_count THEN PERFORM nextval('"shopq"."orders_n_archived"'); END IF;
          o_status := 0; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
        END IF;
      ELSE
        o_lease := (random() * 9007199254740991)::bigint + 1;
        UPDATE "shopq"."orders_ring" SET state = 2, lease = o_lease, attempts = attempts + 1,
          visible_at = v_now + p_lease_ms * interval '1 millisecond'
        WHERE slot = (SELECT gen.slot_base + (v_pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_pos) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = v_pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, attempts, headers, CASE WHEN p_count THEN nextval('"shopq"."orders_n_acquired"') END
          INTO o_id, o_body, o_attempts, o_headers, v_ahead;
        IF FOUND THEN
          IF o_body IS NULL THEN o_body := "shopq"."orders_body_of"(o_id, false); END IF;
          o_status := 0; RETURN substring(int4send(o_status) FROM 4) || int8send(coalesce(o_id, 0)) || int8send(coalesce(o_lease, 0)) || int4send(coalesce(o_attempts, 0)) || int4send(coalesce(octet_length(convert_to(o_headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(o_body), 0)) || coalesce(convert_to(o_headers, 'UTF8'), '') || coalesce(o_body, '');
        END IF;
        o_lease := NULL;
      END IF;
      v_rec := "shopq"."orders_take"(v_pos, p_lease_ms, p_count);
      IF get_byte(v_rec, 0) <> 3 THEN RETURN v_rec; END IF;
      -- A run of positions that will never be written (delayed messages push void ones): the
      -- due redeliveries and delayed messages are looked at every 1000 of them, and the pop goes
      -- on until it finds a message or no position is ahead (each turn spends one position).
      v_i := v_i + 1;
      IF v_i % 1000 = 0 THEN v_look := true; CONTINUE attempt; END IF;
    END LOOP;
  END LOOP;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_pop_many"(p_max int, p_lease_ms bigint) RETURNS bytea
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
  v_rec bytea; v_out bytea := ''; v_got int := 0; v_k int; v_pos bigint[]; v_pushed bigint; v_popped bigint;
  v_p bigint; v_now timestamptz := clock_timestamp(); v_taken bigint[]; v_msgs int := 0; v_wait boolean := false;
  v_bigs bigint[]; v_first bigint; v_base bigint; v_size bigint;
BEGIN
  -- Counted once, at the end: the totals are sequences, which a rollback (a deadlock victim
  -- retried by its client) does not undo, so nothing is counted before the last lock is taken.
  -- 1. Redeliveries and the empty-ring case go through the single pop, one by one.
  WHILE v_got < p_max AND EXISTS (SELECT 1 FROM "shopq"."orders_spill" WHERE state = 1 AND visible_at <= v_now) LOOP
    v_rec := "shopq"."orders_pop"(p_lease_ms, false);
    EXIT WHEN get_byte(v_rec, 0) = 1;
    v_out := v_out || v_rec;
    IF get_byte(v_rec, 0) = 2 THEN v_wait := true; EXIT; END IF;  -- the caller waits for that position
    v_got := v_got + 1;
  END LOOP;
  v_msgs := v_got;
  -- The positions, and the newest generation: the slot of a position in it is computed, an older
  -- one's is looked up. A position of a generation switched to since goes to take() in step 3.
  SELECT coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0), coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0), gen.first_pos, gen.slot_base, gen.size
    INTO v_pushed, v_popped, v_first, v_base, v_size FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen;
  v_k := least(p_max - v_got, greatest(v_pushed - v_popped, 0));
  IF v_k <= 0 OR v_wait THEN
    IF v_out = '' THEN
      v_rec := "shopq"."orders_pop"(p_lease_ms, false);
      IF get_byte(v_rec, 0) <> 1 THEN v_out := v_rec; END IF;
      IF get_byte(v_rec, 0) = 0 THEN v_msgs := 1; END IF;
    END IF;
  ELSE
    -- 2. The ring: draw up to k positions in one statement, claim their slots in one update,
    -- and pack what it took into one value, in push order. Each position is drawn only while a
    -- push read above is still ahead (as in pop): poppers drawing at once never pass the pushes,
    -- whose positions they would wait for in vain.
    SELECT array_agg(d.p ORDER BY d.p) INTO v_pos FROM (
      SELECT nextval('"shopq"."orders_pop_seq"') AS p FROM generate_series(1, v_k) g
      WHERE v_pushed > coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0)) d;  -- volatile: looked at again for each row
    v_pos := coalesce(v_pos, '{}');
    v_k := cardinality(v_pos);
    -- A body in "shopq"."orders_content" is read in the same statement (COALESCE evaluates the subquery only
    -- for a NULL body); a pop removes it after.
    IF p_lease_ms <= 0 THEN
      WITH t AS (
        UPDATE "shopq"."orders_ring" r SET state = 0 FROM unnest(v_pos) p(pos)
        WHERE r.slot = CASE WHEN p.pos >= v_first THEN v_base + p.pos % v_size ELSE (SELECT gen.slot_base + (p.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC LIMIT 1) END
          AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
        RETURNING r.msg_id, NULL::bigint AS lease, r.attempts, r.headers, r.body IS NULL AS big, coalesce(r.body,
          (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = r.msg_id % 8 AND c.msg_id = r.msg_id)) AS body)
      SELECT coalesce(string_agg(substring(int4send(0) FROM 4) || int8send(coalesce(msg_id, 0)) || int8send(coalesce(lease, 0)) || int4send(coalesce(attempts, 0)) || int4send(coalesce(octet_length(convert_to(headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(body), 0)) || coalesce(convert_to(headers, 'UTF8'), '') || coalesce(body, ''), ''::bytea ORDER BY msg_id), ''), coalesce(array_agg(msg_id), '{}'),
        array_agg(msg_id) FILTER (WHERE big)
      INTO v_rec, v_taken, v_bigs FROM t;
      INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT r.msg_id, r.attempts, r.pushed_at, clock_timestamp(),
        coalesce(r.body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = r.msg_id % 8 AND c.msg_id = r.msg_id)),
        r.headers
      FROM unnest(v_taken) p(pos) JOIN "shopq"."orders_ring" r ON r.slot = (SELECT gen.slot_base + (p.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = p.pos;
      IF v_bigs IS NOT NULL THEN
        DELETE FROM "shopq"."orders_content" c USING unnest(v_bigs) b(id) WHERE c.bucket = b.id % 8 AND c.msg_id = b.id;
      END IF;
    ELSE
      WITH t AS (
        UPDATE "shopq"."orders_ring" r SET state = 2, lease = (random() * 9007199254740991)::bigint + 1, attempts = r.attempts + 1,
          visible_at = v_now + p_lease_ms * interval '1 millisecond'
        FROM unnest(v_pos) p(pos)
        WHERE r.slot = CASE WHEN p.pos >= v_first THEN v_base + p.pos % v_size ELSE (SELECT gen.slot_base + (p.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC LIMIT 1) END
          AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
        RETURNING r.msg_id, r.lease, r.attempts, r.headers, coalesce(r.body,
          (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = r.msg_id % 8 AND c.msg_id = r.msg_id)) AS body)
      SELECT coalesce(string_agg(substring(int4send(0) FROM 4) || int8send(coalesce(msg_id, 0)) || int8send(coalesce(lease, 0)) || int4send(coalesce(attempts, 0)) || int4send(coalesce(octet_length(convert_to(headers, 'UTF8')), 0)) || int4send(coalesce(octet_length(body), 0)) || coalesce(convert_to(headers, 'UTF8'), '') || coalesce(body, ''), ''::bytea ORDER BY msg_id), ''), coalesce(array_agg(msg_id), '{}')
      INTO v_rec, v_taken FROM t;
    END IF;
    v_out := v_out || v_rec;
    v_msgs := v_msgs + cardinality(v_taken);
    -- 3. Positions not claimed above: expired, gone, or not written yet (status 2 for the caller).
    IF cardinality(v_taken) < v_k THEN
      FOREACH v_p IN ARRAY v_pos LOOP
        CONTINUE WHEN v_p = ANY (v_taken);
        v_rec := "shopq"."orders_take"(v_p, p_lease_ms, false);
        IF get_byte(v_rec, 0) IN (0, 2) THEN v_out := v_out || v_rec; END IF;
        IF get_byte(v_rec, 0) = 0 THEN v_msgs := v_msgs + 1; END IF;
      END LOOP;
    END IF;
  END IF;
  PERFORM CASE WHEN p_lease_ms <= 0 THEN nextval('"shopq"."orders_n_popped"') ELSE nextval('"shopq"."orders_n_acquired"') END
  FROM generate_series(1, v_msgs);
  PERFORM nextval('"shopq"."orders_n_archived"') FROM generate_series(1, v_msgs) WHERE p_lease_ms <= 0;
  RETURN v_out;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_release"(p_positions text, OUT o_released int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
  -- The popper that drew these positions gives up waiting: remember them, so whoever finds
  -- their messages later (pop on an empty ring, or repair) delivers them.
  INSERT INTO "shopq"."orders_gap" (pos, reason)
  SELECT unnest(string_to_array(p_positions, ',')::bigint[]), 'skipped' ON CONFLICT (pos) DO NOTHING;
  GET DIAGNOSTICS o_released = ROW_COUNT;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_ack"(p_id bigint, p_lease bigint, OUT o_ok int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_n bigint; v_big boolean;
BEGIN
  -- o_ok is an int: psqlODBC hands booleans over as '0'/'1' text. RETURNING counts the ack.
  -- A lease past its visibility timeout is lost, whether or not a repair has run since.
  UPDATE "shopq"."orders_ring" SET state = 0 WHERE slot = (SELECT gen.slot_base + (p_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_id) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
  RETURNING nextval('"shopq"."orders_n_popped"'), body IS NULL INTO v_n, v_big;
  IF FOUND THEN
    INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT msg_id, attempts, pushed_at, clock_timestamp(),
      coalesce(body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = p_id % 8 AND c.msg_id = p_id)), headers
    FROM "shopq"."orders_ring" WHERE slot = (SELECT gen.slot_base + (p_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_id) ORDER BY gen.first_pos DESC LIMIT 1);
  ELSE
    WITH acked AS (
      DELETE FROM "shopq"."orders_spill" WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
      RETURNING msg_id, attempts, pushed_at, body, headers),
    kept AS (
      INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT msg_id, attempts, pushed_at, clock_timestamp(),
        coalesce(body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = p_id % 8 AND c.msg_id = p_id)), headers
      FROM acked)
    SELECT nextval('"shopq"."orders_n_popped"'), body IS NULL INTO v_n, v_big FROM acked;
  END IF;
  IF FOUND THEN PERFORM nextval('"shopq"."orders_n_archived"'); END IF;
  o_ok := CASE WHEN FOUND THEN 1 ELSE 0 END;
  IF o_ok = 1 THEN PERFORM nextval('"shopq"."orders_n_settled"'); END IF;  -- the lease ended
  IF v_big THEN DELETE FROM "shopq"."orders_content" WHERE bucket = p_id % 8 AND msg_id = p_id; END IF;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_ack_many"(p_ids text, p_leases text, OUT o_acked text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_ids bigint[] := string_to_array(p_ids, ',')::bigint[];
  v_leases bigint[] := string_to_array(p_leases, ',')::bigint[]; v_done bigint[]; v_bigs bigint[];
  v_first bigint; v_base bigint; v_size bigint;
BEGIN
  -- The newest generation: the slot of a message in it is computed, an older one's looked up.
  SELECT gen.first_pos, gen.slot_base, gen.size INTO v_first, v_base, v_size FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen;
  -- Two statements, not one: a lease moved from the ring to the spill table while the first
  -- ran is seen by the second, which takes a fresh snapshot. The second runs only for the
  -- messages the first did not find.
  WITH acked AS (
    UPDATE "shopq"."orders_ring" r SET state = 0 FROM unnest(v_ids, v_leases) a(id, lease)
    WHERE r.slot = CASE WHEN a.id >= v_first THEN v_base + a.id % v_size ELSE (SELECT gen.slot_base + (a.id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (a.id) ORDER BY gen.first_pos DESC LIMIT 1) END
      AND r.msg_id = a.id AND r.state = 2 AND r.lease = a.lease AND r.visible_at > clock_timestamp()
    RETURNING r.msg_id, r.body IS NULL AS big)
  SELECT coalesce(array_agg(msg_id), '{}'), array_agg(msg_id) FILTER (WHERE big) INTO v_done, v_bigs FROM acked;
  INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT r.msg_id, r.attempts, r.pushed_at, clock_timestamp(),
    coalesce(r.body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = r.msg_id % 8 AND c.msg_id = r.msg_id)),
    r.headers
  FROM unnest(v_done) d(id) JOIN "shopq"."orders_ring" r ON r.slot = (SELECT gen.slot_base + (d.id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (d.id) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = d.id;
  WITH acked AS (
    DELETE FROM "shopq"."orders_spill" s USING unnest(v_ids, v_leases) a(id, lease)
    WHERE cardinality(v_done) < cardinality(v_ids)
      AND s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.visible_at > clock_timestamp() AND s.msg_id <> ALL (v_done)
    RETURNING s.msg_id, s.attempts, s.pushed_at, s.body, s.headers),
  kept AS (
    INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT msg_id, attempts, pushed_at, clock_timestamp(),
      coalesce(body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = acked.msg_id % 8 AND c.msg_id = acked.msg_id)),
      headers
    FROM acked)
  SELECT v_done || coalesce(array_agg(msg_id), '{}'), v_bigs || array_agg(msg_id) FILTER (WHERE body IS NULL)
  INTO v_done, v_bigs FROM acked;
  PERFORM nextval('"shopq"."orders_n_archived"') FROM unnest(v_done);
  PERFORM nextval('"shopq"."orders_n_popped"'), nextval('"shopq"."orders_n_settled"') FROM unnest(v_done);
  IF v_bigs IS NOT NULL THEN
    DELETE FROM "shopq"."orders_content" c USING unnest(v_bigs) b(id) WHERE c.bucket = b.id % 8 AND c.msg_id = b.id;
  END IF;
  o_acked := coalesce(array_to_string(v_done, ','), '');
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_nack"(p_id bigint, p_lease bigint, p_delay_ms bigint, p_error text, OUT o_ok int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_visible timestamptz := clock_timestamp() + greatest(p_delay_ms, 0) * interval '1 millisecond';
  v_attempts int; v_pushed timestamptz; v_expires timestamptz; v_body bytea; v_headers text;
  v_spilled boolean := false;
BEGIN
  -- o_ok: 0 no lease (expired, or acked already), 1 ready again after the delay, 2 dead-lettered:
  -- acquired 5 times (when that is > 0), it moves to the dead letters with the
  -- error, in this transaction. A negative delay gives it back unhandled (a consumer stopping):
  -- ready at once, and this delivery does not count as an attempt.
  UPDATE "shopq"."orders_ring" SET state = 0
  WHERE slot = (SELECT gen.slot_base + (p_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_id) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
  RETURNING attempts, pushed_at, expires_at, body, headers INTO v_attempts, v_pushed, v_expires, v_body, v_headers;
  IF NOT FOUND THEN
    SELECT attempts, pushed_at, expires_at, body, headers INTO v_attempts, v_pushed, v_expires, v_body, v_headers
    FROM "shopq"."orders_spill"
    WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp() FOR UPDATE;
    IF NOT FOUND THEN o_ok := 0; RETURN; END IF;
    v_spilled := true;
  END IF;
  PERFORM nextval('"shopq"."orders_n_settled"');  -- the lease ended
  IF p_delay_ms < 0 THEN
    v_attempts := greatest(v_attempts - 1, 0);
  ELSIF 5 > 0 AND v_attempts >= 5 THEN
    IF v_spilled THEN DELETE FROM "shopq"."orders_spill" WHERE msg_id = p_id; END IF;
    IF v_body IS NULL THEN v_body := "shopq"."orders_body_of"(p_id, true); END IF;  -- a dead letter holds its body
    INSERT INTO "shopq"."orders_dead" (source, msg_id, attempts, error, pushed_at, body, headers)
    VALUES ('shopq.orders', p_id, v_attempts, left(p_error, 4000), v_pushed, v_body,
      "shopq"."orders_headers_of_dead"(v_headers, left(p_error, 4000), v_attempts))
    ON CONFLICT (source, msg_id) DO NOTHING;
    PERFORM nextval('"shopq"."orders_n_dead"');
    o_ok := 2; RETURN;
  END IF;
  IF v_spilled THEN
    UPDATE "shopq"."orders_spill" SET state = 1, lease = 0, visible_at = v_visible, attempts = v_attempts WHERE msg_id = p_id;
  ELSE
    INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    VALUES (p_id, 1, 0, v_attempts, v_pushed, v_visible, v_expires, v_body, v_headers);
  END IF;
  o_ok := 1;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_expire_leases"(OUT o_expired bigint, OUT o_dead bigint)
LANGUAGE plpgsql AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_n bigint; v_dead bigint;
BEGIN
  -- Called by repair (the operator's cleanup) and by read at most once a second (version 23 on),
  -- so an expired lease comes back without the operator, as PGMQ's visibility timeout does.
  -- Leases past their visibility timeout: ready again, out of ring order; those acquired
  -- 5 times (when that is > 0) go to the dead letters instead.
  WITH due AS (
    SELECT slot FROM "shopq"."orders_ring" WHERE state = 2 AND visible_at < v_now ORDER BY slot FOR UPDATE SKIP LOCKED),
  moved AS (
    UPDATE "shopq"."orders_ring" r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 2
    RETURNING r.msg_id, r.attempts, r.pushed_at, r.expires_at, r.body, r.headers),
  dead AS (
    INSERT INTO "shopq"."orders_dead" (source, msg_id, attempts, error, pushed_at, body, headers)
    SELECT 'shopq.orders', m.msg_id, m.attempts, 'lease expired (visibility timeout)', m.pushed_at,
      coalesce(m.body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = m.msg_id % 8 AND c.msg_id = m.msg_id)),
      "shopq"."orders_headers_of_dead"(m.headers, 'lease expired (visibility timeout)', m.attempts) FROM moved m
    WHERE 5 > 0 AND m.attempts >= 5 ON CONFLICT (source, msg_id) DO NOTHING RETURNING msg_id),
  unkept AS (  -- (all parts of one statement see the same snapshot: the copy above reads it first)
    DELETE FROM "shopq"."orders_content" c USING moved m WHERE m.body IS NULL AND 5 > 0
      AND m.attempts >= 5 AND c.bucket = m.msg_id % 8 AND c.msg_id = m.msg_id),
  ready AS (
    INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_now, m.expires_at, m.body, m.headers FROM moved m
    WHERE NOT (5 > 0 AND m.attempts >= 5) RETURNING msg_id)
  SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM dead) INTO o_expired, o_dead;
  WITH due AS (
    SELECT msg_id FROM "shopq"."orders_spill" WHERE state = 2 AND visible_at < v_now ORDER BY msg_id FOR UPDATE SKIP LOCKED),
  gone AS (
    DELETE FROM "shopq"."orders_spill" s USING due WHERE s.msg_id = due.msg_id AND 5 > 0 AND s.attempts >= 5
    RETURNING s.msg_id, s.attempts, s.pushed_at, s.body, s.headers),
  dead AS (
    INSERT INTO "shopq"."orders_dead" (source, msg_id, attempts, error, pushed_at, body, headers)
    SELECT 'shopq.orders', g.msg_id, g.attempts, 'lease expired (visibility timeout)', g.pushed_at,
      coalesce(g.body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id)),
      "shopq"."orders_headers_of_dead"(g.headers, 'lease expired (visibility timeout)', g.attempts) FROM gone g
    ON CONFLICT (source, msg_id) DO NOTHING),
  unkept AS (
    DELETE FROM "shopq"."orders_content" c USING gone g
    WHERE g.body IS NULL AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id),
  ready AS (
    UPDATE "shopq"."orders_spill" s SET state = 1, lease = 0 FROM due
    WHERE s.msg_id = due.msg_id AND NOT (5 > 0 AND s.attempts >= 5) RETURNING 1)
  SELECT (SELECT count(*) FROM ready) + (SELECT count(*) FROM gone), (SELECT count(*) FROM gone) INTO v_n, v_dead;
  o_expired := o_expired + v_n;
  o_dead := o_dead + v_dead;
  PERFORM nextval('"shopq"."orders_n_settled"') FROM generate_series(1, o_expired);
  PERFORM nextval('"shopq"."orders_n_dead"') FROM generate_series(1, o_dead);
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_repair"(p_orphan_grace_ms bigint,
  OUT o_expired_leases bigint, OUT o_orphans bigint, OUT o_expired bigint, OUT o_gaps_purged bigint,
  OUT o_dead bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_popped bigint; v_n bigint;
BEGIN
  v_popped := coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0);
  -- Rows a client is changing right now are skipped (SKIP LOCKED): they are in use, the next
  -- run looks again, and repair never waits on a client or deadlocks with one.
  SELECT e.o_expired, e.o_dead INTO o_expired_leases, o_dead FROM "shopq"."orders_expire_leases"() e;
  -- Orphans: ready messages whose pop position was drawn but never claimed (the popper died
  -- mid-call or gave up waiting). Their position is spent, so they leave ring order.
  WITH due AS (
    SELECT slot FROM "shopq"."orders_ring"
    WHERE state = 1 AND msg_id <= v_popped AND pushed_at <= v_now - p_orphan_grace_ms * interval '1 millisecond'
      AND (expires_at IS NULL OR expires_at > v_now)
    ORDER BY slot FOR UPDATE SKIP LOCKED),
  moved AS (
    UPDATE "shopq"."orders_ring" r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 1
    RETURNING r.msg_id, r.attempts, r.pushed_at, r.expires_at, r.body, r.headers)
  INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_now, m.expires_at, m.body, m.headers FROM moved m;
  GET DIAGNOSTICS o_orphans = ROW_COUNT;
  -- Expired messages (TTL) still in the ring: free the slot; a position not drawn yet becomes void.
  WITH due AS (
    SELECT slot FROM "shopq"."orders_ring" WHERE state = 1 AND expires_at <= v_now ORDER BY slot FOR UPDATE SKIP LOCKED),
  freed AS (
    UPDATE "shopq"."orders_ring" r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 1
    RETURNING r.msg_id, r.body IS NULL AS big),
  unkept AS (
    DELETE FROM "shopq"."orders_content" c USING freed f WHERE f.big AND c.bucket = f.msg_id % 8 AND c.msg_id = f.msg_id),
  voided AS (
    INSERT INTO "shopq"."orders_gap" (pos, reason) SELECT msg_id, 'void' FROM freed WHERE msg_id > v_popped
    ON CONFLICT (pos) DO NOTHING)
  SELECT count(*) INTO o_expired FROM freed;
  WITH gone AS (
    DELETE FROM "shopq"."orders_spill" s USING (
      SELECT msg_id FROM "shopq"."orders_spill" WHERE state = 1 AND expires_at <= v_now ORDER BY msg_id FOR UPDATE SKIP LOCKED) due
    WHERE s.msg_id = due.msg_id RETURNING s.msg_id, s.body IS NULL AS big),
  unkept AS (
    DELETE FROM "shopq"."orders_content" c USING gone g WHERE g.big AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id)
  SELECT count(*) INTO v_n FROM gone;
  o_expired := o_expired + v_n;
  PERFORM nextval('"shopq"."orders_n_expired"') FROM generate_series(1, o_expired);
  -- Content whose message is gone: none should be (a body is written and removed in its
  -- message's transactions), but should a message end without it, at most 1000 go a run.
  DELETE FROM "shopq"."orders_content" c USING (
    SELECT x.bucket, x.msg_id FROM "shopq"."orders_content" x
    WHERE NOT EXISTS (SELECT 1 FROM "shopq"."orders_ring" r WHERE r.slot = (SELECT gen.slot_base + (x.msg_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (x.msg_id) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = x.msg_id AND r.state <> 0)
      AND NOT EXISTS (SELECT 1 FROM "shopq"."orders_spill" s WHERE s.msg_id = x.msg_id)
    LIMIT 1000 FOR UPDATE OF x SKIP LOCKED) gone
  WHERE c.bucket = gone.bucket AND c.msg_id = gone.msg_id;
  -- Gaps a whole lap of the largest generation behind the pop position, or older than every
  -- generation, can never be written any more.
  DELETE FROM "shopq"."orders_gap" g
  WHERE (g.pos <= v_popped - (SELECT max(x.size) FROM "shopq"."orders_gens" x) OR g.pos < (SELECT min(x.first_pos) FROM "shopq"."orders_gens" x))
    AND NOT EXISTS (SELECT 1 FROM "shopq"."orders_ring" r WHERE r.slot = (SELECT gen.slot_base + (g.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (g.pos) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = g.pos AND r.state = 1);
  GET DIAGNOSTICS o_gaps_purged = ROW_COUNT;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_void_holes"(p_grace_ms bigint, OUT o_holes bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
DECLARE v_popped bigint; v_bound bigint; v_lo bigint; v_hi bigint; v_n bigint; g record;
BEGIN
  -- Holes: positions a pusher drew and never wrote (it died). A position drawn before a message
  -- that is already older than the grace has been unwritten at least that long: void it, so
  -- the popper that draws it moves on at once. (Should the pusher write it after all, the
  -- message is an orphan, and repair delivers it.)
  v_popped := coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0);
  SELECT max(msg_id) INTO v_bound FROM "shopq"."orders_ring"
  WHERE state = 1 AND msg_id > v_popped AND pushed_at <= clock_timestamp() - p_grace_ms * interval '1 millisecond';
  o_holes := 0;
  IF v_bound IS NULL THEN RETURN; END IF;
  -- Per generation, each of its slots stands for the one position of its part of
  -- (v_popped, v_bound) that maps to it (a part never spans more than a lap).
  FOR g IN SELECT x.first_pos, x.slot_base, x.size, lead(x.first_pos) OVER (ORDER BY x.first_pos) AS next_pos
           FROM "shopq"."orders_gens" x LOOP
    v_lo := greatest(v_popped + 1, g.first_pos);
    v_hi := least(v_bound, coalesce(g.next_pos, v_bound));
    CONTINUE WHEN v_lo >= v_hi;
    INSERT INTO "shopq"."orders_gap" (pos, reason)
    SELECT c.p, 'void' FROM (
      SELECT r.msg_id, v_lo + ((r.slot - g.slot_base - v_lo % g.size + g.size) % g.size) AS p FROM "shopq"."orders_ring" r
      WHERE r.slot >= g.slot_base AND r.slot < g.slot_base + g.size) c
    WHERE c.p < v_hi AND c.msg_id IS DISTINCT FROM c.p
    ON CONFLICT (pos) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    o_holes := o_holes + v_n;
  END LOOP;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_oldest_age"(p_pos bigint) RETURNS double precision
-- The age of the oldest ready message, from a bounded look at the head: the next 64
-- positions after pop position p_pos, the positions whose popper gave up, and the first
-- 64 redeliveries. Its own routine, called only for a queue that holds messages: an
-- empty queue's stats never plan it.
LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(extract(epoch FROM clock_timestamp() - (
    SELECT min(head.pushed_at) FROM (
      SELECT r.pushed_at FROM generate_series(1, 64) g(k)  -- constant bounds: planned as 64 rows
      JOIN "shopq"."orders_ring" r ON r.slot = (SELECT gen.slot_base + (p_pos + g.k) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_pos + g.k) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = p_pos + g.k AND r.state = 1
      UNION ALL
      SELECT r.pushed_at FROM "shopq"."orders_gap" x JOIN "shopq"."orders_ring" r ON r.slot = (SELECT gen.slot_base + (x.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (x.pos) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = x.pos AND r.state = 1
      WHERE x.reason = 'skipped'
      UNION ALL
      SELECT s.pushed_at FROM (SELECT state, pushed_at, visible_at FROM "shopq"."orders_spill" ORDER BY msg_id LIMIT 64) s
      WHERE s.state = 1 AND s.visible_at <= clock_timestamp()
    ) head)), 0)::float8
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_stats"(
  OUT o_depth bigint, OUT o_in_flight bigint, OUT o_pushed bigint, OUT o_popped bigint,
  OUT o_acquired bigint, OUT o_expired bigint, OUT o_oldest_age_s double precision,
  OUT o_dead bigint, OUT o_delayed bigint, OUT o_archived bigint)
-- One query in SQL, not PL/pgSQL: PostgreSQL keeps no plan of it in the session between calls.
-- A session that measured many queues would otherwise hold all their plans, and every DDL in the
-- database (a queue created, say) costs each session a walk over every plan it holds.
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
  -- From the totals, not a count of the ring: the same cost at any size. Messages present are
  -- those pushed (or redriven) and not yet popped, acknowledged (both counted as popped),
  -- expired or dead-lettered; in flight are the acquisitions whose lease has not ended (acked,
  -- nacked or expired: settled); delayed are the ready ones not visible yet (a count of the
  -- spill table, which holds only redeliveries and delayed messages).
  WITH totals AS (
    SELECT
      coalesce(pg_sequence_last_value('"shopq"."orders_n_pushed"'::regclass), 0) AS pushed,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_popped"'::regclass), 0) AS popped,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_acquired"'::regclass), 0) AS acquired,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_expired"'::regclass), 0) AS expired,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_settled"'::regclass), 0) AS settled,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_dead"'::regclass), 0) AS dead,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_redriven"'::regclass), 0) AS redriven,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_purged"'::regclass), 0) AS purged,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_archived"'::regclass), 0) AS archived,
      coalesce(pg_sequence_last_value('"shopq"."orders_n_scavenged"'::regclass), 0) AS scavenged,
      coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0) AS pos,
      (SELECT count(*) FROM "shopq"."orders_spill" WHERE state = 1 AND visible_at > clock_timestamp()) AS delayed
  ), counts AS (
    SELECT t.*, greatest(t.acquired - t.settled, 0) AS in_flight FROM totals t
  ), present AS (
    SELECT c.*, greatest(c.pushed + c.redriven - c.popped - c.expired - c.dead - c.in_flight - c.delayed, 0) AS depth
    FROM counts c
  )
  SELECT p.depth, p.in_flight, p.pushed, p.popped, p.acquired, p.expired,
    CASE WHEN p.depth > 0 THEN "shopq"."orders_oldest_age"(p.pos) ELSE 0 END,
    greatest(p.dead - p.redriven - p.purged, 0), p.delayed, greatest(p.archived - p.scavenged, 0)
  FROM present p
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_defer"(p_bodies bytea, p_lengths text, p_ttl_ms bigint, p_delay_ms bigint,
  p_headers text DEFAULT NULL, OUT o_ids text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_bodies bytea[] := "shopq"."orders_split_bodies"(p_bodies, p_lengths, 'defer'); v_big int; v_ids bigint[];
  v_headers text[] := "shopq"."orders_split_headers"(p_headers);
  v_now timestamptz := clock_timestamp(); v_visible timestamptz;
BEGIN
  -- Delayed messages wait aside, in the spill table, until they are due; the ring's head never
  -- waits for them. Each takes a push position, given up at once as void (poppers skip it), so
  -- its id is in push order with the others.
  SELECT max(octet_length(b)) INTO v_big FROM unnest(v_bodies) b;
  IF v_big > 1048576 THEN  -- a delayed message's spill row holds its body, whatever its size
    RAISE EXCEPTION 'dbq: message of % bytes is larger than spec.messages.maxBytes (1048576) of queue orders',
      v_big USING ERRCODE = '22001';
  END IF;
  IF v_headers IS NOT NULL AND cardinality(v_headers) <> coalesce(cardinality(v_bodies), 0) THEN
    RAISE EXCEPTION 'dbq: defer got headers for % messages and % bodies', cardinality(v_headers),
      coalesce(cardinality(v_bodies), 0) USING ERRCODE = '22023';
  END IF;
  -- Everything is checked before positions are drawn: a refusal leaves no hole behind.
  v_visible := v_now + greatest(p_delay_ms, 0) * interval '1 millisecond';
  SELECT array_agg(nextval('"shopq"."orders_push_seq"') ORDER BY g) INTO v_ids FROM generate_series(1, coalesce(cardinality(v_bodies), 0)) g;
  INSERT INTO "shopq"."orders_gap" (pos, reason) SELECT unnest(v_ids), 'void' ON CONFLICT (pos) DO NOTHING;
  INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT u.id, 1, 0, 0, v_now, v_visible,
    CASE WHEN p_ttl_ms > 0 THEN v_visible + p_ttl_ms * interval '1 millisecond' END, u.body, u.headers
  FROM unnest(v_ids, v_bodies, v_headers) AS u(id, body, headers);
  PERFORM nextval('"shopq"."orders_n_pushed"') FROM unnest(v_ids);
  o_ids := coalesce(array_to_string(v_ids, ','), '');
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_extend"(p_id bigint, p_lease bigint, p_visibility_ms bigint, OUT o_ok int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_until timestamptz := clock_timestamp() + greatest(p_visibility_ms, 1) * interval '1 millisecond';
BEGIN
  -- A handler still working keeps its lease: visible again only `p_visibility_ms` from now.
  UPDATE "shopq"."orders_ring" SET visible_at = v_until
  WHERE slot = (SELECT gen.slot_base + (p_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p_id) ORDER BY gen.first_pos DESC LIMIT 1) AND msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp();
  IF NOT FOUND THEN
    UPDATE "shopq"."orders_spill" SET visible_at = v_until
    WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp();
  END IF;
  o_ok := CASE WHEN FOUND THEN 1 ELSE 0 END;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_redrive"(p_ids text, p_max int, OUT o_moved bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
BEGIN
  -- Dead letters back to delivery (the given ids, or the oldest p_max when none are given):
  -- the same id, attempts from zero, ready at once, headers as pushed (without dbq's
  -- dead-letter keys).
  WITH moved AS (
    DELETE FROM "shopq"."orders_dead" d USING (
      SELECT msg_id FROM "shopq"."orders_dead"
      WHERE source = 'shopq.orders' AND (p_ids = '' OR msg_id = ANY (string_to_array(p_ids, ',')::bigint[]))
      ORDER BY msg_id LIMIT p_max FOR UPDATE SKIP LOCKED) pick
    WHERE d.source = 'shopq.orders' AND d.msg_id = pick.msg_id
    RETURNING d.msg_id, d.pushed_at, d.body, d.headers)
  INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT m.msg_id, 1, 0, 0, m.pushed_at, clock_timestamp(), NULL, m.body,
    nullif((m.headers::jsonb - 'dbq-error' - 'dbq-attempts')::text, '{}') FROM moved m
  ON CONFLICT (msg_id) DO NOTHING;
  GET DIAGNOSTICS o_moved = ROW_COUNT;
  PERFORM nextval('"shopq"."orders_n_redriven"') FROM generate_series(1, o_moved);
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_purge_dead"(p_ids text, p_max int, OUT o_purged bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
BEGIN
  -- Dead letters deleted for good (the given ids, or the oldest p_max when none are given).
  DELETE FROM "shopq"."orders_dead" d USING (
    SELECT msg_id FROM "shopq"."orders_dead"
    WHERE source = 'shopq.orders' AND (p_ids = '' OR msg_id = ANY (string_to_array(p_ids, ',')::bigint[]))
    ORDER BY msg_id LIMIT p_max FOR UPDATE SKIP LOCKED) pick
  WHERE d.source = 'shopq.orders' AND d.msg_id = pick.msg_id;
  GET DIAGNOSTICS o_purged = ROW_COUNT;
  PERFORM nextval('"shopq"."orders_n_purged"') FROM generate_series(1, o_purged);
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_scavenge"(p_retention_ms bigint, p_max int, OUT o_scavenged bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
BEGIN
  -- Archived messages older than the retention, the oldest p_max of them: one bounded batch, so
  -- a large backlog is removed over several short transactions, never by one huge delete.
  DELETE FROM "shopq"."orders_archive" a USING (
    SELECT ctid FROM "shopq"."orders_archive" WHERE acked_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
    ORDER BY acked_at LIMIT p_max FOR UPDATE SKIP LOCKED) old
  WHERE a.ctid = old.ctid;
  GET DIAGNOSTICS o_scavenged = ROW_COUNT;
  PERFORM nextval('"shopq"."orders_n_scavenged"') FROM generate_series(1, o_scavenged);
END $fn$

-- The row contract, for a worker in any language: one statement a call, answers as rows, no
-- status codes. read waits inside for a drawn position whose push has not committed yet (up to
-- 2000 ms in all, or a quarter of the lease if shorter; then gives it up as release
-- does), and for the first message up to p_wait_ms; send raises an error where push answers -1,
-- and send_batch when the ring took none of its bodies.
CREATE OR REPLACE FUNCTION "shopq"."orders_read"(p_qty int, p_visibility_ms bigint, p_wait_ms bigint DEFAULT 0)
RETURNS TABLE (msg_id bigint, lease bigint, attempts int, enqueued_at timestamptz, visible_at timestamptz,
  headers jsonb, body bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
DECLARE
  v_until timestamptz := clock_timestamp() + greatest(p_wait_ms, 0) * interval '1 millisecond';
  v_now timestamptz; v_lease_end timestamptz; v_due bigint[]; v_pos bigint[]; v_left bigint[]; v_gone bigint[];
  v_bigs bigint[]; v_k int; v_got int; v_n int; v_p bigint; v_rec bytea; v_h int; v_since timestamptz;
  v_ms bigint; v_leased boolean := p_visibility_ms > 0; v_pushed bigint; v_first bigint; v_base bigint; v_size bigint;
  v_grace interval := CASE WHEN p_visibility_ms > 0 THEN least(2000, greatest(p_visibility_ms / 4, 1))
    ELSE 2000 END * interval '1 millisecond';
BEGIN
  IF p_qty IS NULL OR p_qty < 1 THEN
    RAISE EXCEPTION 'dbq: read from queue orders: qty must be at least 1, not %', p_qty USING ERRCODE = '22023';
  END IF;
  IF p_visibility_ms IS NULL OR p_visibility_ms < 0 THEN
    RAISE EXCEPTION 'dbq: read from queue orders: visibility_ms must be 0 (at most once) or a lease in milliseconds, not %',
      p_visibility_ms USING ERRCODE = '22023';
  END IF;
  IF p_wait_ms IS NULL OR p_wait_ms < 0 THEN
    RAISE EXCEPTION 'dbq: read from queue orders: wait_ms must be 0 or more, not %', p_wait_ms USING ERRCODE = '22023';
  END IF;
  LOOP
    -- 0. Leases past their visibility timeout come back without the operator's cleanup: at most
    -- every 1000 ms while the totals say leases are held (a second, longer for a ring
    -- past 100,000 slots: the sweep scans the ring), every 10000 ms otherwise (should a
    -- rolled-back call have left the totals behind), by the one reader that takes the sweep's
    -- lock. Its sequence holds the last sweep's time in ms (setval is not transactional: no row is
    -- locked for it). Before this read takes its clock, so that it answers what it swept. (The
    -- CASE is in parentheses: PL/pgSQL ends an IF's condition at the first THEN it meets.)
    v_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF coalesce(pg_sequence_last_value('"shopq"."orders_swept"'::regclass), 0) < v_ms - (CASE WHEN coalesce(pg_sequence_last_value('"shopq"."orders_n_acquired"'::regclass), 0) > coalesce(pg_sequence_last_value('"shopq"."orders_n_settled"'::regclass), 0) THEN 1000 ELSE 10000 END)
        AND pg_try_advisory_xact_lock('"shopq"."orders_swept"'::regclass::oid::bigint | (1::bigint << 40)) AND coalesce(pg_sequence_last_value('"shopq"."orders_swept"'::regclass), 0) < v_ms - 1000 THEN
      PERFORM setval('"shopq"."orders_swept"', v_ms);
      PERFORM "shopq"."orders_expire_leases"();
    END IF;
    v_now := clock_timestamp();
    v_lease_end := CASE WHEN v_leased THEN v_now + p_visibility_ms * interval '1 millisecond' END;
    v_got := 0;
    -- 1. Redeliveries due (nacked, lease expired, rescued orphans, delayed), the longest due first.
    SELECT array_agg(s.msg_id ORDER BY s.visible_at) INTO v_due FROM (
      SELECT s.msg_id, s.visible_at FROM "shopq"."orders_spill" s WHERE s.state = 1 AND s.visible_at <= v_now
      ORDER BY s.visible_at LIMIT p_qty FOR UPDATE SKIP LOCKED) s;
    IF v_due IS NOT NULL THEN
      WITH gone AS (  -- expired while waiting: dropped
        DELETE FROM "shopq"."orders_spill" s USING unnest(v_due) d(id) WHERE s.msg_id = d.id AND s.expires_at <= v_now
        RETURNING s.msg_id, s.body IS NULL AS big)
      SELECT array_agg(g.msg_id), array_agg(g.msg_id) FILTER (WHERE g.big) INTO v_gone, v_bigs FROM gone g;
      IF v_gone IS NOT NULL THEN
        PERFORM nextval('"shopq"."orders_n_expired"') FROM unnest(v_gone);
        DELETE FROM "shopq"."orders_content" c USING unnest(v_bigs) b(id) WHERE c.bucket = b.id % 8 AND c.msg_id = b.id;
      END IF;
      IF v_leased THEN
        RETURN QUERY
        WITH t AS (
          UPDATE "shopq"."orders_spill" s SET state = 2, lease = (random() * 9007199254740991)::bigint + 1,
            attempts = s.attempts + 1, visible_at = v_lease_end
          FROM unnest(v_due) d(id) WHERE s.msg_id = d.id AND s.state = 1
          RETURNING s.msg_id, s.lease, s.attempts, s.pushed_at, s.headers, coalesce(s.body,
            (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = s.msg_id % 8 AND c.msg_id = s.msg_id)) AS body)
        SELECT t.msg_id, t.lease, t.attempts, t.pushed_at, v_lease_end, t.headers::jsonb, t.body
        FROM t JOIN unnest(v_due) WITH ORDINALITY d(id, i) ON d.id = t.msg_id ORDER BY d.i;
      ELSE
        RETURN QUERY
        WITH t AS (
          DELETE FROM "shopq"."orders_spill" s USING unnest(v_due) d(id) WHERE s.msg_id = d.id
          RETURNING s.msg_id, s.attempts, s.pushed_at, s.headers, s.body IS NULL AS big, coalesce(s.body,
            (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = s.msg_id % 8 AND c.msg_id = s.msg_id)) AS body),
        c AS (DELETE FROM "shopq"."orders_content" c USING t WHERE t.big AND c.bucket = t.msg_id % 8 AND c.msg_id = t.msg_id)
        , a AS (INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
          SELECT t.msg_id, t.attempts, t.pushed_at, clock_timestamp(), t.body, t.headers FROM t)
        SELECT t.msg_id, NULL::bigint, t.attempts, t.pushed_at, NULL::timestamptz, t.headers::jsonb, t.body
        FROM t JOIN unnest(v_due) WITH ORDINALITY d(id, i) ON d.id = t.msg_id ORDER BY d.i;
      END IF;
      GET DIAGNOSTICS v_got = ROW_COUNT;
    END IF;
    -- 2. The ring, in push order: positions drawn only while a push is ahead (as pop_many
    -- draws them), their slots claimed by one statement that answers the rows (computed in the
    -- newest generation, looked up in an older one, as pop_many does).
    SELECT coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0), least(p_qty - v_got, greatest(coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) - coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0), 0)), gen.first_pos, gen.slot_base, gen.size
      INTO v_pushed, v_k, v_first, v_base, v_size FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen;
    IF v_k > 0 THEN
      SELECT array_agg(d.p ORDER BY d.p) INTO v_pos FROM (
        SELECT nextval('"shopq"."orders_pop_seq"') AS p FROM generate_series(1, v_k) g
        WHERE v_pushed > coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0)) d;  -- volatile: looked at again for each row
    ELSE
      v_pos := NULL;
    END IF;
    IF v_pos IS NOT NULL THEN
      IF v_leased THEN
        RETURN QUERY
        WITH t AS (
          UPDATE "shopq"."orders_ring" r SET state = 2, lease = (random() * 9007199254740991)::bigint + 1,
            attempts = r.attempts + 1, visible_at = v_lease_end
          FROM unnest(v_pos) p(pos)
          WHERE r.slot = CASE WHEN p.pos >= v_first THEN v_base + p.pos % v_size ELSE (SELECT gen.slot_base + (p.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC LIMIT 1) END
            AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
          RETURNING r.msg_id, r.lease, r.attempts, r.pushed_at, r.headers, coalesce(r.body,
            (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = r.msg_id % 8 AND c.msg_id = r.msg_id)) AS body)
        SELECT t.msg_id, t.lease, t.attempts, t.pushed_at, v_lease_end, t.headers::jsonb, t.body FROM t ORDER BY t.msg_id;
      ELSE
        RETURN QUERY
        WITH t AS (
          UPDATE "shopq"."orders_ring" r SET state = 0 FROM unnest(v_pos) p(pos)
          WHERE r.slot = CASE WHEN p.pos >= v_first THEN v_base + p.pos % v_size ELSE (SELECT gen.slot_base + (p.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC LIMIT 1) END
            AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
          RETURNING r.msg_id, r.attempts, r.pushed_at, r.headers, r.body IS NULL AS big, coalesce(r.body,
            (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = r.msg_id % 8 AND c.msg_id = r.msg_id)) AS body),
        c AS (DELETE FROM "shopq"."orders_content" c USING t WHERE t.big AND c.bucket = t.msg_id % 8 AND c.msg_id = t.msg_id)
        , a AS (INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
          SELECT t.msg_id, t.attempts, t.pushed_at, clock_timestamp(), t.body, t.headers FROM t)
        SELECT t.msg_id, NULL::bigint, t.attempts, t.pushed_at, NULL::timestamptz, t.headers::jsonb, t.body
        FROM t ORDER BY t.msg_id;
      END IF;
      GET DIAGNOSTICS v_n = ROW_COUNT;
      v_got := v_got + v_n;
      -- Positions not claimed above (expired, gone, or still being written) go through take, which
      -- settles each; one being written is waited for here.
      IF v_n < cardinality(v_pos) THEN
        SELECT array_agg(p.pos ORDER BY p.pos) INTO v_left FROM unnest(v_pos) p(pos)
        WHERE NOT EXISTS (SELECT 1 FROM "shopq"."orders_ring" r WHERE r.slot = (SELECT gen.slot_base + (p.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = p.pos
          AND r.state = CASE WHEN v_leased THEN 2 ELSE 0 END);
      ELSE
        v_left := NULL;
      END IF;
    ELSIF v_got = 0 THEN
      -- Nothing new. A position whose popper gave up may have received its message since.
      SELECT array_agg(g.pos) INTO v_left FROM (
        SELECT g.pos FROM "shopq"."orders_gap" g JOIN "shopq"."orders_ring" r ON r.slot = (SELECT gen.slot_base + (g.pos) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (g.pos) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = g.pos
        WHERE g.reason = 'skipped' AND r.state = 1 LIMIT p_qty FOR UPDATE OF g SKIP LOCKED) g;
      DELETE FROM "shopq"."orders_gap" g USING unnest(v_left) l(pos) WHERE g.pos = l.pos;
    ELSE
      v_left := NULL;
    END IF;
    -- One grace for them all, shortened for a short lease: the leases of the rows above run.
    v_since := clock_timestamp();
    FOREACH v_p IN ARRAY coalesce(v_left, '{}') LOOP
      LOOP
        v_rec := "shopq"."orders_take"(v_p, p_visibility_ms, false);
        EXIT WHEN get_byte(v_rec, 0) <> 2;  -- taken (0) or gone (3)
        IF clock_timestamp() - v_since > v_grace THEN
          PERFORM "shopq"."orders_release"(v_p::text);  -- its pusher is taken for dead: whoever finds it later delivers it
          EXIT;
        END IF;
        PERFORM pg_sleep(0.0005);
      END LOOP;
      CONTINUE WHEN get_byte(v_rec, 0) <> 0;
      v_h := (get_byte(v_rec, 21) << 24) | (get_byte(v_rec, 22) << 16) | (get_byte(v_rec, 23) << 8) | get_byte(v_rec, 24);
      RETURN QUERY
      SELECT r.msg_id, CASE WHEN v_leased THEN r.lease END, r.attempts, r.pushed_at,
        CASE WHEN v_leased THEN r.visible_at END,
        CASE WHEN v_h > 0 THEN convert_from(substring(v_rec FROM 30 FOR v_h), 'UTF8')::jsonb END,
        substring(v_rec FROM 30 + v_h)
      FROM "shopq"."orders_ring" r WHERE r.slot = (SELECT gen.slot_base + (v_p) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_p) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = v_p;
      v_got := v_got + 1;
    END LOOP;
    IF v_got > 0 THEN
      -- Counted once, at the end, as pop_many counts (a rollback does not undo a sequence).
      PERFORM CASE WHEN v_leased THEN nextval('"shopq"."orders_n_acquired"') ELSE nextval('"shopq"."orders_n_popped"') END
      FROM generate_series(1, v_got);
      PERFORM nextval('"shopq"."orders_n_archived"') FROM generate_series(1, v_got) WHERE NOT v_leased;
      RETURN;
    END IF;
    -- Every position drawn was gone (void, as a delayed message leaves one, or deleted by id)
    -- while pushes are still ahead: draw on at once, as pop does.
    CONTINUE WHEN v_pos IS NOT NULL AND coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) > coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0);
    EXIT WHEN clock_timestamp() >= v_until;
    PERFORM pg_sleep(least(0.05, extract(epoch FROM v_until - clock_timestamp())));
  END LOOP;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_send"(p_body bytea, p_headers jsonb DEFAULT NULL, p_delay_ms bigint DEFAULT 0,
  p_ttl_ms bigint DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_id bigint;
BEGIN
  PERFORM "shopq"."orders_check_send"(1, p_delay_ms, p_ttl_ms, p_body IS NULL);
  IF p_delay_ms > 0 THEN
    RETURN "shopq"."orders_defer"(p_body, octet_length(p_body)::text, p_ttl_ms, p_delay_ms,
      CASE WHEN p_headers IS NOT NULL THEN jsonb_build_array(p_headers)::text END)::bigint;
  END IF;
  -- push draws a position only while the ring has room, so a refusal leaves no hole; a position
  -- it drew and had to give up (a slot an earlier lap still held) is void, and it is tried again.
  FOR v_try IN 1..5 LOOP
    v_id := "shopq"."orders_push"(p_body, p_ttl_ms, p_headers::text);
    EXIT WHEN v_id > 0 OR (SELECT gen.size - (coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) - greatest(coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0), gen.first_pos - 1)) FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen) <= 0;
  END LOOP;
  IF v_id < 0 THEN PERFORM "shopq"."orders_check_send"(-1, 0, 0, false); END IF;
  RETURN v_id;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_send_batch"(p_bodies bytea[], p_headers jsonb[] DEFAULT NULL,
  p_delay_ms bigint DEFAULT 0, p_ttl_ms bigint DEFAULT 0)
RETURNS TABLE (msg_id bigint) LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE v_n int := coalesce(cardinality(p_bodies), 0); v_bodies bytea; v_lengths text; v_texts text[];
  v_ids bigint[];
BEGIN
  PERFORM "shopq"."orders_check_send"(v_n, p_delay_ms, p_ttl_ms, array_position(p_bodies, NULL) IS NOT NULL);
  IF p_headers IS NOT NULL AND cardinality(p_headers) <> v_n THEN
    RAISE EXCEPTION 'dbq: send_batch to queue orders got % headers for % bodies: give one (or NULL) per body',
      cardinality(p_headers), v_n USING ERRCODE = '22023';
  END IF;
  IF v_n = 0 THEN RETURN; END IF;
  IF p_delay_ms > 0 THEN  -- defer takes the bodies end to end, as push_many does
    SELECT string_agg(b, ''::bytea ORDER BY i), string_agg(octet_length(b)::text, ',' ORDER BY i)
    INTO v_bodies, v_lengths FROM unnest(p_bodies) WITH ORDINALITY x(b, i);
    v_ids := string_to_array("shopq"."orders_defer"(v_bodies, v_lengths, p_ttl_ms, p_delay_ms,
      CASE WHEN p_headers IS NOT NULL THEN array_to_json(p_headers)::text END), ',')::bigint[];
  ELSE
    IF p_headers IS NOT NULL THEN  -- each an object (or NULL) of at most 1024 bytes
      SELECT array_agg(CASE WHEN t IS NULL OR t = 'null' THEN NULL ELSE h::text END ORDER BY i) INTO v_texts
      FROM unnest(p_headers) WITH ORDINALITY AS x(h, i), jsonb_typeof(h) AS t
      WHERE t IS NULL OR t = 'null' OR (octet_length(h::text) <= 1024 AND t = 'object')
        OR "shopq"."orders_check_headers"(octet_length(h::text), t) IS NULL;
    END IF;
    -- A batch the ring visibly has no room for is refused whole, before any of it is written.
    IF (SELECT gen.size - (coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) - greatest(coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0), gen.first_pos - 1)) FROM (SELECT slot_base, size, first_pos FROM "shopq"."orders_gens" ORDER BY first_pos DESC LIMIT 1) gen) < v_n THEN
      PERFORM "shopq"."orders_check_send"(-v_n, 0, 0, false);
    END IF;
    v_ids := "shopq"."orders_push_array"(p_bodies, v_texts, p_ttl_ms);
    -- What the ring took stays sent (an error now would leave its positions as holes): a body
    -- it did not take answers NULL, to be sent again. Refused outright only when none was taken.
    IF NOT EXISTS (SELECT 1 FROM unnest(v_ids) i WHERE i > 0) THEN
      PERFORM "shopq"."orders_check_send"(-v_n, 0, 0, false);
    END IF;
  END IF;
  RETURN QUERY SELECT CASE WHEN i > 0 THEN i END FROM unnest(v_ids) WITH ORDINALITY u(i, o) ORDER BY o;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_check_send"(p_n int, p_delay_ms bigint, p_ttl_ms bigint, p_null boolean)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  -- send's and send_batch's refusals, each naming the argument and the fix (p_n < 0: the ring
  -- took none of -p_n messages).
  IF p_n < 0 THEN
    RAISE EXCEPTION 'dbq: queue orders is full: its ring holds % messages (spec.ring.size); none of % was sent',
      (SELECT g.size FROM "shopq"."orders_gens" g ORDER BY g.first_pos DESC LIMIT 1), -p_n USING ERRCODE = '53400', HINT = 'consume faster, send later, or give the Queue a larger spec.ring.size';
  END IF;
  IF p_null THEN
    RAISE EXCEPTION 'dbq: send to queue orders: a body must not be NULL (send an empty bytea instead)'
      USING ERRCODE = '22004';
  END IF;
  IF p_delay_ms IS NULL OR p_delay_ms < 0 THEN
    RAISE EXCEPTION 'dbq: send to queue orders: delay_ms must be 0 or more, not %', p_delay_ms USING ERRCODE = '22023';
  END IF;
  IF p_ttl_ms IS NULL OR p_ttl_ms < 0 THEN
    RAISE EXCEPTION 'dbq: send to queue orders: ttl_ms must be 0 (no expiry) or more, not %', p_ttl_ms
      USING ERRCODE = '22023';
  END IF;
END $fn$

-- By id, with no lease asked (version 22 on): what a worker that keeps ids, not leases, calls
-- (PGMQ's delete, archive and set_vt). A message is found by its id without a scan: in its ring
-- slot (found from its generation) or by the spill table's key. Ready, delayed or leased alike; a lease held
-- on it is lost. An id not there (never sent, or ended already) is left out of the answer.
CREATE OR REPLACE FUNCTION "shopq"."orders_delete"(p_ids bigint[])
RETURNS TABLE (msg_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
DECLARE v_ids bigint[] := coalesce(p_ids, '{}'::bigint[]); v_ring bigint[]; v_spill bigint[]; v_leased bigint;
BEGIN
  -- Ends each message as ack does: counted as popped, kept in the archive with spec.archive. A
  -- batch in two statements, the ring's then the spill table's (a message a nack moves there
  -- meanwhile is seen by the second); a body in "shopq"."orders_content" leaves with its message.
  WITH locked AS (
    SELECT r.slot, r.state AS was FROM "shopq"."orders_ring" r JOIN (SELECT DISTINCT unnest(v_ids) AS id) d
      ON r.slot = (SELECT gen.slot_base + (d.id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (d.id) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = d.id
    WHERE r.state IN (1, 2) FOR UPDATE OF r),
  gone AS (
    UPDATE "shopq"."orders_ring" r SET state = 0 FROM locked l WHERE r.slot = l.slot
    RETURNING r.msg_id, l.was, r.attempts, r.pushed_at, r.body, r.headers),
  unkept AS (
    DELETE FROM "shopq"."orders_content" c USING gone g WHERE g.body IS NULL AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id
    RETURNING c.msg_id, c.body)
  , kept AS (
    INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT g.msg_id, g.attempts, g.pushed_at, clock_timestamp(), coalesce(g.body, u.body), g.headers
    FROM gone g LEFT JOIN unkept u ON u.msg_id = g.msg_id)
  SELECT array_agg(g.msg_id), count(*) FILTER (WHERE g.was = 2) INTO v_ring, v_leased FROM gone g;
  IF coalesce(cardinality(v_ring), 0) < cardinality(v_ids) THEN  -- not all in the ring: the spill table
    WITH gone AS (
      DELETE FROM "shopq"."orders_spill" s USING (SELECT DISTINCT unnest(v_ids) AS id) d WHERE s.msg_id = d.id
      RETURNING s.msg_id, s.state AS was, s.attempts, s.pushed_at, s.body, s.headers),
    unkept AS (
      DELETE FROM "shopq"."orders_content" c USING gone g WHERE g.body IS NULL AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id
      RETURNING c.msg_id, c.body)
    , kept AS (
      INSERT INTO "shopq"."orders_archive" (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT g.msg_id, g.attempts, g.pushed_at, clock_timestamp(), coalesce(g.body, u.body), g.headers
      FROM gone g LEFT JOIN unkept u ON u.msg_id = g.msg_id)
    SELECT array_agg(g.msg_id), v_leased + count(*) FILTER (WHERE g.was = 2) INTO v_spill, v_leased FROM gone g;
  END IF;
  v_ids := v_ring || v_spill;
  PERFORM nextval('"shopq"."orders_n_popped"') FROM unnest(v_ids);
  PERFORM nextval('"shopq"."orders_n_settled"') FROM generate_series(1, v_leased);  -- the leases it ended
  PERFORM nextval('"shopq"."orders_n_archived"') FROM unnest(v_ids);
  IF cardinality(p_ids) = 1 THEN
    RETURN QUERY SELECT unnest(v_ids);
    RETURN;
  END IF;
  RETURN QUERY SELECT d.id FROM (  -- in the order asked, each once
    SELECT u.id, min(u.i) AS i FROM unnest(p_ids) WITH ORDINALITY u(id, i) GROUP BY u.id) d
  WHERE d.id = ANY (v_ids) ORDER BY d.i;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_archive"(p_ids bigint[])
RETURNS TABLE (msg_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
  -- delete, for a queue that keeps an archive; refused for one that does not, where nothing would
  -- ever remove the copies.
  RETURN QUERY SELECT d.msg_id FROM "shopq"."orders_delete"(p_ids) d;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_set_vt"(p_ids bigint[], p_visibility_ms bigint)
RETURNS TABLE (msg_id bigint, lease bigint, attempts int, enqueued_at timestamptz, visible_at timestamptz,
  headers jsonb, body bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
DECLARE v_id bigint; v_state smallint; v_visible timestamptz;
BEGIN
  -- Each message visible again p_visibility_ms from now, and not before, whatever it was; its
  -- attempts stay. One that must wait leaves ring order for the spill table, as a nacked one does
  -- (a ready one asked for 0 ms stays where it is). Answers the messages as read does, with no lease.
  IF p_visibility_ms IS NULL OR p_visibility_ms < 0 THEN
    RAISE EXCEPTION 'dbq: set_vt on queue orders: visibility_ms must be 0 or more, not %', p_visibility_ms
      USING ERRCODE = '22023';
  END IF;
  v_visible := clock_timestamp() + p_visibility_ms * interval '1 millisecond';
  FOREACH v_id IN ARRAY coalesce(p_ids, '{}'::bigint[]) LOOP
    SELECT r.state INTO v_state FROM "shopq"."orders_ring" r
    WHERE r.slot = (SELECT gen.slot_base + (v_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_id) ORDER BY gen.first_pos DESC LIMIT 1) AND r.msg_id = v_id AND r.state IN (1, 2) FOR UPDATE;
    IF FOUND AND v_state = 1 AND p_visibility_ms = 0 THEN
      RETURN QUERY SELECT r.msg_id, NULL::bigint, r.attempts, r.pushed_at, v_visible, r.headers::jsonb,
        coalesce(r.body, "shopq"."orders_body_of"(v_id, false))
      FROM "shopq"."orders_ring" r WHERE r.slot = (SELECT gen.slot_base + (v_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_id) ORDER BY gen.first_pos DESC LIMIT 1);
      CONTINUE;
    ELSIF FOUND THEN
      INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
      SELECT r.msg_id, 1, 0, r.attempts, r.pushed_at, v_visible, r.expires_at, r.body, r.headers
      FROM "shopq"."orders_ring" r WHERE r.slot = (SELECT gen.slot_base + (v_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_id) ORDER BY gen.first_pos DESC LIMIT 1);
      UPDATE "shopq"."orders_ring" r SET state = 0 WHERE r.slot = (SELECT gen.slot_base + (v_id) % gen.size FROM "shopq"."orders_gens" gen WHERE gen.first_pos <= (v_id) ORDER BY gen.first_pos DESC LIMIT 1);
    ELSE
      SELECT s.state INTO v_state FROM "shopq"."orders_spill" s WHERE s.msg_id = v_id FOR UPDATE;
      CONTINUE WHEN NOT FOUND;
      UPDATE "shopq"."orders_spill" s SET state = 1, lease = 0, visible_at = v_visible WHERE s.msg_id = v_id;
    END IF;
    IF v_state = 2 THEN PERFORM nextval('"shopq"."orders_n_settled"'); END IF;  -- its lease ended
    RETURN QUERY SELECT s.msg_id, NULL::bigint, s.attempts, s.pushed_at, s.visible_at, s.headers::jsonb,
      coalesce(s.body, "shopq"."orders_body_of"(v_id, false))
    FROM "shopq"."orders_spill" s WHERE s.msg_id = v_id;
  END LOOP;
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_purge"(OUT o_purged bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
DECLARE v_popped bigint := coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0); v_leased bigint; v_n bigint;
BEGIN
  -- Every message ended at once, ready, delayed or leased (a lease held is lost), as PGMQ's
  -- purge_queue does (version 23 on); counted as popped, none archived. A ring position not
  -- drawn yet becomes void, so the reader that draws it moves on. A push that commits after
  -- this is kept.
  WITH locked AS (
    SELECT r.slot, r.state AS was FROM "shopq"."orders_ring" r WHERE r.state IN (1, 2) FOR UPDATE),
  gone AS (
    UPDATE "shopq"."orders_ring" r SET state = 0 FROM locked l WHERE r.slot = l.slot
    RETURNING r.msg_id, l.was, r.body IS NULL AS big),
  unkept AS (
    DELETE FROM "shopq"."orders_content" c USING gone g WHERE g.big AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id),
  voided AS (
    INSERT INTO "shopq"."orders_gap" (pos, reason) SELECT g.msg_id, 'void' FROM gone g WHERE g.msg_id > v_popped
    ON CONFLICT (pos) DO NOTHING)
  SELECT count(*), count(*) FILTER (WHERE g.was = 2) INTO o_purged, v_leased FROM gone g;
  WITH gone AS (
    DELETE FROM "shopq"."orders_spill" s RETURNING s.msg_id, s.state AS was, s.body IS NULL AS big),
  unkept AS (
    DELETE FROM "shopq"."orders_content" c USING gone g WHERE g.big AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id)
  SELECT count(*), v_leased + count(*) FILTER (WHERE g.was = 2) INTO v_n, v_leased FROM gone g;
  o_purged := o_purged + v_n;
  PERFORM nextval('"shopq"."orders_n_popped"') FROM generate_series(1, o_purged);
  PERFORM nextval('"shopq"."orders_n_settled"') FROM generate_series(1, v_leased);
END $fn$

-- What a login may read of the queue goes through routines too, so no login needs a grant on
-- a table: the metadata a client reads when it connects, the waiting messages (peek), the
-- statistics history, dead letters and the archive; and a consumer's wait mark.
CREATE OR REPLACE FUNCTION "shopq"."orders_describe"(OUT o_version int, OUT o_size bigint, OUT o_message_bytes int,
  OUT o_dead_letter_queue text, OUT o_header_bytes int, OUT o_max_headers int, OUT o_max_body_bytes int)
-- PL/pgSQL: its query is planned at the first call, once the plan has added the metadata
-- columns it reads (an upgrade adds them after the routines are made).
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
BEGIN
  SELECT schema_version, ring_size, message_bytes, dead_letter_queue, header_bytes, max_headers, max_body_bytes
  INTO o_version, o_size, o_message_bytes, o_dead_letter_queue, o_header_bytes, o_max_headers, o_max_body_bytes
  FROM "shopq"."dbq_queues" WHERE queue = 'orders';
END $fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_wait"(p_seconds int) RETURNS void
-- A consumer is about to wait: pushes notify 'dbq_e057b33b74bc7a84ecd1f81e' until p_seconds from now.
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
  UPDATE "shopq"."orders_waiters" SET until = greatest(until, now() + p_seconds * interval '1 second') WHERE id = 1
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_peek"(p_max int)
RETURNS TABLE (msg_id bigint, body bytea, attempts int, headers text)
-- Up to p_max waiting messages (written, visible, not expired, not leased) in id order, none taken.
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
  SELECT w.msg_id,
    coalesce(w.body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = w.msg_id % 8 AND c.msg_id = w.msg_id)),
    w.attempts, w.headers
  FROM (
    SELECT r.msg_id, r.body, r.attempts, r.headers FROM "shopq"."orders_ring" r WHERE r.state = 1
      AND (r.visible_at IS NULL OR r.visible_at <= now()) AND (r.expires_at IS NULL OR r.expires_at > now())
    UNION ALL
    SELECT s.msg_id, s.body, s.attempts, s.headers FROM "shopq"."orders_spill" s WHERE s.state = 1
      AND (s.visible_at IS NULL OR s.visible_at <= now()) AND (s.expires_at IS NULL OR s.expires_at > now())
  ) w ORDER BY w.msg_id LIMIT p_max
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_history"(p_since timestamptz, p_until timestamptz)
RETURNS TABLE (at_s float8, depth bigint, in_flight bigint, pushed bigint, popped bigint, acquired bigint,
  expired bigint, oldest_age_s float8)
-- The operator's statistics samples of this queue taken in [p_since, p_until), oldest first.
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
  SELECT extract(epoch FROM h.at)::float8, h.depth, h.in_flight, h.pushed, h.popped, h.acquired, h.expired,
    h.oldest_age_s
  FROM "shopq"."dbq_stats_history" h WHERE h.queue = 'orders' AND h.at >= p_since AND h.at < p_until ORDER BY h.at
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_dead_letters"(p_held boolean, p_max int)
RETURNS TABLE (msg_id bigint, attempts int, error text, pushed_at_s float8, dead_at_s float8, body bytea,
  source text, headers text)
-- This queue's dead letters wherever they are kept ("shopq"."orders_dead"), or with p_held every dead letter its
-- own table keeps (other queues' too), in id order.
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
  SELECT d.msg_id, d.attempts, d.error, extract(epoch FROM d.pushed_at)::float8, extract(epoch FROM d.dead_at)::float8,
    d.body, d.source, d.headers
  FROM "shopq"."orders_dead" d WHERE NOT p_held AND d.source = 'shopq.orders'
  UNION ALL
  SELECT o.msg_id, o.attempts, o.error, extract(epoch FROM o.pushed_at)::float8, extract(epoch FROM o.dead_at)::float8,
    o.body, o.source, o.headers
  FROM "shopq"."orders_dead" o WHERE p_held
  ORDER BY 1, 7 LIMIT p_max
$fn$

CREATE OR REPLACE FUNCTION "shopq"."orders_archived"(p_since timestamptz, p_max int)
RETURNS TABLE (msg_id bigint, attempts int, pushed_at_s float8, acked_at_s float8, body bytea, headers text)
-- Archived messages acked or popped at or after p_since, oldest first.
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, "shopq", pg_temp AS $fn$
  SELECT a.msg_id, a.attempts, extract(epoch FROM a.pushed_at)::float8, extract(epoch FROM a.acked_at)::float8,
    a.body, a.headers
  FROM "shopq"."orders_archive" a WHERE a.acked_at >= p_since ORDER BY a.acked_at, a.msg_id LIMIT p_max
$fn$

-- step record_version

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS max_attempts int NOT NULL DEFAULT 0

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS archive int NOT NULL DEFAULT 0

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS dead_letter_queue varchar(127) NOT NULL DEFAULT ''

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS header_bytes int NOT NULL DEFAULT 1024

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS max_headers int NOT NULL DEFAULT 32

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS max_body_bytes int NOT NULL DEFAULT 1048576

ALTER TABLE "shopq"."dbq_queues" ADD COLUMN IF NOT EXISTS compression varchar(8) NOT NULL DEFAULT ''

INSERT INTO "shopq"."dbq_queues" (queue, design, schema_version, ring_size, message_bytes, max_attempts, archive,
  dead_letter_queue, header_bytes, max_headers, max_body_bytes, compression)
VALUES ('orders', 'ring', 25, 1000, 300,
  5, 1, '', 1024,
  32, 1048576, 'lz4')
ON CONFLICT (queue) DO UPDATE SET schema_version = EXCLUDED.schema_version, message_bytes = EXCLUDED.message_bytes,
  max_attempts = EXCLUDED.max_attempts, archive = EXCLUDED.archive, dead_letter_queue = EXCLUDED.dead_letter_queue,
  header_bytes = EXCLUDED.header_bytes, max_headers = EXCLUDED.max_headers,
  max_body_bytes = EXCLUDED.max_body_bytes, compression = EXCLUDED.compression, updated_at = now()

-- step secure

SELECT dbq_access.ensure_owner('dbq_o_shopq_7bf52350')

SELECT dbq_access.ensure_group('dbq_r_orders_16adecff_send')

SELECT dbq_access.ensure_group('dbq_r_orders_16adecff_receive')

SELECT dbq_access.ensure_group('dbq_r_orders_16adecff_peek')

SELECT dbq_access.ensure_group('dbq_r_orders_16adecff_monitor')

SELECT dbq_access.ensure_group('dbq_r_orders_16adecff_manage')

ALTER SCHEMA "shopq" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."dbq_queues" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."dbq_stats_history" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_ring" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_spill" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_gap" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_staged" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_dead" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_waiters" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_archive" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_content" OWNER TO "dbq_o_shopq_7bf52350"

ALTER TABLE "shopq"."orders_gens" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_push_seq" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_pop_seq" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_pushed" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_popped" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_acquired" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_expired" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_settled" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_dead" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_redriven" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_purged" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_archived" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_n_scavenged" OWNER TO "dbq_o_shopq_7bf52350"

ALTER SEQUENCE "shopq"."orders_swept" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_place" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_push" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_push_many" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_take" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_pop" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_pop_many" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_release" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_ack" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_ack_many" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_nack" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_repair" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_void_holes" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_stats" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_defer" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_extend" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_redrive" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_purge_dead" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_scavenge" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_oldest_age" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_check_headers" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_split_headers" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_split_bodies" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_headers_of_dead" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_body_of" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_describe" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_wait" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_peek" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_history" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_dead_letters" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_archived" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_read" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_send" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_send_batch" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_check_send" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_push_array" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_delete" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_archive" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_set_vt" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_expire_leases" OWNER TO "dbq_o_shopq_7bf52350"

ALTER ROUTINE "shopq"."orders_purge" OWNER TO "dbq_o_shopq_7bf52350"

REVOKE ALL ON SCHEMA "shopq" FROM PUBLIC

REVOKE ALL ON TABLE "shopq"."dbq_queues", "shopq"."dbq_stats_history", "shopq"."orders_ring", "shopq"."orders_spill", "shopq"."orders_gap", "shopq"."orders_staged", "shopq"."orders_dead", "shopq"."orders_waiters", "shopq"."orders_archive", "shopq"."orders_content", "shopq"."orders_gens" FROM PUBLIC

REVOKE ALL ON SEQUENCE "shopq"."orders_push_seq", "shopq"."orders_pop_seq", "shopq"."orders_n_pushed", "shopq"."orders_n_popped", "shopq"."orders_n_acquired", "shopq"."orders_n_expired", "shopq"."orders_n_settled", "shopq"."orders_n_dead", "shopq"."orders_n_redriven", "shopq"."orders_n_purged", "shopq"."orders_n_archived", "shopq"."orders_n_scavenged", "shopq"."orders_swept" FROM PUBLIC

REVOKE ALL ON ROUTINE "shopq"."orders_place", "shopq"."orders_push", "shopq"."orders_push_many", "shopq"."orders_take", "shopq"."orders_pop", "shopq"."orders_pop_many", "shopq"."orders_release", "shopq"."orders_ack", "shopq"."orders_ack_many", "shopq"."orders_nack", "shopq"."orders_repair", "shopq"."orders_void_holes", "shopq"."orders_stats", "shopq"."orders_defer", "shopq"."orders_extend", "shopq"."orders_redrive", "shopq"."orders_purge_dead", "shopq"."orders_scavenge", "shopq"."orders_oldest_age", "shopq"."orders_check_headers", "shopq"."orders_split_headers", "shopq"."orders_split_bodies", "shopq"."orders_headers_of_dead", "shopq"."orders_body_of", "shopq"."orders_describe", "shopq"."orders_wait", "shopq"."orders_peek", "shopq"."orders_history", "shopq"."orders_dead_letters", "shopq"."orders_archived", "shopq"."orders_read", "shopq"."orders_send", "shopq"."orders_send_batch", "shopq"."orders_check_send", "shopq"."orders_push_array", "shopq"."orders_delete", "shopq"."orders_archive", "shopq"."orders_set_vt", "shopq"."orders_expire_leases", "shopq"."orders_purge" FROM PUBLIC

GRANT USAGE ON SCHEMA "shopq" TO "dbq_r_orders_16adecff_send", "dbq_r_orders_16adecff_receive", "dbq_r_orders_16adecff_peek", "dbq_r_orders_16adecff_monitor", "dbq_r_orders_16adecff_manage"

GRANT EXECUTE ON ROUTINE "shopq"."orders_push", "shopq"."orders_push_many", "shopq"."orders_defer", "shopq"."orders_send", "shopq"."orders_send_batch", "shopq"."orders_describe" TO "dbq_r_orders_16adecff_send"

GRANT EXECUTE ON ROUTINE "shopq"."orders_take", "shopq"."orders_pop", "shopq"."orders_pop_many", "shopq"."orders_release", "shopq"."orders_ack", "shopq"."orders_ack_many", "shopq"."orders_nack", "shopq"."orders_extend", "shopq"."orders_wait", "shopq"."orders_read", "shopq"."orders_delete", "shopq"."orders_archive", "shopq"."orders_set_vt", "shopq"."orders_purge", "shopq"."orders_describe" TO "dbq_r_orders_16adecff_receive"

GRANT EXECUTE ON ROUTINE "shopq"."orders_peek", "shopq"."orders_describe" TO "dbq_r_orders_16adecff_peek"

GRANT EXECUTE ON ROUTINE "shopq"."orders_stats", "shopq"."orders_history", "shopq"."orders_describe" TO "dbq_r_orders_16adecff_monitor"

GRANT EXECUTE ON ROUTINE "shopq"."orders_redrive", "shopq"."orders_purge_dead", "shopq"."orders_dead_letters", "shopq"."orders_archived", "shopq"."orders_repair", "shopq"."orders_void_holes", "shopq"."orders_scavenge", "shopq"."orders_describe" TO "dbq_r_orders_16adecff_manage"

-- teardown

DO $$ DECLARE v_roles text[]; v_role text; BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'pgmq' AND c.relname = 'dbq_queues') THEN
    RETURN;
  END IF;
  PERFORM dbq_access.ensure_owner('dbq_o_pgmq_2550fc5a');  -- this login may act for the facade's owner
  DELETE FROM pgmq.dbq_queues WHERE schema_name = 'shopq' AND queue = 'orders' RETURNING roles INTO v_roles;
  IF NOT FOUND THEN RETURN; END IF;
  PERFORM pg_advisory_xact_lock(hashtext('dbq pgmq facade'));
  FOR v_role IN SELECT r.rolname FROM pg_roles r WHERE r.rolname = ANY (v_roles) LOOP
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgmq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON SCHEMA pgmq FROM %I', v_role);
  END LOOP;
END $$

DROP FUNCTION IF EXISTS "shopq"."orders_place"

DROP FUNCTION IF EXISTS "shopq"."orders_push"

DROP FUNCTION IF EXISTS "shopq"."orders_push_many"

DROP FUNCTION IF EXISTS "shopq"."orders_take"

DROP FUNCTION IF EXISTS "shopq"."orders_pop"

DROP FUNCTION IF EXISTS "shopq"."orders_pop_many"

DROP FUNCTION IF EXISTS "shopq"."orders_release"

DROP FUNCTION IF EXISTS "shopq"."orders_ack"

DROP FUNCTION IF EXISTS "shopq"."orders_ack_many"

DROP FUNCTION IF EXISTS "shopq"."orders_nack"

DROP FUNCTION IF EXISTS "shopq"."orders_repair"

DROP FUNCTION IF EXISTS "shopq"."orders_void_holes"

DROP FUNCTION IF EXISTS "shopq"."orders_stats"

DROP FUNCTION IF EXISTS "shopq"."orders_defer"

DROP FUNCTION IF EXISTS "shopq"."orders_extend"

DROP FUNCTION IF EXISTS "shopq"."orders_redrive"

DROP FUNCTION IF EXISTS "shopq"."orders_purge_dead"

DROP FUNCTION IF EXISTS "shopq"."orders_scavenge"

DROP FUNCTION IF EXISTS "shopq"."orders_oldest_age"

DROP FUNCTION IF EXISTS "shopq"."orders_check_headers"

DROP FUNCTION IF EXISTS "shopq"."orders_split_headers"

DROP FUNCTION IF EXISTS "shopq"."orders_split_bodies"

DROP FUNCTION IF EXISTS "shopq"."orders_headers_of_dead"

DROP FUNCTION IF EXISTS "shopq"."orders_body_of"

DROP FUNCTION IF EXISTS "shopq"."orders_describe"

DROP FUNCTION IF EXISTS "shopq"."orders_wait"

DROP FUNCTION IF EXISTS "shopq"."orders_peek"

DROP FUNCTION IF EXISTS "shopq"."orders_history"

DROP FUNCTION IF EXISTS "shopq"."orders_dead_letters"

DROP FUNCTION IF EXISTS "shopq"."orders_archived"

DROP FUNCTION IF EXISTS "shopq"."orders_read"

DROP FUNCTION IF EXISTS "shopq"."orders_send"

DROP FUNCTION IF EXISTS "shopq"."orders_send_batch"

DROP FUNCTION IF EXISTS "shopq"."orders_check_send"

DROP FUNCTION IF EXISTS "shopq"."orders_push_array"

DROP FUNCTION IF EXISTS "shopq"."orders_delete"

DROP FUNCTION IF EXISTS "shopq"."orders_archive"

DROP FUNCTION IF EXISTS "shopq"."orders_set_vt"

DROP FUNCTION IF EXISTS "shopq"."orders_expire_leases"

DROP FUNCTION IF EXISTS "shopq"."orders_purge"

DROP TABLE IF EXISTS "shopq"."orders_ring"

DROP TABLE IF EXISTS "shopq"."orders_spill"

DROP TABLE IF EXISTS "shopq"."orders_gap"

DROP TABLE IF EXISTS "shopq"."orders_staged"

DROP TABLE IF EXISTS "shopq"."orders_dead"

DROP TABLE IF EXISTS "shopq"."orders_waiters"

DROP TABLE IF EXISTS "shopq"."orders_archive"

DROP TABLE IF EXISTS "shopq"."orders_content"

DROP TABLE IF EXISTS "shopq"."orders_gens"

DROP SEQUENCE IF EXISTS "shopq"."orders_push_seq"

DROP SEQUENCE IF EXISTS "shopq"."orders_pop_seq"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_pushed"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_popped"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_acquired"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_expired"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_settled"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_dead"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_redriven"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_purged"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_archived"

DROP SEQUENCE IF EXISTS "shopq"."orders_n_scavenged"

DROP SEQUENCE IF EXISTS "shopq"."orders_swept"

DELETE FROM "shopq"."dbq_queues" WHERE queue = 'orders'

DELETE FROM "shopq"."dbq_stats_history" WHERE queue = 'orders'

DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM "shopq"."dbq_queues") THEN DROP TABLE "shopq"."dbq_queues"; DROP TABLE IF EXISTS "shopq"."dbq_stats_history"; BEGIN DROP SCHEMA IF EXISTS "shopq" RESTRICT; EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END; END IF; END $$

DO $$ DECLARE v_role text; BEGIN
  FOR v_role IN SELECT rolname FROM pg_roles WHERE rolname IN ('dbq_r_orders_16adecff_send', 'dbq_r_orders_16adecff_receive', 'dbq_r_orders_16adecff_peek', 'dbq_r_orders_16adecff_monitor', 'dbq_r_orders_16adecff_manage') LOOP
    IF to_regnamespace('shopq') IS NOT NULL THEN
      EXECUTE format('REVOKE ALL ON SCHEMA %I FROM %I', 'shopq', v_role);
    END IF;
    PERFORM dbq_access.drop_group(v_role);
  END LOOP;
  IF to_regnamespace('shopq') IS NULL AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dbq_o_shopq_7bf52350') THEN
    -- What the owner still holds elsewhere (a dead-letter keeper's table in another schema) goes
    -- first: the operator may, as a member of the role.
    EXECUTE format('DROP OWNED BY %I', 'dbq_o_shopq_7bf52350');
    PERFORM dbq_access.drop_owner('dbq_o_shopq_7bf52350');
  END IF;
END $$

-- calls

SELECT "shopq"."orders_push"(?, ?, ?)

SELECT "shopq"."orders_push_many"(?, ?, ?, ?)

SELECT "shopq"."orders_take"(?, ?)

SELECT "shopq"."orders_pop"(?)

SELECT "shopq"."orders_pop_many"(?, ?)

SELECT "shopq"."orders_release"(?)

SELECT "shopq"."orders_ack"(?, ?)

SELECT "shopq"."orders_ack_many"(?, ?)

SELECT "shopq"."orders_nack"(?, ?, ?, ?)

SELECT * FROM "shopq"."orders_repair"(?)

SELECT * FROM "shopq"."orders_void_holes"(?)

SELECT * FROM "shopq"."orders_stats"()

SELECT "shopq"."orders_defer"(?, ?, ?, ?, ?)

SELECT "shopq"."orders_extend"(?, ?, ?)

SELECT "shopq"."orders_redrive"(?, ?)

SELECT "shopq"."orders_purge_dead"(?, ?)

SELECT "shopq"."orders_scavenge"(?, ?)

-- client reads

SELECT w.msg_id, COALESCE(w.body, (SELECT c.body FROM "shopq"."orders_content" c WHERE c.bucket = w.msg_id % 8 AND c.msg_id = w.msg_id)), w.attempts, w.headers FROM (SELECT msg_id, body, attempts, headers FROM "shopq"."orders_ring" WHERE state = 1 AND (visible_at IS NULL OR visible_at <= now()) AND (expires_at IS NULL OR expires_at > now()) UNION ALL SELECT msg_id, body, attempts, headers FROM "shopq"."orders_spill" WHERE state = 1 AND (visible_at IS NULL OR visible_at <= now()) AND (expires_at IS NULL OR expires_at > now())) w ORDER BY w.msg_id LIMIT ?

SELECT dead_letter_queue FROM "shopq"."dbq_queues" WHERE queue = ?

SELECT msg_id, attempts, error, extract(epoch FROM pushed_at)::float8, extract(epoch FROM dead_at)::float8, body, source, headers FROM "shopq"."orders_dead" WHERE source = ? ORDER BY msg_id, source LIMIT ?

SELECT msg_id, attempts, error, extract(epoch FROM pushed_at)::float8, extract(epoch FROM dead_at)::float8, body, source, headers FROM "shopq"."orders_dead" ORDER BY msg_id, source LIMIT ?

SELECT * FROM "shopq"."dbq_queues" WHERE queue = ?

DELETE FROM "errors"."dlq_dead" WHERE source = 'shopq.orders'

SELECT msg_id, attempts, extract(epoch FROM pushed_at)::float8, extract(epoch FROM acked_at)::float8, body, headers FROM "shopq"."orders_archive" WHERE acked_at >= CAST(? AS timestamptz) ORDER BY acked_at, msg_id LIMIT ?

SELECT extract(epoch FROM at)::float8, depth, in_flight, pushed, popped, acquired, expired, oldest_age_s FROM "shopq"."dbq_stats_history" WHERE queue = ? AND at >= CAST(? AS timestamptz) AND at < CAST(? AS timestamptz) ORDER BY at

-- staging (dbq.spark)

INSERT INTO "shopq"."orders_staged" (stage, seq, first_seq, packed) VALUES (?, ?, ?, ?)

SELECT packed FROM "shopq"."orders_staged" WHERE stage = ? AND seq > ? AND first_seq <= ? ORDER BY seq

SELECT max(seq) FROM "shopq"."orders_staged" WHERE stage = ? AND seq > ?

DELETE FROM "shopq"."orders_staged" WHERE stage = ? AND seq <= ?

DELETE FROM "shopq"."orders_staged" WHERE stage = ? AND seq > ?

DELETE FROM "shopq"."orders_staged" WHERE stage = ?

-- observe

SELECT count(*) FROM pg_namespace WHERE nspname = ?

SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relname = ANY (string_to_array(?, ','))

SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ? AND p.proname = ANY (string_to_array(?, ','))

SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = ? AND nspowner IS DISTINCT FROM to_regrole(?)) + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ? AND p.proname = ANY (string_to_array(?, ',')) AND (p.proowner IS DISTINCT FROM n.nspowner OR p.proacl IS NULL OR has_function_privilege('public', p.oid, 'EXECUTE')))

SELECT (SELECT count(*) FROM "shopq"."orders_ring" WHERE state = 1) + (SELECT count(*) FROM "shopq"."orders_spill" WHERE state = 1), (SELECT count(*) FROM "shopq"."orders_ring" WHERE state = 2) + (SELECT count(*) FROM "shopq"."orders_spill" WHERE state = 2)

-- statistics history

INSERT INTO "shopq"."dbq_stats_history" (queue, at, depth, in_flight, pushed, popped, acquired, expired, oldest_age_s) VALUES ('orders', now(), ?, ?, ?, ?, ?, ?, ?)

DELETE FROM "shopq"."dbq_stats_history" WHERE queue = 'orders' AND at < now() - make_interval(secs => ?)

SELECT extract(epoch FROM now() - at)::float8, pushed, popped + acquired FROM "shopq"."dbq_stats_history" WHERE queue = 'orders' AND at >= now() - make_interval(secs => ?) ORDER BY at LIMIT 1

-- the schema's lock around provisioning and teardown

SELECT pg_advisory_xact_lock(hashtext(?))

-- online resize

SELECT slot_base, size FROM "shopq"."orders_gens" ORDER BY first_pos DESC

SELECT count(*) FROM "shopq"."orders_ring" WHERE slot IN (0, 999)

SELECT first_pos, slot_base, size, coalesce(pg_sequence_last_value('"shopq"."orders_pop_seq"'::regclass), 0) FROM "shopq"."orders_gens" ORDER BY first_pos

SELECT CASE WHEN (SELECT count(*) FROM "shopq"."orders_gens") > 1
  OR (SELECT min(slot) FROM "shopq"."orders_ring") < (SELECT min(slot_base) FROM "shopq"."orders_gens")
  OR (SELECT max(slot) FROM "shopq"."orders_ring") >= (SELECT max(slot_base + size) FROM "shopq"."orders_gens") THEN 1 ELSE 0 END

SELECT CASE WHEN pg_try_advisory_lock(hashtext(?)) THEN 1 ELSE 0 END

SELECT pg_advisory_unlock(hashtext(?))

INSERT INTO "shopq"."orders_ring" (slot, state, body) SELECT g, 0, decode(repeat('00', 300), 'hex') FROM generate_series(1000, 4999) g ON CONFLICT (slot) DO NOTHING

DO $switch$ BEGIN
  PERFORM set_config('lock_timeout', '100', true);
  PERFORM pg_advisory_xact_lock('"shopq"."orders_push_seq"'::regclass::oid::bigint | (2::bigint << 40));
  INSERT INTO "shopq"."orders_gens" (first_pos, slot_base, size) VALUES (coalesce(pg_sequence_last_value('"shopq"."orders_push_seq"'::regclass), 0) + 1, 1000, 4000)
  ON CONFLICT (first_pos) DO UPDATE SET slot_base = EXCLUDED.slot_base, size = EXCLUDED.size, started_at = now();
  UPDATE "shopq"."dbq_queues" SET ring_size = 4000, updated_at = now() WHERE queue = 'orders';
END $switch$

WITH held AS (
  SELECT slot FROM "shopq"."orders_ring" WHERE slot >= 0 AND slot < 1000 AND state <> 0 FOR UPDATE SKIP LOCKED),
moved AS (
  UPDATE "shopq"."orders_ring" r SET state = 0 FROM held WHERE r.slot = held.slot
  RETURNING r.msg_id, r.lease, r.attempts, r.pushed_at, r.visible_at, r.expires_at, r.body, r.headers)
INSERT INTO "shopq"."orders_spill" (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
SELECT m.msg_id, CASE WHEN m.lease > 0 THEN 2 ELSE 1 END, m.lease, m.attempts, m.pushed_at,
  CASE WHEN m.lease > 0 THEN m.visible_at ELSE clock_timestamp() END, m.expires_at, m.body, m.headers
FROM moved m

WITH gone AS (
  DELETE FROM "shopq"."orders_gens" WHERE first_pos = 1
    AND first_pos < (SELECT max(first_pos) FROM "shopq"."orders_gens")
    AND NOT EXISTS (SELECT 1 FROM "shopq"."orders_ring" WHERE slot >= 0 AND slot < 1000 AND state <> 0)
  RETURNING 1)
SELECT count(*) FROM gone

DELETE FROM "shopq"."orders_ring" WHERE slot >= 0 AND slot < 1000 AND state = 0
  AND NOT EXISTS (SELECT 1 FROM "shopq"."orders_gens" g WHERE slot >= g.slot_base AND slot < g.slot_base + g.size)

SELECT coalesce(min(slot), 0), coalesce(max(slot), -1) FROM "shopq"."orders_ring"

SELECT count(*) FROM "shopq"."orders_ring" WHERE slot >= 0 AND slot < 1000 AND state = 2

-- maintenance

SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = ? AND relname IN ('orders_ring', 'orders_spill', 'orders_gap', 'orders_staged', 'orders_dead', 'orders_waiters', 'orders_archive', 'orders_content', 'orders_gens')

SELECT i.relname, t.relname, pg_relation_size(i.oid) / 8192, GREATEST(t.reltuples, 0)::bigint, NULL FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = ? AND t.relname IN ('orders_ring', 'orders_spill', 'orders_gap', 'orders_staged', 'orders_dead', 'orders_waiters', 'orders_archive', 'orders_content', 'orders_gens')

SELECT 1

SELECT CASE WHEN pg_try_advisory_lock(hashtext(?)) THEN 1 ELSE 0 END

SELECT CASE WHEN pg_advisory_unlock(hashtext(?)) THEN 1 ELSE 0 END

VACUUM (ANALYZE) "shopq"."orders_ring_pkey"

REINDEX INDEX CONCURRENTLY "shopq"."orders_ring_pkey"
