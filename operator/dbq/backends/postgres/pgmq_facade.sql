-- PGMQ 1.13's API on dbq's ring queues: schema pgmq, with PGMQ's function names, overloads,
-- argument defaults and result types, each PGMQ queue name standing for one dbq Queue
-- (spec.pgmq.name). Installed by the operator once per database, when it provisions the first
-- Queue with spec.pgmq there, and again when dbq's facade version changes (pgmq.dbq_facade).
-- Statements are separated by `--;;` lines; every one is idempotent. {version} is the facade's
-- version, an integer; {owner} the NOLOGIN role owning the schema and all in it (a member of which
-- each operator login is, as for a queue schema), quoted, and {owner_literal} its name as a literal.
--
-- Every function is SECURITY INVOKER: it calls the queue's own routines (SECURITY DEFINER,
-- granted per right), so a login that may not receive from a queue cannot read it through
-- pgmq.read either. The operator grants EXECUTE here to the group roles of the queues it
-- maps; nothing to PUBLIC.
--
-- How PGMQ's message maps onto the ring: `message` (jsonb) is the body, as UTF-8 JSON text, with
-- the header content-type: application/json, which the answers take off again; `read_ct` is the
-- attempts; `enqueued_at` when it was sent; `vt` when it is visible again; `last_read_at` is not
-- kept: a read answers its own time, the other calls NULL. docs/developers/pgmq.md says what
-- differs and what is not supported.
-- A real PGMQ owns schema pgmq: the two never share a database. Nor is the facade installed in
-- a schema pgmq of anyone else's making: its owner could replace the functions other teams'
-- logins call.
DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'pgmq' AND c.relname = 'meta' AND c.relkind <> 'v') THEN  -- the facade's is a view
    RAISE EXCEPTION 'spec.pgmq: this database holds a real PGMQ (table pgmq.meta): dbq''s PGMQ API cannot share it'
      USING ERRCODE = '42710', HINT = 'put the Queue in another database, then move the messages over (docs: Coming from PGMQ)';
  END IF;
  IF EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq' AND nspowner::regrole::text <> {owner_literal}) THEN
    RAISE EXCEPTION 'spec.pgmq: schema pgmq exists and belongs to another role than dbq''s: dbq''s PGMQ API is not installed there'
      USING ERRCODE = '42710', HINT = 'a DBA drops or renames that schema pgmq, or the Queue goes to another database';
  END IF;
END $$
--;;
CREATE SCHEMA IF NOT EXISTS pgmq AUTHORIZATION {owner}
--;;
-- PGMQ's clients run CREATE EXTENSION IF NOT EXISTS pgmq when they start: where dbq's empty
-- stand-in is installed on the server (its comment starts with "dbq:"), it is created here (by
-- the operator's login, which may create in the database), so that statement finds it. Without
-- it, clients are told init_extension=False (docs).
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq')
      AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pgmq' AND comment LIKE 'dbq:%')
      AND has_database_privilege(current_database(), 'CREATE') THEN
    CREATE EXTENSION pgmq;
  END IF;
END $$
--;;
-- The rest is made as the owner role, so every object is its own (until the end of the
-- operator's transaction, which sets its role back).
SET LOCAL ROLE {owner}
--;;
REVOKE ALL ON SCHEMA pgmq FROM PUBLIC
--;;
CREATE TABLE IF NOT EXISTS pgmq.dbq_facade (
  id int PRIMARY KEY CHECK (id = 1),
  version int NOT NULL)
--;;
-- Never over a newer facade (another operator, upgraded, installed it): this one waits its turn.
DO $$ BEGIN
  IF (SELECT version FROM pgmq.dbq_facade WHERE id = 1) > {version} THEN
    RAISE EXCEPTION 'spec.pgmq: this database''s PGMQ facade is newer than this operator''s (version {version})'
      USING ERRCODE = '55000', HINT = 'upgrade the dbq operator that manages this Queue';
  END IF;
END $$
--;;
-- Which dbq queue each PGMQ queue name stands for (lower case, as PGMQ's table names are), and
-- the queue's group roles, granted the facade (again by an install of a newer facade).
CREATE TABLE IF NOT EXISTS pgmq.dbq_queues (
  queue_name varchar(47) PRIMARY KEY,
  schema_name varchar(63) NOT NULL,
  queue varchar(63) NOT NULL,
  roles text[] NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (schema_name, queue))
--;;
-- The topic bindings of spec.pgmq.topics, each a pattern and the PGMQ queue it routes to, with
-- the pattern as a regular expression: * one word, # any words, a dot a dot.
CREATE TABLE IF NOT EXISTS pgmq.dbq_topic_bindings (
  pattern text NOT NULL CHECK (pattern ~ '^[a-zA-Z0-9._*#-]{1,255}$'),
  queue_name varchar(47) NOT NULL REFERENCES pgmq.dbq_queues ON DELETE CASCADE,
  bound_at timestamptz NOT NULL DEFAULT now(),
  compiled_regex text GENERATED ALWAYS AS
    ('^' || replace(replace(replace(pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$') STORED,
  PRIMARY KEY (pattern, queue_name))
--;;
-- PGMQ's list of queues, which its Rust client reads to learn whether a queue exists.
CREATE OR REPLACE VIEW pgmq.meta AS
  SELECT q.queue_name::varchar AS queue_name, false AS is_partitioned, false AS is_unlogged, q.created_at
  FROM pgmq.dbq_queues q
--;;
REVOKE ALL ON ALL TABLES IN SCHEMA pgmq FROM PUBLIC
--;;
DO $$ BEGIN
  IF to_regtype('pgmq.message_record') IS NULL THEN
    CREATE TYPE pgmq.message_record AS (msg_id bigint, read_ct integer, enqueued_at timestamptz,
      last_read_at timestamptz, vt timestamptz, message jsonb, headers jsonb);
  END IF;
  IF to_regtype('pgmq.queue_record') IS NULL THEN
    CREATE TYPE pgmq.queue_record AS (queue_name varchar, is_partitioned boolean, is_unlogged boolean,
      created_at timestamptz);
  END IF;
  IF to_regtype('pgmq.metrics_result') IS NULL THEN
    CREATE TYPE pgmq.metrics_result AS (queue_name text, queue_length bigint, newest_msg_age_sec int,
      oldest_msg_age_sec int, total_messages bigint, scrape_time timestamptz, queue_visible_length bigint,
      default_partition_length bigint);
  END IF;
END $$
--;;
-- --- helpers --------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgmq._dbq_routine(queue_name text, verb text) RETURNS text
LANGUAGE plpgsql STABLE AS $fn$
DECLARE v_schema text; v_queue text;
BEGIN
  -- The queue's routine `verb`, qualified and quoted, for EXECUTE; an error naming the queue
  -- when no Queue stands for it.
  IF queue_name IS NULL OR queue_name ~ '\$|;|--|''' THEN
    RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';  -- PGMQ's message and code
  END IF;
  SELECT q.schema_name, q.queue INTO v_schema, v_queue FROM pgmq.dbq_queues q WHERE q.queue_name = lower($1);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'dbq: no queue "%" in this database''s PGMQ facade', lower($1) USING ERRCODE = '42P01',
      HINT = 'apply a dbq Queue with spec.pgmq.name: ' || lower($1) || ' (PGMQ''s create is not how queues are made here)';
  END IF;
  RETURN format('%I.%I', v_schema, v_queue || '_' || verb);
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_message(body bytea, headers jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$
  -- A body sent as JSON (through this facade) as it was sent; any other body (sent by another
  -- client of the queue) as a JSON string of its base64.
  SELECT CASE WHEN headers ->> 'content-type' = 'application/json' THEN convert_from(body, 'UTF8')::jsonb
    ELSE to_jsonb(encode(body, 'base64')) END
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_headers(headers jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$
  -- The headers a PGMQ client gave: the facade's content-type taken off (NULL when none is left).
  SELECT CASE WHEN headers ->> 'content-type' = 'application/json' THEN nullif(headers - 'content-type', '{}')
    ELSE headers END
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_refused_headers(headers jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  RAISE EXCEPTION 'dbq: headers must be a JSON object (or NULL), not a JSON %', jsonb_typeof(headers)
    USING ERRCODE = '22023';
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_sent_headers(headers jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$
  -- The headers stored: the client's (an object, or none) and the facade's content-type. SQL, so
  -- that it is inlined into the statement that sends a batch.
  SELECT CASE WHEN headers IS NULL OR jsonb_typeof(headers) = 'null' THEN '{"content-type": "application/json"}'::jsonb
    WHEN jsonb_typeof(headers) = 'object' THEN headers || '{"content-type": "application/json"}'::jsonb
    ELSE pgmq._dbq_refused_headers(headers) END
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_delay_ms(delay timestamptz) RETURNS bigint
LANGUAGE sql VOLATILE AS $fn$
  SELECT greatest(ceil(extract(epoch FROM delay - clock_timestamp()) * 1000), 0)::bigint
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_seconds(value integer, argument text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  -- PGMQ's seconds as the ring's milliseconds; NULL or negative is refused, naming the argument.
  IF value IS NULL OR value < 0 THEN
    RAISE EXCEPTION 'dbq: % must be 0 or more seconds, not %', argument, coalesce(value::text, 'NULL')
      USING ERRCODE = '22023';
  END IF;
  RETURN value * 1000::bigint;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_unsupported(what text, instead text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION 'dbq: % is not supported by dbq''s PGMQ facade', what USING ERRCODE = '0A000', HINT = instead;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_checked_batch(target text, msgs jsonb[], headers jsonb[]) RETURNS int
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE v_n int := coalesce(cardinality(msgs), 0);
BEGIN
  -- The number of messages in a batch for `target` (a queue, a routing key), or an error.
  IF v_n = 0 THEN
    RAISE EXCEPTION 'msgs cannot be NULL or empty';  -- PGMQ's message and code
  END IF;
  IF array_position(msgs, NULL) IS NOT NULL THEN
    RAISE EXCEPTION 'dbq: send_batch to %: every msg must be a JSON value, not NULL', target USING ERRCODE = '22004';
  END IF;
  IF headers IS NOT NULL AND coalesce(cardinality(headers), 0) <> v_n THEN
    RAISE EXCEPTION 'headers array length (%) must match msgs array length (%)', coalesce(cardinality(headers), 0), v_n;
  END IF;
  RETURN v_n;
END $fn$
--;;
-- --- sending ----------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $fn$
BEGIN
  IF msg IS NULL THEN
    RAISE EXCEPTION 'dbq: send to queue "%": msg must be a JSON value, not NULL', queue_name USING ERRCODE = '22004';
  END IF;
  RETURN QUERY EXECUTE format('SELECT %s($1, $2, $3)', pgmq._dbq_routine(queue_name, 'send'))
    USING convert_to(msg::text, 'UTF8'), pgmq._dbq_sent_headers(headers), pgmq._dbq_delay_ms(delay);
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay integer)
RETURNS SETOF bigint LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send(queue_name, msg, headers,
    clock_timestamp() + pgmq._dbq_seconds(delay, 'delay') * interval '1 millisecond')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send(queue_name, msg, NULL, clock_timestamp()) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send(queue_name, msg, headers, clock_timestamp()) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send(queue_name, msg, NULL, delay) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send(queue_name, msg, NULL, delay) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $fn$
DECLARE v_n int := pgmq._dbq_checked_batch(format('queue "%s"', queue_name), msgs, headers); v_ids bigint[];
BEGIN
  -- The ring refuses a batch it has no room for before writing any of it; should another sender
  -- take the room meanwhile, the batch is refused (and undone) all the same.
  EXECUTE format('SELECT array_agg(i ORDER BY o) FROM %s($1, $2, $3) WITH ORDINALITY s(i, o)',
    pgmq._dbq_routine(queue_name, 'send_batch'))
  INTO v_ids
  USING (SELECT array_agg(convert_to(m::text, 'UTF8') ORDER BY i) FROM unnest(msgs) WITH ORDINALITY u(m, i)),
    (SELECT array_agg(pgmq._dbq_sent_headers(CASE WHEN headers IS NOT NULL THEN headers[i] END) ORDER BY i)
     FROM generate_series(1, v_n) i),
    pgmq._dbq_delay_ms(delay);
  IF array_position(v_ids, NULL) IS NOT NULL THEN
    RAISE EXCEPTION 'dbq: queue "%" is full: none of % messages was sent', queue_name, v_n USING ERRCODE = '53400',
      HINT = 'consume faster, send later, or give the Queue a larger spec.ring.size';
  END IF;
  RETURN QUERY SELECT unnest(v_ids);
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send_batch(queue_name, msgs, headers,
    clock_timestamp() + pgmq._dbq_seconds(delay, 'delay') * interval '1 millisecond')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[]) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send_batch(queue_name, msgs, NULL, clock_timestamp()) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[]) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send_batch(queue_name, msgs, headers, clock_timestamp()) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay integer) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send_batch(queue_name, msgs, NULL, delay) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay timestamptz) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq.send_batch(queue_name, msgs, NULL, delay) $fn$
--;;
-- --- reading ----------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgmq._dbq_read(queue_name text, vt integer, qty integer, wait_ms bigint,
  conditional jsonb)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $fn$
DECLARE v_ms bigint := pgmq._dbq_seconds(vt, 'vt'); v_read text; v_rows pgmq.message_record[];
BEGIN
  IF conditional IS NOT NULL AND conditional <> '{}' THEN
    PERFORM pgmq._dbq_unsupported('a conditional read', 'read without conditional and test the message in the worker');
  END IF;
  IF qty IS NULL OR qty < 0 THEN
    RAISE EXCEPTION 'dbq: qty must be 0 or more, not %', coalesce(qty::text, 'NULL') USING ERRCODE = '22023';
  END IF;
  IF qty = 0 THEN RETURN; END IF;
  v_read := format('SELECT r.msg_id, r.attempts, r.enqueued_at, clock_timestamp(), r.visible_at,'
    ' pgmq._dbq_message(r.body, r.headers), pgmq._dbq_headers(r.headers) FROM %s($1, $2, $3) r ORDER BY r.msg_id',
    pgmq._dbq_routine(queue_name, 'read'));
  IF v_ms > 0 THEN  -- a lease of vt seconds
    RETURN QUERY EXECUTE v_read USING qty, v_ms, wait_ms;
    RETURN;
  END IF;
  -- vt 0: read (a lease, counted as a read) and made visible again at once, as PGMQ does
  EXECUTE format('SELECT array_agg(m::pgmq.message_record) FROM (%s) m', v_read) INTO v_rows USING qty, 1000, wait_ms;
  IF v_rows IS NOT NULL THEN
    EXECUTE format('SELECT count(*) FROM %s($1, 0)', pgmq._dbq_routine(queue_name, 'set_vt'))
    USING (SELECT array_agg(m.msg_id) FROM unnest(v_rows) m);
  END IF;
  RETURN QUERY SELECT m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.last_read_at, m.message, m.headers
    FROM unnest(v_rows) m;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$
  SELECT * FROM pgmq._dbq_read(queue_name, vt, qty, 0, conditional)
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_with_poll(queue_name text, vt integer, qty integer,
  max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$
  -- The ring waits inside read, woken every 50 ms: poll_interval_ms is not needed.
  SELECT * FROM pgmq._dbq_read(queue_name, vt, qty, pgmq._dbq_seconds(max_poll_seconds, 'max_poll_seconds'),
    conditional)
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $fn$
BEGIN
  IF qty IS NULL OR qty < 0 THEN
    RAISE EXCEPTION 'dbq: qty must be 0 or more, not %', coalesce(qty::text, 'NULL') USING ERRCODE = '22023';
  END IF;
  IF qty = 0 THEN RETURN; END IF;
  RETURN QUERY EXECUTE format('SELECT r.msg_id, r.attempts, r.enqueued_at, NULL::timestamptz,'
    ' coalesce(r.visible_at, r.enqueued_at), pgmq._dbq_message(r.body, r.headers), pgmq._dbq_headers(r.headers)'
    ' FROM %s($1, 0) r ORDER BY r.msg_id', pgmq._dbq_routine(queue_name, 'read'))
  USING qty;
END $fn$
--;;
-- --- by id ------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgmq._dbq_end(queue_name text, verb text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
BEGIN
  -- delete or archive by id: the ids of the messages it ended
  RETURN QUERY EXECUTE format('SELECT msg_id FROM %s($1)', pgmq._dbq_routine(queue_name, verb)) USING msg_ids;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_end(queue_name, 'delete', msg_ids) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE sql AS $fn$ SELECT EXISTS (SELECT 1 FROM pgmq._dbq_end(queue_name, 'delete', ARRAY[msg_id])) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_end(queue_name, 'archive', msg_ids) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE sql AS $fn$ SELECT EXISTS (SELECT 1 FROM pgmq._dbq_end(queue_name, 'archive', ARRAY[msg_id])) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt timestamptz)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $fn$
BEGIN
  IF vt IS NULL THEN
    RAISE EXCEPTION 'dbq: set_vt on queue "%": vt must be a time, not NULL', queue_name USING ERRCODE = '22004';
  END IF;
  RETURN QUERY EXECUTE format('SELECT r.msg_id, r.attempts, r.enqueued_at, NULL::timestamptz, r.visible_at,'
    ' pgmq._dbq_message(r.body, r.headers), pgmq._dbq_headers(r.headers) FROM %s($1, $2) r ORDER BY r.msg_id',
    pgmq._dbq_routine(queue_name, 'set_vt'))
  USING msg_ids, pgmq._dbq_delay_ms(vt);
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt integer)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.set_vt(queue_name, msg_ids,
    clock_timestamp() + pgmq._dbq_seconds(vt, 'vt') * interval '1 millisecond')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt timestamptz)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt)
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt integer)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt)
$fn$
--;;
-- --- the queue as a whole ----------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgmq.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE v_n bigint;
BEGIN
  EXECUTE format('SELECT %s()', pgmq._dbq_routine(queue_name, 'purge')) INTO v_n;
  RETURN v_n;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE plpgsql AS $fn$
DECLARE v pgmq.metrics_result;
BEGIN
  -- From the ring's totals (monitor's stats), at the same cost whatever the queue holds. An age
  -- is of the oldest ready message (the ring does not look for the newest): NULL when none is.
  EXECUTE format('SELECT $1, s.o_depth + s.o_in_flight + s.o_delayed,'
    ' CASE WHEN s.o_depth > 0 THEN 0 END, CASE WHEN s.o_depth > 0 THEN s.o_oldest_age_s::int END,'
    ' s.o_pushed, now(), s.o_depth, NULL::bigint FROM %s() s', pgmq._dbq_routine(queue_name, 'stats'))
  INTO v USING lower(queue_name);
  RETURN v;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE plpgsql AS $fn$
DECLARE v_name text;
BEGIN
  -- The queues whose statistics the caller may read (monitor), by name.
  FOR v_name IN SELECT q.queue_name FROM pgmq.dbq_queues q
    WHERE has_function_privilege(format('%I.%I()', q.schema_name, q.queue || '_stats'), 'EXECUTE')
    ORDER BY q.queue_name LOOP
    RETURN NEXT pgmq.metrics(v_name);
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.list_queues() RETURNS SETOF pgmq.queue_record
LANGUAGE sql STABLE AS $fn$
  SELECT * FROM pgmq.meta ORDER BY queue_name
$fn$
--;;
-- --- queues are Queues: made and dropped by applying and deleting the resource -------------
CREATE OR REPLACE FUNCTION pgmq.acquire_queue_lock(queue_name text) RETURNS void
LANGUAGE sql AS $fn$
  -- A transaction lock a client may hold around its own work on a queue (PGMQ's Rust client
  -- takes it to create one); dbq's routines never wait for it.
  SELECT pg_advisory_xact_lock(hashtext('pgmq.queue_' || queue_name))
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.validate_queue_name(queue_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
  IF length(queue_name) > 47 THEN
    RAISE EXCEPTION 'queue name is too long, maximum length is 47 characters';
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.format_table_name(queue_name text, prefix text) RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
  IF queue_name ~ '\$|;|--|''' THEN
    RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';  -- PGMQ's message and code
  END IF;
  RETURN lower(prefix || '_' || queue_name);
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.create(queue_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
  -- Succeeds for a queue a Queue already stands for (clients call create when they start), as
  -- PGMQ's does for one that exists; any other is refused, naming the resource to apply.
  PERFORM pgmq.validate_queue_name(queue_name);
  IF NOT EXISTS (SELECT 1 FROM pgmq.dbq_queues q WHERE q.queue_name = lower($1)) THEN
    PERFORM pgmq._dbq_unsupported(format('creating queue "%s" from SQL', lower($1)),
      format('apply a dbq Queue (backend postgres, design ring) with spec.pgmq.name: %s', lower($1)));
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.create_non_partitioned(queue_name text) RETURNS void
LANGUAGE sql AS $fn$ SELECT pgmq.create(queue_name) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.create_unlogged(queue_name text) RETURNS void
LANGUAGE sql AS $fn$ SELECT pgmq.create(queue_name) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.create_partitioned(queue_name text, partition_interval text DEFAULT '10000',
  retention_interval text DEFAULT '100000', premake integer DEFAULT 4) RETURNS void
LANGUAGE sql AS $fn$
  SELECT pgmq._dbq_unsupported('a partitioned queue (pg_partman)',
    'apply a dbq Queue with spec.pgmq.name: its ring needs no partitions, and spec.archive.retention bounds the archive')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pgmq._dbq_unsupported(format('dropping queue "%s" from SQL', lower($1)),
    'delete the dbq Queue that has this spec.pgmq.name (kubectl delete queue ...)');
  RETURN false;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name text, partitioned boolean) RETURNS boolean
LANGUAGE sql AS $fn$ SELECT pgmq.drop_queue(queue_name) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.detach_archive(queue_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE WARNING 'detach_archive(queue_name) is deprecated and is a no-op. It will be removed in PGMQ v2.0. Archive tables are no longer member objects.';
END $fn$
--;;
-- --- not supported: each a clear error naming what to do instead ----------------------------
CREATE OR REPLACE FUNCTION pgmq._dbq_unsupported_read(instead text) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pgmq._dbq_unsupported('a FIFO group read', instead);
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_grouped(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_unsupported_read('read; or give each group its own Queue') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_grouped_with_poll(queue_name text, vt integer, qty integer,
  max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_unsupported_read('read_with_poll; or give each group its own Queue') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_unsupported_read('read; or give each group its own Queue') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr_with_poll(queue_name text, vt integer, qty integer,
  max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_unsupported_read('read_with_poll; or give each group its own Queue') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_grouped_head(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_unsupported_read('read; or give each group its own Queue') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.read_grouped_head_with_poll(queue_name text, vt integer, qty integer,
  max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $fn$ SELECT * FROM pgmq._dbq_unsupported_read('read_with_poll; or give each group its own Queue') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.create_fifo_index(queue_name text) RETURNS void
LANGUAGE sql AS $fn$ SELECT pgmq._dbq_unsupported('a FIFO index', 'nothing: a ring keeps its own order') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.create_fifo_indexes_all() RETURNS void
LANGUAGE sql AS $fn$ SELECT pgmq._dbq_unsupported('a FIFO index', 'nothing: a ring keeps its own order') $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.convert_archive_partitioned(table_name text, partition_interval text DEFAULT '10000',
  retention_interval text DEFAULT '100000', leading_partition integer DEFAULT 10) RETURNS void
LANGUAGE sql AS $fn$
  SELECT pgmq._dbq_unsupported('a partitioned archive (pg_partman)', 'spec.archive.retention bounds the archive')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.enable_notify_insert(queue_name text, throttle_interval_ms integer DEFAULT 250)
RETURNS void LANGUAGE sql AS $fn$
  SELECT pgmq._dbq_unsupported('notify on insert', 'read_with_poll: the ring wakes a waiting read itself')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.disable_notify_insert(queue_name text) RETURNS void
LANGUAGE sql AS $fn$
  SELECT pgmq._dbq_unsupported('notify on insert', 'read_with_poll: the ring wakes a waiting read itself')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.update_notify_insert(queue_name text, throttle_interval_ms integer) RETURNS void
LANGUAGE sql AS $fn$
  SELECT pgmq._dbq_unsupported('notify on insert', 'read_with_poll: the ring wakes a waiting read itself')
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.list_notify_insert_throttles()
RETURNS TABLE (queue_name text, throttle_interval_ms integer, last_notified_at timestamptz)
LANGUAGE sql STABLE AS $fn$
  -- None: notify on insert is not supported here.
  SELECT NULL::text, NULL::integer, NULL::timestamptz WHERE false
$fn$
--;;
-- --- topics: PGMQ's routing keys and patterns; bindings declared on the Queue ---------------
CREATE OR REPLACE FUNCTION pgmq._dbq_topic_problem(value text, wildcards boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
  -- What is wrong with a routing key (wildcards false) or a binding pattern (true), NULL when
  -- nothing: dot-separated words of letters, digits, '-' and '_', at most 255 characters; a
  -- pattern's word may also be * (exactly one word) or # (any words), never two of them side by side.
  SELECT CASE
    WHEN value IS NULL OR value = '' THEN 'it is empty'
    WHEN length(value) > 255 THEN format('it has %s characters, more than 255', length(value))
    WHEN NOT wildcards AND value !~ '^[a-zA-Z0-9._-]+$' THEN 'only letters, digits, ''.'', ''-'' and ''_'' may be used'
    WHEN wildcards AND value !~ '^[a-zA-Z0-9._*#-]+$' THEN 'only letters, digits, ''.'', ''-'', ''_'', ''*'' and ''#'' may be used'
    WHEN value ~ '^\.|\.$' THEN 'it starts or ends with a dot'
    WHEN value ~ '\.\.' THEN 'it has an empty word (two dots side by side)'
    WHEN value ~ '[*#][*#]' THEN 'two wildcards side by side: separate them with a dot (# alone matches any words)'
  END
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_topic_checked(value text, wildcards boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE v_problem text := pgmq._dbq_topic_problem(value, wildcards);
BEGIN
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'dbq: % "%" is refused: %', CASE WHEN wildcards THEN 'topic pattern' ELSE 'routing key' END,
      value, v_problem;
  END IF;
  RETURN true;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.validate_routing_key(routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $fn$ SELECT pgmq._dbq_topic_checked(routing_key, false) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.validate_topic_pattern(pattern text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $fn$ SELECT pgmq._dbq_topic_checked(pattern, true) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.bind_topic(pattern text, queue_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
  -- Bindings are declared on the Queue (spec.pgmq.topics) and made by the operator: binding one
  -- declared succeeds, as PGMQ's does for one that exists (clients bind when they start); any
  -- other is refused, naming the field.
  PERFORM pgmq.validate_topic_pattern(bind_topic.pattern);
  IF NOT EXISTS (SELECT 1 FROM pgmq.dbq_queues q WHERE q.queue_name = bind_topic.queue_name) THEN
    RAISE EXCEPTION 'dbq: no queue "%" in this database''s PGMQ facade to bind to', bind_topic.queue_name
      USING HINT = 'apply a dbq Queue with spec.pgmq.name: ' || coalesce(bind_topic.queue_name, '');
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pgmq.dbq_topic_bindings b
      WHERE b.pattern = bind_topic.pattern AND b.queue_name = bind_topic.queue_name) THEN
    PERFORM pgmq._dbq_unsupported(format('binding pattern "%s" to queue "%s" from SQL', bind_topic.pattern,
      bind_topic.queue_name), format('add "%s" to spec.pgmq.topics of the Queue with spec.pgmq.name: %s',
      bind_topic.pattern, bind_topic.queue_name));
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.unbind_topic(pattern text, queue_name text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
  -- false for a binding there is not, as PGMQ answers; one declared on a Queue is refused.
  IF coalesce(unbind_topic.pattern, '') = '' OR coalesce(unbind_topic.queue_name, '') = '' THEN
    RAISE EXCEPTION 'dbq: unbind_topic needs a pattern and a queue_name, not an empty one';
  END IF;
  IF EXISTS (SELECT 1 FROM pgmq.dbq_topic_bindings b
      WHERE b.pattern = unbind_topic.pattern AND b.queue_name = unbind_topic.queue_name) THEN
    PERFORM pgmq._dbq_unsupported(format('unbinding pattern "%s" from queue "%s" from SQL', unbind_topic.pattern,
      unbind_topic.queue_name), format('remove "%s" from spec.pgmq.topics of the Queue with spec.pgmq.name: %s',
      unbind_topic.pattern, unbind_topic.queue_name));
  END IF;
  RETURN false;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $fn$
  SELECT b.pattern, b.queue_name::text, b.bound_at, b.compiled_regex FROM pgmq.dbq_topic_bindings b
  ORDER BY b.bound_at DESC, b.pattern, b.queue_name
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $fn$
  SELECT b.pattern, b.queue_name::text, b.bound_at, b.compiled_regex FROM pgmq.dbq_topic_bindings b
  WHERE b.queue_name = $1 ORDER BY b.bound_at DESC, b.pattern
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.test_routing(routing_key text)
RETURNS TABLE (pattern text, queue_name text, compiled_regex text) LANGUAGE plpgsql STABLE AS $fn$
BEGIN
  PERFORM pgmq.validate_routing_key(test_routing.routing_key);
  RETURN QUERY SELECT b.pattern, b.queue_name::text, b.compiled_regex FROM pgmq.dbq_topic_bindings b
    WHERE test_routing.routing_key ~ b.compiled_regex ORDER BY b.pattern, b.queue_name;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq._dbq_routed(routing_key text) RETURNS SETOF text
LANGUAGE sql STABLE AS $fn$
  -- The queues a routing key reaches, each once, in name order.
  SELECT DISTINCT b.queue_name::text FROM pgmq.dbq_topic_bindings b WHERE $1 ~ b.compiled_regex ORDER BY 1
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE v_queue text; v_count integer := 0;
BEGIN
  -- Sent to every queue the key reaches, in this transaction, through each queue's own send: a
  -- login needs the send right on every one of them.
  PERFORM pgmq.validate_routing_key(routing_key);
  IF msg IS NULL OR delay IS NULL OR delay < 0 THEN
    RAISE EXCEPTION 'dbq: send_topic "%": msg must be a JSON value and delay 0 or more seconds', routing_key;
  END IF;
  FOR v_queue IN SELECT * FROM pgmq._dbq_routed(routing_key) LOOP
    PERFORM pgmq.send(v_queue, msg, headers, delay);
    v_count := v_count + 1;
  END LOOP;
  RETURN v_count;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb) RETURNS integer
LANGUAGE sql AS $fn$ SELECT pgmq.send_topic(routing_key, msg, NULL, 0) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer) RETURNS integer
LANGUAGE sql AS $fn$ SELECT pgmq.send_topic(routing_key, msg, NULL, delay) $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE plpgsql AS $fn$
DECLARE v_queue text;
BEGIN
  PERFORM pgmq.validate_routing_key(routing_key);
  PERFORM pgmq._dbq_checked_batch(format('routing key "%s"', routing_key), msgs, headers);
  FOR v_queue IN SELECT * FROM pgmq._dbq_routed(routing_key) LOOP
    RETURN QUERY SELECT v_queue, s.id FROM pgmq.send_batch(v_queue, msgs, headers, delay) s(id);
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp())
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp() + make_interval(secs => delay))
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, delay)
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp())
$fn$
--;;
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $fn$
  SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp() + make_interval(secs => delay))
$fn$
--;;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq FROM PUBLIC
--;;
-- Every mapped queue's roles get what this version has (a newer facade may add functions).
DO $$ DECLARE v_role text; BEGIN
  FOR v_role IN SELECT DISTINCT r.rolname FROM pgmq.dbq_queues q, unnest(q.roles) g(name)
      JOIN pg_roles r ON r.rolname = g.name LOOP
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgmq TO %I', v_role);
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA pgmq TO %I', v_role);
  END LOOP;
END $$
--;;
INSERT INTO pgmq.dbq_facade (id, version) VALUES (1, {version})
ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version
