-- The ring's routines on PostgreSQL, one CREATE OR REPLACE per routine, separated by `--;;` lines.
--
-- Rendered by `dbq.backends.ring_sql.render_template`: each {name} is replaced by a quoted,
-- validated identifier or an integer; nothing else in this file is touched. Placeholders:
-- {ring} {spill} {gap} {dead} (this queue's or spec.deadLetter.queue's; rows of this queue have
-- source = {dead_source}) {push_seq} {pop_seq} {n_pushed} {n_popped} {n_acquired} {n_expired}
-- {n_settled} {n_dead} {n_redriven} {n_purged} (tables and sequences), {max_attempts} (0: no dead letters),
-- {waiters} (until when consumers wait), {archive} (acked and popped messages kept; {n_archived}
-- {n_scavenged} count them in and out), {channel} (the channel pushes notify then, a literal), {fn_<verb>} (routines), {max_bytes} {header_bytes} {spill_share}, {queue}
-- (the queue's name, in messages), {content} {buckets} {max_body_bytes} (bodies past a slot),
-- {last_pushed} {last_popped} (the last position each sequence drew, 0 before the first),
-- {record} and {row_record} (expressions that pack one record
-- of the answer format, `dbq.contract.ring.RECORD`). Arrays travel as text ('{1,2,3}'), which
-- every ODBC driver binds.
--
-- Generations (version 24 on): the ring may be resized online. {gens} has a row per ring alive:
-- the first position it holds, its first slot (slot_base) and its size; its slots are rows
-- slot_base .. slot_base + size - 1 of {ring}. Position p lives in the generation with the
-- largest first_pos <= p, at slot slot_base + p % size: {slot_of:P} is that lookup for the
-- expression P, made in each statement, so a statement sees a switch that committed before it
-- began. {newest} is the newest generation (the one pushes fill) as a one-row subquery,
-- {room_in:G} the free slots of generation row G, {room} those of the newest. {fence} is the
-- shared side of the lock a switch takes exclusively: every push takes it before it draws a
-- position, so no position is drawn between the moment a switch reads the boundary and its
-- commit, and a push's positions are all in the newest generation its next statement reads
-- (`dbq.backends.ring_resize`). {slot_near:P} is the same slot computed from the newest
-- generation a routine read into v_first, v_base and v_size, looked up only for an older position.
--
-- Lines between `-- if archive` and `-- end if` (or `-- else`) are kept only for a queue with
-- spec.archive enabled: a queue without it runs exactly the statements it ran before archives.
--
-- Headers travel as JSON text (NULL for none): one object per message, or for push_many and
-- defer a JSON array of one object (or null) per body, NULL when no body has any (the default:
-- callers of earlier versions need not pass it). The client checks names and values; these
-- routines check the size and that each is an object.
--
-- A body larger than {max_bytes} bytes (ring.messageBytes; at most {max_body_bytes},
-- spec.messages.maxBytes) waits in {content}, keyed by (msg_id % {buckets}, msg_id), written in
-- the push's transaction; the slot's body (and its spill row's, should it move there) is NULL,
-- the slot's id points to it. Whatever ends the message (pop, ack, expiry, dead-lettering, a
-- move to the archive) removes it in the same transaction; a dead letter and an archived
-- message hold their body in their own row. A body of at most {max_bytes} bytes never touches
-- {content}: its path runs no added statement.
--
-- {plan_once} (plan_cache_mode = force_generic_plan) marks the routines of a message's path
-- (push, take, ack and the rest a client calls for each message or batch): their statements are
-- planned once per session. PostgreSQL would otherwise plan some again at every call: a plan for
-- the call's own values (generate_series(1, n) of the call's n, say) always looks cheaper than
-- the generic plan, and planning took 12-25 % of a call's time (pgbench, one session).
-- Maintenance and reading routines keep plans for the values of each call.
--
-- take/pop/pop_many answer with packed records. Status codes: 0 message; 1 queue empty;
-- 2 position `id` was drawn but its message is not written yet (call take(id) until it arrives,
-- or release it); 3 position gone (draw again). In a ring row, state 1 always has lease 0 and
-- state 2 a lease > 0.
--;;
CREATE OR REPLACE FUNCTION {fn_check_headers}(p_size int, p_type text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  -- Refuses a message's headers that are larger than {header_bytes} bytes of JSON, or not an
  -- object (their size and JSON type, as the caller found them).
  IF p_size > {header_bytes} THEN
    RAISE EXCEPTION 'dbq: headers of % bytes are larger than spec.messages.headerBytes ({header_bytes}) of queue {queue}',
      p_size USING ERRCODE = '22001';
  END IF;
  IF p_type <> 'object' THEN
    RAISE EXCEPTION 'dbq: headers must be a JSON object of names to values, not a JSON %', p_type
      USING ERRCODE = '22023';
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_split_headers}(p_headers text) RETURNS text[]
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
  WHERE t = 'null' OR (octet_length(e::text) <= {header_bytes} AND t = 'object')
    OR {fn_check_headers}(octet_length(e::text), t) IS NULL;
  RETURN coalesce(v_out, '{}');
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_split_bodies}(p_bodies bytea, p_lengths text, p_verb text) RETURNS bytea[]
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
--;;
CREATE OR REPLACE FUNCTION {fn_headers_of_dead}(p_headers text, p_error text, p_attempts int) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
  -- A dead letter's headers: the message's, with why it died (when known) and after how many
  -- attempts.
  SELECT (coalesce(p_headers::jsonb, '{}') - 'dbq-error' || jsonb_strip_nulls(jsonb_build_object('dbq-error', p_error))
    || jsonb_build_object('dbq-attempts', p_attempts))::text
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_body_of}(p_id bigint, p_remove boolean) RETURNS bytea
LANGUAGE plpgsql AS $fn$
DECLARE v_body bytea;
BEGIN
  -- The body of message p_id kept in {content} (its slot or spill row holds NULL), removed with
  -- p_remove: the message ends in the caller's transaction.
  IF p_remove THEN
    DELETE FROM {content} WHERE bucket = p_id % {buckets} AND msg_id = p_id RETURNING body INTO v_body;
  ELSE
    SELECT body INTO v_body FROM {content} WHERE bucket = p_id % {buckets} AND msg_id = p_id;
  END IF;
  IF v_body IS NULL THEN
    RAISE EXCEPTION 'dbq: message % of queue {queue} has no body in its content table', p_id
      USING ERRCODE = 'XX001';
  END IF;
  RETURN v_body;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_place}(p_id bigint, p_body bytea, p_ttl_ms bigint, p_now timestamptz,
  p_headers text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE v_popped bigint; v_try int := 0;
BEGIN
  LOOP
    UPDATE {ring} SET msg_id = p_id, state = 1, lease = 0, attempts = 0, pushed_at = p_now,
      visible_at = NULL, body = p_body, headers = p_headers,
      expires_at = CASE WHEN p_ttl_ms > 0 THEN p_now + p_ttl_ms * interval '1 millisecond' END
    WHERE slot = {slot_of:p_id} AND state = 0;
    IF FOUND THEN RETURN true; END IF;
    -- The slot still holds an earlier lap's message. A leased one moves to the spill table (its
    -- ack finds it there). A ready one whose position a popper drew but has not claimed after a
    -- few tries is an orphan and moves there too. Otherwise its popper is about to take it. A
    -- slot a popper's transaction holds is skipped (SKIP LOCKED), never waited for: that popper
    -- may itself be waiting for a position this push has drawn, and neither would move.
    v_popped := {last_popped};
    WITH held AS (
      SELECT slot FROM {ring}
      WHERE slot = {slot_of:p_id} AND (state = 2 OR (state = 1 AND v_try >= 4 AND msg_id <= v_popped))
      FOR UPDATE SKIP LOCKED),
    moved AS (
      UPDATE {ring} r SET state = 0 FROM held WHERE r.slot = held.slot
      RETURNING r.msg_id, r.lease, r.attempts, r.pushed_at, r.visible_at, r.expires_at, r.body, r.headers)
    INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    SELECT m.msg_id, CASE WHEN m.lease > 0 THEN 2 ELSE 1 END, m.lease, m.attempts, m.pushed_at,
      CASE WHEN m.lease > 0 THEN m.visible_at ELSE clock_timestamp() END, m.expires_at, m.body, m.headers
    FROM moved m;
    v_try := v_try + 1;
    IF v_try > 20 THEN
      -- The ring is full after all (pushers raced past the check), or a popper kept the slot:
      -- give the position up as void, so its popper skips it; the caller tries again.
      INSERT INTO {gap} (pos, reason) VALUES (p_id, 'void') ON CONFLICT (pos) DO NOTHING;
      RETURN false;
    END IF;
    -- Briefly at first (a popper claims its slot within microseconds), then up to 5 ms a try:
    -- about 75 ms in all before the position is given up.
    PERFORM pg_sleep(least(0.0005 * 2 ^ greatest(v_try - 4, 0), 0.005));
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_push}(p_body bytea, p_ttl_ms bigint, p_headers text DEFAULT NULL, OUT o_id bigint)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_used bigint; v_now timestamptz := clock_timestamp(); v_slot bytea := p_body; v_wake boolean;
  v_fenced boolean; v_base bigint; v_size bigint;
BEGIN
  IF octet_length(p_body) > {max_bytes} THEN
    IF octet_length(p_body) > {max_body_bytes} THEN
      RAISE EXCEPTION 'dbq: message of % bytes is larger than spec.messages.maxBytes ({max_body_bytes}) of queue {queue}',
        octet_length(p_body) USING ERRCODE = '22001';
    END IF;
    v_slot := NULL;  -- past a slot: the body waits in {content}
  END IF;
  IF p_headers IS NOT NULL AND (octet_length(p_headers) > {header_bytes} OR json_typeof(p_headers::json) <> 'object') THEN
    PERFORM {fn_check_headers}(octet_length(p_headers), json_typeof(p_headers::json));
  END IF;
  -- The fence first, alone (an expression, no query): a resize's switch waits for this push to
  -- commit, and this push for the switch, so the next statement sees any switch that committed.
  v_fenced := {fence};
  -- Draw a position only if the newest generation has room; the same statement reads it (the
  -- position drawn is in it: no switch commits before this push), both positions, draws, and
  -- sees whether consumers wait (one query fewer: a push costs its statements).
  SELECT nextval('{push_seq}'), EXISTS (SELECT 1 FROM {waiters} WHERE until > v_now), gen.slot_base, gen.size
    INTO o_id, v_wake, v_base, v_size
  FROM {newest} gen WHERE {room_in:gen} > 0;
  IF NOT FOUND THEN
    o_id := -1;  -- full: nothing drawn, so nothing to repair
    RETURN;
  END IF;
  -- Consumers wait on the queue: wake them (sent at commit). While none waits, nothing is sent.
  IF v_wake THEN PERFORM pg_notify({channel}, ''); END IF;
  -- The fast path inline (RETURNING counts the push); place() handles a slot an earlier lap
  -- still holds.
  UPDATE {ring} SET msg_id = o_id, state = 1, lease = 0, attempts = 0, pushed_at = v_now,
    visible_at = NULL, body = v_slot, headers = p_headers,
    expires_at = CASE WHEN p_ttl_ms > 0 THEN v_now + p_ttl_ms * interval '1 millisecond' END
  WHERE slot = v_base + o_id % v_size AND state = 0
  RETURNING nextval('{n_pushed}') INTO v_used;
  IF NOT FOUND THEN
    IF NOT {fn_place}(o_id, v_slot, p_ttl_ms, v_now, p_headers) THEN
      o_id := -1;
      RETURN;
    END IF;
    PERFORM nextval('{n_pushed}');
  END IF;
  IF v_slot IS NULL THEN
    INSERT INTO {content} (bucket, msg_id, body) VALUES (o_id % {buckets}, o_id, p_body);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_push_many}(p_bodies bytea, p_lengths text, p_ttl_ms bigint,
  p_headers text DEFAULT NULL, OUT o_ids text)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
BEGIN
  o_ids := array_to_string(
    {fn_push_array}({fn_split_bodies}(p_bodies, p_lengths, 'push_many'), {fn_split_headers}(p_headers), p_ttl_ms), ',');
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_push_array}(p_bodies bytea[], p_headers text[], p_ttl_ms bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
  v_slots bytea[]; v_n int := cardinality(p_bodies); v_k int; v_ids bigint[]; v_placed bigint[]; v_out bigint[] := '{}';
  v_room bigint; v_now timestamptz := clock_timestamp(); v_big int; v_i int; v_wake boolean; v_fenced boolean;
  v_base bigint; v_size bigint;
BEGIN
  -- push_many's and send_batch's bodies and headers (checked), in order: their ids, -1 for each
  -- the ring did not take.
  SELECT max(octet_length(b)) INTO v_big FROM unnest(p_bodies) b;
  IF v_big > {max_body_bytes} THEN
    RAISE EXCEPTION 'dbq: message of % bytes is larger than spec.messages.maxBytes ({max_body_bytes}) of queue {queue}',
      v_big USING ERRCODE = '22001';
  END IF;
  v_slots := p_bodies;
  IF v_big > {max_bytes} THEN  -- bodies past a slot wait in {content}: their slots get NULL
    SELECT array_agg(CASE WHEN octet_length(b) > {max_bytes} THEN NULL ELSE b END ORDER BY i) INTO v_slots
    FROM unnest(p_bodies) WITH ORDINALITY AS x(b, i);
  END IF;
  IF p_headers IS NOT NULL AND cardinality(p_headers) <> v_n THEN
    RAISE EXCEPTION 'dbq: push_many got headers for % messages and % bodies', cardinality(p_headers), v_n
      USING ERRCODE = '22023';
  END IF;
  v_fenced := {fence};  -- before the room is read: a resize's switch waits for this batch, and it for the switch
  SELECT {room_in:gen}, EXISTS (SELECT 1 FROM {waiters} WHERE until > v_now), gen.slot_base, gen.size
    INTO v_room, v_wake, v_base, v_size
  FROM {newest} gen;
  v_k := least(v_n, greatest(v_room, 0));
  IF v_k > 0 AND v_wake THEN
    PERFORM pg_notify({channel}, '');  -- consumers wait: wake them
  END IF;
  IF v_k > 0 THEN
    -- Reserve k positions in one statement, then fill their slots in one set-based update.
    SELECT array_agg(nextval('{push_seq}') ORDER BY g) INTO v_ids FROM generate_series(1, v_k) g;
    WITH placed AS (
      UPDATE {ring} r SET msg_id = u.id, state = 1, lease = 0, attempts = 0, pushed_at = v_now,
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
         OR {fn_place}(v_ids[v_i], v_slots[v_i], p_ttl_ms, v_now, p_headers[v_i]) THEN
        v_out := v_out || v_ids[v_i];
      ELSE
        v_out := v_out || -1::bigint;
      END IF;
    END LOOP; END IF;
    PERFORM nextval('{n_pushed}') FROM unnest(v_out) i WHERE i > 0;
    IF v_big > {max_bytes} THEN
      INSERT INTO {content} (bucket, msg_id, body)
      SELECT u.id % {buckets}, u.id, u.body FROM unnest(v_out, p_bodies[1:v_k]) AS u(id, body)
      WHERE u.id > 0 AND octet_length(u.body) > {max_bytes};
    END IF;
  END IF;
  FOR v_i IN (v_k + 1)..v_n LOOP
    v_out := v_out || -1::bigint;
  END LOOP;
  RETURN v_out;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_take}(p_pos bigint, p_lease_ms bigint, p_count boolean DEFAULT true)
RETURNS bytea
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
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
      UPDATE {ring} SET state = 0 WHERE slot = {slot_of:p_pos} AND msg_id = p_pos AND state = 1
        AND (expires_at IS NULL OR expires_at > v_now)
      RETURNING body, attempts, headers INTO o_body, o_attempts, o_headers;
      IF FOUND THEN
        IF o_body IS NULL THEN o_body := {fn_body_of}(p_pos, true); END IF;
        IF p_count THEN PERFORM nextval('{n_popped}'); END IF;
        -- if archive
        INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
        SELECT msg_id, attempts, pushed_at, clock_timestamp(), o_body, headers FROM {ring} WHERE slot = {slot_of:p_pos};
        IF p_count THEN PERFORM nextval('{n_archived}'); END IF;
        -- end if
        o_status := 0; RETURN {record};
      END IF;
    ELSE
      o_lease := (random() * 9007199254740991)::bigint + 1;
      UPDATE {ring} SET state = 2, lease = o_lease, attempts = attempts + 1,
        visible_at = v_now + p_lease_ms * interval '1 millisecond'
      WHERE slot = {slot_of:p_pos} AND msg_id = p_pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
      RETURNING body, attempts, headers INTO o_body, o_attempts, o_headers;
      IF FOUND THEN
        IF o_body IS NULL THEN o_body := {fn_body_of}(p_pos, false); END IF;
        IF p_count THEN PERFORM nextval('{n_acquired}'); END IF;
        o_status := 0; RETURN {record};
      END IF;
      o_lease := NULL;
    END IF;
    -- Not taken: find out whether it is still to come or will never come.
    SELECT msg_id, state, expires_at INTO v_msg, v_state, v_exp FROM {ring} WHERE slot = {slot_of:p_pos};
    IF v_msg = p_pos AND v_state = 1 THEN
      IF v_exp IS NULL OR v_exp > v_now THEN
        CONTINUE;  -- written after the update looked: take it now
      END IF;
      UPDATE {ring} SET state = 0 WHERE slot = {slot_of:p_pos} AND msg_id = p_pos AND state = 1
      RETURNING body IS NULL INTO v_big;
      IF FOUND THEN  -- expired (TTL): dropped
        PERFORM nextval('{n_expired}');
        IF v_big THEN DELETE FROM {content} WHERE bucket = p_pos % {buckets} AND msg_id = p_pos; END IF;
      END IF;
      o_status := 3; RETURN {record};
    END IF;
    IF v_msg >= p_pos THEN  -- taken by repair, or the ring has lapped a void position
      DELETE FROM {gap} WHERE pos = p_pos;
      o_status := 3; RETURN {record};
    END IF;
    DELETE FROM {gap} WHERE pos = p_pos AND reason = 'void';
    IF FOUND THEN o_status := 3; RETURN {record}; END IF;
    EXIT WHEN v_round = 12 OR p_pos > {last_pushed};
    IF v_round > 2 THEN PERFORM pg_sleep(0.0002); END IF;
  END LOOP;
  o_body := NULL; o_attempts := NULL; o_headers := NULL;
  RETURN {record};  -- status 2: not written yet
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_pop}(p_lease_ms bigint, p_count boolean DEFAULT true) RETURNS bytea
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_exp timestamptz; v_ahead bigint; v_pos bigint; v_i int := 0; v_now timestamptz := clock_timestamp();
  v_rec bytea; o_status int := 1; o_id bigint; o_body bytea; o_lease bigint; o_attempts int; o_headers text;
  -- Redeliveries (nacked messages, expired leases, rescued orphans) wait in the spill table.
  -- One pop in {spill_share} looks there first while the ring has messages, and every pop when
  -- it has none: looking costs a statement most pops can skip, and none waits for ever.
  v_look boolean := random() * {spill_share} < 1;
BEGIN
  <<attempt>>
  LOOP
    -- 1. Redeliveries.
    WHILE v_look LOOP
      SELECT msg_id, body, attempts, expires_at, headers INTO o_id, o_body, o_attempts, v_exp, o_headers
      FROM {spill} WHERE state = 1 AND visible_at <= clock_timestamp()
      ORDER BY visible_at LIMIT 1 FOR UPDATE SKIP LOCKED;
      EXIT WHEN NOT FOUND;
      IF v_exp IS NOT NULL AND v_exp <= clock_timestamp() THEN  -- expired while waiting
        DELETE FROM {spill} WHERE msg_id = o_id;
        IF o_body IS NULL THEN DELETE FROM {content} WHERE bucket = o_id % {buckets} AND msg_id = o_id; END IF;
        PERFORM nextval('{n_expired}');
        CONTINUE;
      END IF;
      IF o_body IS NULL THEN o_body := {fn_body_of}(o_id, p_lease_ms <= 0); END IF;
      IF p_lease_ms <= 0 THEN
        -- if archive
        INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
        SELECT msg_id, attempts, pushed_at, clock_timestamp(), o_body, headers FROM {spill} WHERE msg_id = o_id;
        IF p_count THEN PERFORM nextval('{n_archived}'); END IF;
        -- end if
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
    o_id := NULL; o_body := NULL; o_attempts := NULL; o_headers := NULL;
    -- 2. The ring, in push order.
    LOOP
      -- Draw a position only if a push is ahead of the pops (one statement reads both and draws).
      SELECT nextval('{pop_seq}') INTO v_pos WHERE {last_pushed} > {last_popped};
      IF NOT FOUND THEN
        IF NOT v_look THEN v_look := true; CONTINUE attempt; END IF;
        -- Nothing new. A position whose popper gave up may have received its message since.
        SELECT g.pos INTO v_pos FROM {gap} g JOIN {ring} r ON r.slot = {slot_of:g.pos} AND r.msg_id = g.pos
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
        UPDATE {ring} SET state = 0 WHERE slot = {slot_of:v_pos} AND msg_id = v_pos AND state = 1
          AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, attempts, headers, CASE WHEN p_count THEN nextval('{n_popped}') END
          INTO o_id, o_body, o_attempts, o_headers, v_ahead;
        IF FOUND THEN
          IF o_body IS NULL THEN o_body := {fn_body_of}(o_id, true); END IF;
          -- if archive
          INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
          SELECT msg_id, attempts, pushed_at, clock_timestamp(), o_body, headers FROM {ring} WHERE slot = {slot_of:v_pos};
          IF p_count THEN PERFORM nextval('{n_archived}'); END IF;
          -- end if
          o_status := 0; RETURN {record};
        END IF;
      ELSE
        o_lease := (random() * 9007199254740991)::bigint + 1;
        UPDATE {ring} SET state = 2, lease = o_lease, attempts = attempts + 1,
          visible_at = v_now + p_lease_ms * interval '1 millisecond'
        WHERE slot = {slot_of:v_pos} AND msg_id = v_pos AND state = 1 AND (expires_at IS NULL OR expires_at > v_now)
        RETURNING msg_id, body, attempts, headers, CASE WHEN p_count THEN nextval('{n_acquired}') END
          INTO o_id, o_body, o_attempts, o_headers, v_ahead;
        IF FOUND THEN
          IF o_body IS NULL THEN o_body := {fn_body_of}(o_id, false); END IF;
          o_status := 0; RETURN {record};
        END IF;
        o_lease := NULL;
      END IF;
      v_rec := {fn_take}(v_pos, p_lease_ms, p_count);
      IF get_byte(v_rec, 0) <> 3 THEN RETURN v_rec; END IF;
      -- A run of positions that will never be written (delayed messages push void ones): the
      -- due redeliveries and delayed messages are looked at every 1000 of them, and the pop goes
      -- on until it finds a message or no position is ahead (each turn spends one position).
      v_i := v_i + 1;
      IF v_i % 1000 = 0 THEN v_look := true; CONTINUE attempt; END IF;
    END LOOP;
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_pop_many}(p_max int, p_lease_ms bigint) RETURNS bytea
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE
  v_rec bytea; v_out bytea := ''; v_got int := 0; v_k int; v_pos bigint[]; v_pushed bigint; v_popped bigint;
  v_p bigint; v_now timestamptz := clock_timestamp(); v_taken bigint[]; v_msgs int := 0; v_wait boolean := false;
  v_bigs bigint[]; v_first bigint; v_base bigint; v_size bigint;
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
  -- The positions, and the newest generation: the slot of a position in it is computed, an older
  -- one's is looked up. A position of a generation switched to since goes to take() in step 3.
  SELECT {last_pushed}, {last_popped}, gen.first_pos, gen.slot_base, gen.size
    INTO v_pushed, v_popped, v_first, v_base, v_size FROM {newest} gen;
  v_k := least(p_max - v_got, greatest(v_pushed - v_popped, 0));
  IF v_k <= 0 OR v_wait THEN
    IF v_out = '' THEN
      v_rec := {fn_pop}(p_lease_ms, false);
      IF get_byte(v_rec, 0) <> 1 THEN v_out := v_rec; END IF;
      IF get_byte(v_rec, 0) = 0 THEN v_msgs := 1; END IF;
    END IF;
  ELSE
    -- 2. The ring: draw up to k positions in one statement, claim their slots in one update,
    -- and pack what it took into one value, in push order. Each position is drawn only while a
    -- push read above is still ahead (as in pop): poppers drawing at once never pass the pushes,
    -- whose positions they would wait for in vain.
    SELECT array_agg(d.p ORDER BY d.p) INTO v_pos FROM (
      SELECT nextval('{pop_seq}') AS p FROM generate_series(1, v_k) g
      WHERE v_pushed > {last_popped}) d;  -- volatile: looked at again for each row
    v_pos := coalesce(v_pos, '{}');
    v_k := cardinality(v_pos);
    -- A body in {content} is read in the same statement (COALESCE evaluates the subquery only
    -- for a NULL body); a pop removes it after.
    IF p_lease_ms <= 0 THEN
      WITH t AS (
        UPDATE {ring} r SET state = 0 FROM unnest(v_pos) p(pos)
        WHERE r.slot = {slot_near:p.pos}
          AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
        RETURNING r.msg_id, NULL::bigint AS lease, r.attempts, r.headers, r.body IS NULL AS big, coalesce(r.body,
          (SELECT c.body FROM {content} c WHERE c.bucket = r.msg_id % {buckets} AND c.msg_id = r.msg_id)) AS body)
      SELECT coalesce(string_agg({row_record}, ''::bytea ORDER BY msg_id), ''), coalesce(array_agg(msg_id), '{}'),
        array_agg(msg_id) FILTER (WHERE big)
      INTO v_rec, v_taken, v_bigs FROM t;
      -- if archive
      INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT r.msg_id, r.attempts, r.pushed_at, clock_timestamp(),
        coalesce(r.body, (SELECT c.body FROM {content} c WHERE c.bucket = r.msg_id % {buckets} AND c.msg_id = r.msg_id)),
        r.headers
      FROM unnest(v_taken) p(pos) JOIN {ring} r ON r.slot = {slot_of:p.pos} AND r.msg_id = p.pos;
      -- end if
      IF v_bigs IS NOT NULL THEN
        DELETE FROM {content} c USING unnest(v_bigs) b(id) WHERE c.bucket = b.id % {buckets} AND c.msg_id = b.id;
      END IF;
    ELSE
      WITH t AS (
        UPDATE {ring} r SET state = 2, lease = (random() * 9007199254740991)::bigint + 1, attempts = r.attempts + 1,
          visible_at = v_now + p_lease_ms * interval '1 millisecond'
        FROM unnest(v_pos) p(pos)
        WHERE r.slot = {slot_near:p.pos}
          AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
        RETURNING r.msg_id, r.lease, r.attempts, r.headers, coalesce(r.body,
          (SELECT c.body FROM {content} c WHERE c.bucket = r.msg_id % {buckets} AND c.msg_id = r.msg_id)) AS body)
      SELECT coalesce(string_agg({row_record}, ''::bytea ORDER BY msg_id), ''), coalesce(array_agg(msg_id), '{}')
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
  -- if archive
  PERFORM nextval('{n_archived}') FROM generate_series(1, v_msgs) WHERE p_lease_ms <= 0;
  -- end if
  RETURN v_out;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_release}(p_positions text, OUT o_released int)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
BEGIN
  -- The popper that drew these positions gives up waiting: remember them, so whoever finds
  -- their messages later (pop on an empty ring, or repair) delivers them.
  INSERT INTO {gap} (pos, reason)
  SELECT unnest(string_to_array(p_positions, ',')::bigint[]), 'skipped' ON CONFLICT (pos) DO NOTHING;
  GET DIAGNOSTICS o_released = ROW_COUNT;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_ack}(p_id bigint, p_lease bigint, OUT o_ok int)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_n bigint; v_big boolean;
BEGIN
  -- o_ok is an int: psqlODBC hands booleans over as '0'/'1' text. RETURNING counts the ack.
  -- A lease past its visibility timeout is lost, whether or not a repair has run since.
  UPDATE {ring} SET state = 0 WHERE slot = {slot_of:p_id} AND msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
  RETURNING nextval('{n_popped}'), body IS NULL INTO v_n, v_big;
  -- if archive
  IF FOUND THEN
    INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT msg_id, attempts, pushed_at, clock_timestamp(),
      coalesce(body, (SELECT c.body FROM {content} c WHERE c.bucket = p_id % {buckets} AND c.msg_id = p_id)), headers
    FROM {ring} WHERE slot = {slot_of:p_id};
  ELSE
    WITH acked AS (
      DELETE FROM {spill} WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
      RETURNING msg_id, attempts, pushed_at, body, headers),
    kept AS (
      INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT msg_id, attempts, pushed_at, clock_timestamp(),
        coalesce(body, (SELECT c.body FROM {content} c WHERE c.bucket = p_id % {buckets} AND c.msg_id = p_id)), headers
      FROM acked)
    SELECT nextval('{n_popped}'), body IS NULL INTO v_n, v_big FROM acked;
  END IF;
  IF FOUND THEN PERFORM nextval('{n_archived}'); END IF;
  -- else
  IF NOT FOUND THEN
    DELETE FROM {spill} WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
    RETURNING nextval('{n_popped}'), body IS NULL INTO v_n, v_big;
  END IF;
  -- end if
  o_ok := CASE WHEN FOUND THEN 1 ELSE 0 END;
  IF o_ok = 1 THEN PERFORM nextval('{n_settled}'); END IF;  -- the lease ended
  IF v_big THEN DELETE FROM {content} WHERE bucket = p_id % {buckets} AND msg_id = p_id; END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_ack_many}(p_ids text, p_leases text, OUT o_acked text)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_ids bigint[] := string_to_array(p_ids, ',')::bigint[];
  v_leases bigint[] := string_to_array(p_leases, ',')::bigint[]; v_done bigint[]; v_bigs bigint[];
  v_first bigint; v_base bigint; v_size bigint;
BEGIN
  -- The newest generation: the slot of a message in it is computed, an older one's looked up.
  SELECT gen.first_pos, gen.slot_base, gen.size INTO v_first, v_base, v_size FROM {newest} gen;
  -- Two statements, not one: a lease moved from the ring to the spill table while the first
  -- ran is seen by the second, which takes a fresh snapshot. The second runs only for the
  -- messages the first did not find.
  WITH acked AS (
    UPDATE {ring} r SET state = 0 FROM unnest(v_ids, v_leases) a(id, lease)
    WHERE r.slot = {slot_near:a.id}
      AND r.msg_id = a.id AND r.state = 2 AND r.lease = a.lease AND r.visible_at > clock_timestamp()
    RETURNING r.msg_id, r.body IS NULL AS big)
  SELECT coalesce(array_agg(msg_id), '{}'), array_agg(msg_id) FILTER (WHERE big) INTO v_done, v_bigs FROM acked;
  -- if archive
  INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT r.msg_id, r.attempts, r.pushed_at, clock_timestamp(),
    coalesce(r.body, (SELECT c.body FROM {content} c WHERE c.bucket = r.msg_id % {buckets} AND c.msg_id = r.msg_id)),
    r.headers
  FROM unnest(v_done) d(id) JOIN {ring} r ON r.slot = {slot_of:d.id} AND r.msg_id = d.id;
  WITH acked AS (
    DELETE FROM {spill} s USING unnest(v_ids, v_leases) a(id, lease)
    WHERE cardinality(v_done) < cardinality(v_ids)
      AND s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.visible_at > clock_timestamp() AND s.msg_id <> ALL (v_done)
    RETURNING s.msg_id, s.attempts, s.pushed_at, s.body, s.headers),
  kept AS (
    INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT msg_id, attempts, pushed_at, clock_timestamp(),
      coalesce(body, (SELECT c.body FROM {content} c WHERE c.bucket = acked.msg_id % {buckets} AND c.msg_id = acked.msg_id)),
      headers
    FROM acked)
  SELECT v_done || coalesce(array_agg(msg_id), '{}'), v_bigs || array_agg(msg_id) FILTER (WHERE body IS NULL)
  INTO v_done, v_bigs FROM acked;
  PERFORM nextval('{n_archived}') FROM unnest(v_done);
  -- else
  IF cardinality(v_done) < cardinality(v_ids) THEN
    WITH acked AS (
      DELETE FROM {spill} s USING unnest(v_ids, v_leases) a(id, lease)
      WHERE s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.visible_at > clock_timestamp() AND s.msg_id <> ALL (v_done)
      RETURNING s.msg_id, s.body IS NULL AS big)
    SELECT v_done || coalesce(array_agg(msg_id), '{}'), v_bigs || array_agg(msg_id) FILTER (WHERE big)
    INTO v_done, v_bigs FROM acked;
  END IF;
  -- end if
  PERFORM nextval('{n_popped}'), nextval('{n_settled}') FROM unnest(v_done);
  IF v_bigs IS NOT NULL THEN
    DELETE FROM {content} c USING unnest(v_bigs) b(id) WHERE c.bucket = b.id % {buckets} AND c.msg_id = b.id;
  END IF;
  o_acked := coalesce(array_to_string(v_done, ','), '');
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_nack}(p_id bigint, p_lease bigint, p_delay_ms bigint, p_error text, OUT o_ok int)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_visible timestamptz := clock_timestamp() + greatest(p_delay_ms, 0) * interval '1 millisecond';
  v_attempts int; v_pushed timestamptz; v_expires timestamptz; v_body bytea; v_headers text;
  v_spilled boolean := false;
BEGIN
  -- o_ok: 0 no lease (expired, or acked already), 1 ready again after the delay, 2 dead-lettered:
  -- acquired {max_attempts} times (when that is > 0), it moves to the dead letters with the
  -- error, in this transaction. A negative delay gives it back unhandled (a consumer stopping):
  -- ready at once, and this delivery does not count as an attempt.
  UPDATE {ring} SET state = 0
  WHERE slot = {slot_of:p_id} AND msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp()
  RETURNING attempts, pushed_at, expires_at, body, headers INTO v_attempts, v_pushed, v_expires, v_body, v_headers;
  IF NOT FOUND THEN
    SELECT attempts, pushed_at, expires_at, body, headers INTO v_attempts, v_pushed, v_expires, v_body, v_headers
    FROM {spill}
    WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp() FOR UPDATE;
    IF NOT FOUND THEN o_ok := 0; RETURN; END IF;
    v_spilled := true;
  END IF;
  PERFORM nextval('{n_settled}');  -- the lease ended
  IF p_delay_ms < 0 THEN
    v_attempts := greatest(v_attempts - 1, 0);
  ELSIF {max_attempts} > 0 AND v_attempts >= {max_attempts} THEN
    IF v_spilled THEN DELETE FROM {spill} WHERE msg_id = p_id; END IF;
    IF v_body IS NULL THEN v_body := {fn_body_of}(p_id, true); END IF;  -- a dead letter holds its body
    INSERT INTO {dead} (source, msg_id, attempts, error, pushed_at, body, headers)
    VALUES ({dead_source}, p_id, v_attempts, left(p_error, 4000), v_pushed, v_body,
      {fn_headers_of_dead}(v_headers, left(p_error, 4000), v_attempts))
    ON CONFLICT (source, msg_id) DO NOTHING;
    PERFORM nextval('{n_dead}');
    o_ok := 2; RETURN;
  END IF;
  IF v_spilled THEN
    UPDATE {spill} SET state = 1, lease = 0, visible_at = v_visible, attempts = v_attempts WHERE msg_id = p_id;
  ELSE
    INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    VALUES (p_id, 1, 0, v_attempts, v_pushed, v_visible, v_expires, v_body, v_headers);
  END IF;
  o_ok := 1;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_expire_leases}(OUT o_expired bigint, OUT o_dead bigint)
LANGUAGE plpgsql AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_n bigint; v_dead bigint;
BEGIN
  -- Called by repair (the operator's cleanup) and by read at most once a second (version 23 on),
  -- so an expired lease comes back without the operator, as PGMQ's visibility timeout does.
  -- Leases past their visibility timeout: ready again, out of ring order; those acquired
  -- {max_attempts} times (when that is > 0) go to the dead letters instead.
  WITH due AS (
    SELECT slot FROM {ring} WHERE state = 2 AND visible_at < v_now ORDER BY slot FOR UPDATE SKIP LOCKED),
  moved AS (
    UPDATE {ring} r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 2
    RETURNING r.msg_id, r.attempts, r.pushed_at, r.expires_at, r.body, r.headers),
  dead AS (
    INSERT INTO {dead} (source, msg_id, attempts, error, pushed_at, body, headers)
    SELECT {dead_source}, m.msg_id, m.attempts, 'lease expired (visibility timeout)', m.pushed_at,
      coalesce(m.body, (SELECT c.body FROM {content} c WHERE c.bucket = m.msg_id % {buckets} AND c.msg_id = m.msg_id)),
      {fn_headers_of_dead}(m.headers, 'lease expired (visibility timeout)', m.attempts) FROM moved m
    WHERE {max_attempts} > 0 AND m.attempts >= {max_attempts} ON CONFLICT (source, msg_id) DO NOTHING RETURNING msg_id),
  unkept AS (  -- (all parts of one statement see the same snapshot: the copy above reads it first)
    DELETE FROM {content} c USING moved m WHERE m.body IS NULL AND {max_attempts} > 0
      AND m.attempts >= {max_attempts} AND c.bucket = m.msg_id % {buckets} AND c.msg_id = m.msg_id),
  ready AS (
    INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_now, m.expires_at, m.body, m.headers FROM moved m
    WHERE NOT ({max_attempts} > 0 AND m.attempts >= {max_attempts}) RETURNING msg_id)
  SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM dead) INTO o_expired, o_dead;
  WITH due AS (
    SELECT msg_id FROM {spill} WHERE state = 2 AND visible_at < v_now ORDER BY msg_id FOR UPDATE SKIP LOCKED),
  gone AS (
    DELETE FROM {spill} s USING due WHERE s.msg_id = due.msg_id AND {max_attempts} > 0 AND s.attempts >= {max_attempts}
    RETURNING s.msg_id, s.attempts, s.pushed_at, s.body, s.headers),
  dead AS (
    INSERT INTO {dead} (source, msg_id, attempts, error, pushed_at, body, headers)
    SELECT {dead_source}, g.msg_id, g.attempts, 'lease expired (visibility timeout)', g.pushed_at,
      coalesce(g.body, (SELECT c.body FROM {content} c WHERE c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id)),
      {fn_headers_of_dead}(g.headers, 'lease expired (visibility timeout)', g.attempts) FROM gone g
    ON CONFLICT (source, msg_id) DO NOTHING),
  unkept AS (
    DELETE FROM {content} c USING gone g
    WHERE g.body IS NULL AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id),
  ready AS (
    UPDATE {spill} s SET state = 1, lease = 0 FROM due
    WHERE s.msg_id = due.msg_id AND NOT ({max_attempts} > 0 AND s.attempts >= {max_attempts}) RETURNING 1)
  SELECT (SELECT count(*) FROM ready) + (SELECT count(*) FROM gone), (SELECT count(*) FROM gone) INTO v_n, v_dead;
  o_expired := o_expired + v_n;
  o_dead := o_dead + v_dead;
  PERFORM nextval('{n_settled}') FROM generate_series(1, o_expired);
  PERFORM nextval('{n_dead}') FROM generate_series(1, o_dead);
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_repair}(p_orphan_grace_ms bigint,
  OUT o_expired_leases bigint, OUT o_orphans bigint, OUT o_expired bigint, OUT o_gaps_purged bigint,
  OUT o_dead bigint)
LANGUAGE plpgsql {definer} AS $fn$
DECLARE v_now timestamptz := clock_timestamp(); v_popped bigint; v_n bigint;
BEGIN
  v_popped := {last_popped};
  -- Rows a client is changing right now are skipped (SKIP LOCKED): they are in use, the next
  -- run looks again, and repair never waits on a client or deadlocks with one.
  SELECT e.o_expired, e.o_dead INTO o_expired_leases, o_dead FROM {fn_expire_leases}() e;
  -- Orphans: ready messages whose pop position was drawn but never claimed (the popper died
  -- mid-call or gave up waiting). Their position is spent, so they leave ring order.
  WITH due AS (
    SELECT slot FROM {ring}
    WHERE state = 1 AND msg_id <= v_popped AND pushed_at <= v_now - p_orphan_grace_ms * interval '1 millisecond'
      AND (expires_at IS NULL OR expires_at > v_now)
    ORDER BY slot FOR UPDATE SKIP LOCKED),
  moved AS (
    UPDATE {ring} r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 1
    RETURNING r.msg_id, r.attempts, r.pushed_at, r.expires_at, r.body, r.headers)
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT m.msg_id, 1, 0, m.attempts, m.pushed_at, v_now, m.expires_at, m.body, m.headers FROM moved m;
  GET DIAGNOSTICS o_orphans = ROW_COUNT;
  -- Expired messages (TTL) still in the ring: free the slot; a position not drawn yet becomes void.
  WITH due AS (
    SELECT slot FROM {ring} WHERE state = 1 AND expires_at <= v_now ORDER BY slot FOR UPDATE SKIP LOCKED),
  freed AS (
    UPDATE {ring} r SET state = 0 FROM due WHERE r.slot = due.slot AND r.state = 1
    RETURNING r.msg_id, r.body IS NULL AS big),
  unkept AS (
    DELETE FROM {content} c USING freed f WHERE f.big AND c.bucket = f.msg_id % {buckets} AND c.msg_id = f.msg_id),
  voided AS (
    INSERT INTO {gap} (pos, reason) SELECT msg_id, 'void' FROM freed WHERE msg_id > v_popped
    ON CONFLICT (pos) DO NOTHING)
  SELECT count(*) INTO o_expired FROM freed;
  WITH gone AS (
    DELETE FROM {spill} s USING (
      SELECT msg_id FROM {spill} WHERE state = 1 AND expires_at <= v_now ORDER BY msg_id FOR UPDATE SKIP LOCKED) due
    WHERE s.msg_id = due.msg_id RETURNING s.msg_id, s.body IS NULL AS big),
  unkept AS (
    DELETE FROM {content} c USING gone g WHERE g.big AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id)
  SELECT count(*) INTO v_n FROM gone;
  o_expired := o_expired + v_n;
  PERFORM nextval('{n_expired}') FROM generate_series(1, o_expired);
  -- Content whose message is gone: none should be (a body is written and removed in its
  -- message's transactions), but should a message end without it, at most 1000 go a run.
  DELETE FROM {content} c USING (
    SELECT x.bucket, x.msg_id FROM {content} x
    WHERE NOT EXISTS (SELECT 1 FROM {ring} r WHERE r.slot = {slot_of:x.msg_id} AND r.msg_id = x.msg_id AND r.state <> 0)
      AND NOT EXISTS (SELECT 1 FROM {spill} s WHERE s.msg_id = x.msg_id)
    LIMIT 1000 FOR UPDATE OF x SKIP LOCKED) gone
  WHERE c.bucket = gone.bucket AND c.msg_id = gone.msg_id;
  -- Gaps a whole lap of the largest generation behind the pop position, or older than every
  -- generation, can never be written any more.
  DELETE FROM {gap} g
  WHERE (g.pos <= v_popped - (SELECT max(x.size) FROM {gens} x) OR g.pos < (SELECT min(x.first_pos) FROM {gens} x))
    AND NOT EXISTS (SELECT 1 FROM {ring} r WHERE r.slot = {slot_of:g.pos} AND r.msg_id = g.pos AND r.state = 1);
  GET DIAGNOSTICS o_gaps_purged = ROW_COUNT;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_void_holes}(p_grace_ms bigint, OUT o_holes bigint)
LANGUAGE plpgsql {definer} AS $fn$
DECLARE v_popped bigint; v_bound bigint; v_lo bigint; v_hi bigint; v_n bigint; g record;
BEGIN
  -- Holes: positions a pusher drew and never wrote (it died). A position drawn before a message
  -- that is already older than the grace has been unwritten at least that long: void it, so
  -- the popper that draws it moves on at once. (Should the pusher write it after all, the
  -- message is an orphan, and repair delivers it.)
  v_popped := {last_popped};
  SELECT max(msg_id) INTO v_bound FROM {ring}
  WHERE state = 1 AND msg_id > v_popped AND pushed_at <= clock_timestamp() - p_grace_ms * interval '1 millisecond';
  o_holes := 0;
  IF v_bound IS NULL THEN RETURN; END IF;
  -- Per generation, each of its slots stands for the one position of its part of
  -- (v_popped, v_bound) that maps to it (a part never spans more than a lap).
  FOR g IN SELECT x.first_pos, x.slot_base, x.size, lead(x.first_pos) OVER (ORDER BY x.first_pos) AS next_pos
           FROM {gens} x LOOP
    v_lo := greatest(v_popped + 1, g.first_pos);
    v_hi := least(v_bound, coalesce(g.next_pos, v_bound));
    CONTINUE WHEN v_lo >= v_hi;
    INSERT INTO {gap} (pos, reason)
    SELECT c.p, 'void' FROM (
      SELECT r.msg_id, v_lo + ((r.slot - g.slot_base - v_lo % g.size + g.size) % g.size) AS p FROM {ring} r
      WHERE r.slot >= g.slot_base AND r.slot < g.slot_base + g.size) c
    WHERE c.p < v_hi AND c.msg_id IS DISTINCT FROM c.p
    ON CONFLICT (pos) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    o_holes := o_holes + v_n;
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_oldest_age}(p_pos bigint) RETURNS double precision
-- The age of the oldest ready message, from a bounded look at the head: the next {head_look}
-- positions after pop position p_pos, the positions whose popper gave up, and the first
-- {head_look} redeliveries. Its own routine, called only for a queue that holds messages: an
-- empty queue's stats never plan it.
LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(extract(epoch FROM clock_timestamp() - (
    SELECT min(head.pushed_at) FROM (
      SELECT r.pushed_at FROM generate_series(1, {head_look}) g(k)  -- constant bounds: planned as {head_look} rows
      JOIN {ring} r ON r.slot = {slot_of:p_pos + g.k} AND r.msg_id = p_pos + g.k AND r.state = 1
      UNION ALL
      SELECT r.pushed_at FROM {gap} x JOIN {ring} r ON r.slot = {slot_of:x.pos} AND r.msg_id = x.pos AND r.state = 1
      WHERE x.reason = 'skipped'
      UNION ALL
      SELECT s.pushed_at FROM (SELECT state, pushed_at, visible_at FROM {spill} ORDER BY msg_id LIMIT {head_look}) s
      WHERE s.state = 1 AND s.visible_at <= clock_timestamp()
    ) head)), 0)::float8
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_stats}(
  OUT o_depth bigint, OUT o_in_flight bigint, OUT o_pushed bigint, OUT o_popped bigint,
  OUT o_acquired bigint, OUT o_expired bigint, OUT o_oldest_age_s double precision,
  OUT o_dead bigint, OUT o_delayed bigint, OUT o_archived bigint)
-- One query in SQL, not PL/pgSQL: PostgreSQL keeps no plan of it in the session between calls.
-- A session that measured many queues would otherwise hold all their plans, and every DDL in the
-- database (a queue created, say) costs each session a walk over every plan it holds.
LANGUAGE sql STABLE {definer} AS $fn$
  -- From the totals, not a count of the ring: the same cost at any size. Messages present are
  -- those pushed (or redriven) and not yet popped, acknowledged (both counted as popped),
  -- expired or dead-lettered; in flight are the acquisitions whose lease has not ended (acked,
  -- nacked or expired: settled); delayed are the ready ones not visible yet (a count of the
  -- spill table, which holds only redeliveries and delayed messages).
  WITH totals AS (
    SELECT
      coalesce(pg_sequence_last_value({n_pushed_class}), 0) AS pushed,
      coalesce(pg_sequence_last_value({n_popped_class}), 0) AS popped,
      coalesce(pg_sequence_last_value({n_acquired_class}), 0) AS acquired,
      coalesce(pg_sequence_last_value({n_expired_class}), 0) AS expired,
      coalesce(pg_sequence_last_value({n_settled_class}), 0) AS settled,
      coalesce(pg_sequence_last_value({n_dead_class}), 0) AS dead,
      coalesce(pg_sequence_last_value({n_redriven_class}), 0) AS redriven,
      coalesce(pg_sequence_last_value({n_purged_class}), 0) AS purged,
      coalesce(pg_sequence_last_value({n_archived_class}), 0) AS archived,
      coalesce(pg_sequence_last_value({n_scavenged_class}), 0) AS scavenged,
      coalesce(pg_sequence_last_value({pop_seq_class}), 0) AS pos,
      (SELECT count(*) FROM {spill} WHERE state = 1 AND visible_at > clock_timestamp()) AS delayed
  ), counts AS (
    SELECT t.*, greatest(t.acquired - t.settled, 0) AS in_flight FROM totals t
  ), present AS (
    SELECT c.*, greatest(c.pushed + c.redriven - c.popped - c.expired - c.dead - c.in_flight - c.delayed, 0) AS depth
    FROM counts c
  )
  SELECT p.depth, p.in_flight, p.pushed, p.popped, p.acquired, p.expired,
    CASE WHEN p.depth > 0 THEN {fn_oldest_age}(p.pos) ELSE 0 END,
    greatest(p.dead - p.redriven - p.purged, 0), p.delayed, greatest(p.archived - p.scavenged, 0)
  FROM present p
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_defer}(p_bodies bytea, p_lengths text, p_ttl_ms bigint, p_delay_ms bigint,
  p_headers text DEFAULT NULL, OUT o_ids text)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_bodies bytea[] := {fn_split_bodies}(p_bodies, p_lengths, 'defer'); v_big int; v_ids bigint[];
  v_headers text[] := {fn_split_headers}(p_headers);
  v_now timestamptz := clock_timestamp(); v_visible timestamptz;
BEGIN
  -- Delayed messages wait aside, in the spill table, until they are due; the ring's head never
  -- waits for them. Each takes a push position, given up at once as void (poppers skip it), so
  -- its id is in push order with the others.
  SELECT max(octet_length(b)) INTO v_big FROM unnest(v_bodies) b;
  IF v_big > {max_body_bytes} THEN  -- a delayed message's spill row holds its body, whatever its size
    RAISE EXCEPTION 'dbq: message of % bytes is larger than spec.messages.maxBytes ({max_body_bytes}) of queue {queue}',
      v_big USING ERRCODE = '22001';
  END IF;
  IF v_headers IS NOT NULL AND cardinality(v_headers) <> coalesce(cardinality(v_bodies), 0) THEN
    RAISE EXCEPTION 'dbq: defer got headers for % messages and % bodies', cardinality(v_headers),
      coalesce(cardinality(v_bodies), 0) USING ERRCODE = '22023';
  END IF;
  -- Everything is checked before positions are drawn: a refusal leaves no hole behind.
  v_visible := v_now + greatest(p_delay_ms, 0) * interval '1 millisecond';
  SELECT array_agg(nextval('{push_seq}') ORDER BY g) INTO v_ids FROM generate_series(1, coalesce(cardinality(v_bodies), 0)) g;
  INSERT INTO {gap} (pos, reason) SELECT unnest(v_ids), 'void' ON CONFLICT (pos) DO NOTHING;
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT u.id, 1, 0, 0, v_now, v_visible,
    CASE WHEN p_ttl_ms > 0 THEN v_visible + p_ttl_ms * interval '1 millisecond' END, u.body, u.headers
  FROM unnest(v_ids, v_bodies, v_headers) AS u(id, body, headers);
  PERFORM nextval('{n_pushed}') FROM unnest(v_ids);
  o_ids := coalesce(array_to_string(v_ids, ','), '');
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_extend}(p_id bigint, p_lease bigint, p_visibility_ms bigint, OUT o_ok int)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_until timestamptz := clock_timestamp() + greatest(p_visibility_ms, 1) * interval '1 millisecond';
BEGIN
  -- A handler still working keeps its lease: visible again only `p_visibility_ms` from now.
  UPDATE {ring} SET visible_at = v_until
  WHERE slot = {slot_of:p_id} AND msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp();
  IF NOT FOUND THEN
    UPDATE {spill} SET visible_at = v_until
    WHERE msg_id = p_id AND state = 2 AND lease = p_lease AND visible_at > clock_timestamp();
  END IF;
  o_ok := CASE WHEN FOUND THEN 1 ELSE 0 END;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_redrive}(p_ids text, p_max int, OUT o_moved bigint)
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  -- Dead letters back to delivery (the given ids, or the oldest p_max when none are given):
  -- the same id, attempts from zero, ready at once, headers as pushed (without dbq's
  -- dead-letter keys).
  WITH moved AS (
    DELETE FROM {dead} d USING (
      SELECT msg_id FROM {dead}
      WHERE source = {dead_source} AND (p_ids = '' OR msg_id = ANY (string_to_array(p_ids, ',')::bigint[]))
      ORDER BY msg_id LIMIT p_max FOR UPDATE SKIP LOCKED) pick
    WHERE d.source = {dead_source} AND d.msg_id = pick.msg_id
    RETURNING d.msg_id, d.pushed_at, d.body, d.headers)
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT m.msg_id, 1, 0, 0, m.pushed_at, clock_timestamp(), NULL, m.body,
    nullif((m.headers::jsonb - 'dbq-error' - 'dbq-attempts')::text, '{}') FROM moved m
  ON CONFLICT (msg_id) DO NOTHING;
  GET DIAGNOSTICS o_moved = ROW_COUNT;
  PERFORM nextval('{n_redriven}') FROM generate_series(1, o_moved);
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_purge_dead}(p_ids text, p_max int, OUT o_purged bigint)
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  -- Dead letters deleted for good (the given ids, or the oldest p_max when none are given).
  DELETE FROM {dead} d USING (
    SELECT msg_id FROM {dead}
    WHERE source = {dead_source} AND (p_ids = '' OR msg_id = ANY (string_to_array(p_ids, ',')::bigint[]))
    ORDER BY msg_id LIMIT p_max FOR UPDATE SKIP LOCKED) pick
  WHERE d.source = {dead_source} AND d.msg_id = pick.msg_id;
  GET DIAGNOSTICS o_purged = ROW_COUNT;
  PERFORM nextval('{n_purged}') FROM generate_series(1, o_purged);
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_scavenge}(p_retention_ms bigint, p_max int, OUT o_scavenged bigint)
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  -- Archived messages older than the retention, the oldest p_max of them: one bounded batch, so
  -- a large backlog is removed over several short transactions, never by one huge delete.
  DELETE FROM {archive} a USING (
    SELECT ctid FROM {archive} WHERE acked_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
    ORDER BY acked_at LIMIT p_max FOR UPDATE SKIP LOCKED) old
  WHERE a.ctid = old.ctid;
  GET DIAGNOSTICS o_scavenged = ROW_COUNT;
  PERFORM nextval('{n_scavenged}') FROM generate_series(1, o_scavenged);
END $fn$
--;;
-- The row contract, for a worker in any language: one statement a call, answers as rows, no
-- status codes. read waits inside for a drawn position whose push has not committed yet (up to
-- {hole_grace_ms} ms in all, or a quarter of the lease if shorter; then gives it up as release
-- does), and for the first message up to p_wait_ms; send raises an error where push answers -1,
-- and send_batch when the ring took none of its bodies.
CREATE OR REPLACE FUNCTION {fn_read}(p_qty int, p_visibility_ms bigint, p_wait_ms bigint DEFAULT 0)
RETURNS TABLE (msg_id bigint, lease bigint, attempts int, enqueued_at timestamptz, visible_at timestamptz,
  headers jsonb, body bytea)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
#variable_conflict use_column
DECLARE
  v_until timestamptz := clock_timestamp() + greatest(p_wait_ms, 0) * interval '1 millisecond';
  v_now timestamptz; v_lease_end timestamptz; v_due bigint[]; v_pos bigint[]; v_left bigint[]; v_gone bigint[];
  v_bigs bigint[]; v_k int; v_got int; v_n int; v_p bigint; v_rec bytea; v_h int; v_since timestamptz;
  v_ms bigint; v_leased boolean := p_visibility_ms > 0; v_pushed bigint; v_first bigint; v_base bigint; v_size bigint;
  v_grace interval := CASE WHEN p_visibility_ms > 0 THEN least({hole_grace_ms}, greatest(p_visibility_ms / 4, 1))
    ELSE {hole_grace_ms} END * interval '1 millisecond';
BEGIN
  IF p_qty IS NULL OR p_qty < 1 THEN
    RAISE EXCEPTION 'dbq: read from queue {queue}: qty must be at least 1, not %', p_qty USING ERRCODE = '22023';
  END IF;
  IF p_visibility_ms IS NULL OR p_visibility_ms < 0 THEN
    RAISE EXCEPTION 'dbq: read from queue {queue}: visibility_ms must be 0 (at most once) or a lease in milliseconds, not %',
      p_visibility_ms USING ERRCODE = '22023';
  END IF;
  IF p_wait_ms IS NULL OR p_wait_ms < 0 THEN
    RAISE EXCEPTION 'dbq: read from queue {queue}: wait_ms must be 0 or more, not %', p_wait_ms USING ERRCODE = '22023';
  END IF;
  LOOP
    -- 0. Leases past their visibility timeout come back without the operator's cleanup: at most
    -- every {sweep_every_ms} ms while the totals say leases are held (a second, longer for a ring
    -- past 100,000 slots: the sweep scans the ring), every {sweep_idle_ms} ms otherwise (should a
    -- rolled-back call have left the totals behind), by the one reader that takes the sweep's
    -- lock. Its sequence holds the last sweep's time in ms (setval is not transactional: no row is
    -- locked for it). Before this read takes its clock, so that it answers what it swept. (The
    -- CASE is in parentheses: PL/pgSQL ends an IF's condition at the first THEN it meets.)
    v_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF {last_swept} < v_ms - (CASE WHEN {leases_held} THEN {sweep_every_ms} ELSE {sweep_idle_ms} END)
        AND pg_try_advisory_xact_lock({sweep_lock}) AND {last_swept} < v_ms - {sweep_every_ms} THEN
      PERFORM setval('{swept_seq}', v_ms);
      PERFORM {fn_expire_leases}();
    END IF;
    v_now := clock_timestamp();
    v_lease_end := CASE WHEN v_leased THEN v_now + p_visibility_ms * interval '1 millisecond' END;
    v_got := 0;
    -- 1. Redeliveries due (nacked, lease expired, rescued orphans, delayed), the longest due first.
    SELECT array_agg(s.msg_id ORDER BY s.visible_at) INTO v_due FROM (
      SELECT s.msg_id, s.visible_at FROM {spill} s WHERE s.state = 1 AND s.visible_at <= v_now
      ORDER BY s.visible_at LIMIT p_qty FOR UPDATE SKIP LOCKED) s;
    IF v_due IS NOT NULL THEN
      WITH gone AS (  -- expired while waiting: dropped
        DELETE FROM {spill} s USING unnest(v_due) d(id) WHERE s.msg_id = d.id AND s.expires_at <= v_now
        RETURNING s.msg_id, s.body IS NULL AS big)
      SELECT array_agg(g.msg_id), array_agg(g.msg_id) FILTER (WHERE g.big) INTO v_gone, v_bigs FROM gone g;
      IF v_gone IS NOT NULL THEN
        PERFORM nextval('{n_expired}') FROM unnest(v_gone);
        DELETE FROM {content} c USING unnest(v_bigs) b(id) WHERE c.bucket = b.id % {buckets} AND c.msg_id = b.id;
      END IF;
      IF v_leased THEN
        RETURN QUERY
        WITH t AS (
          UPDATE {spill} s SET state = 2, lease = (random() * 9007199254740991)::bigint + 1,
            attempts = s.attempts + 1, visible_at = v_lease_end
          FROM unnest(v_due) d(id) WHERE s.msg_id = d.id AND s.state = 1
          RETURNING s.msg_id, s.lease, s.attempts, s.pushed_at, s.headers, coalesce(s.body,
            (SELECT c.body FROM {content} c WHERE c.bucket = s.msg_id % {buckets} AND c.msg_id = s.msg_id)) AS body)
        SELECT t.msg_id, t.lease, t.attempts, t.pushed_at, v_lease_end, t.headers::jsonb, t.body
        FROM t JOIN unnest(v_due) WITH ORDINALITY d(id, i) ON d.id = t.msg_id ORDER BY d.i;
      ELSE
        RETURN QUERY
        WITH t AS (
          DELETE FROM {spill} s USING unnest(v_due) d(id) WHERE s.msg_id = d.id
          RETURNING s.msg_id, s.attempts, s.pushed_at, s.headers, s.body IS NULL AS big, coalesce(s.body,
            (SELECT c.body FROM {content} c WHERE c.bucket = s.msg_id % {buckets} AND c.msg_id = s.msg_id)) AS body),
        c AS (DELETE FROM {content} c USING t WHERE t.big AND c.bucket = t.msg_id % {buckets} AND c.msg_id = t.msg_id)
        -- if archive
        , a AS (INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
          SELECT t.msg_id, t.attempts, t.pushed_at, clock_timestamp(), t.body, t.headers FROM t)
        -- end if
        SELECT t.msg_id, NULL::bigint, t.attempts, t.pushed_at, NULL::timestamptz, t.headers::jsonb, t.body
        FROM t JOIN unnest(v_due) WITH ORDINALITY d(id, i) ON d.id = t.msg_id ORDER BY d.i;
      END IF;
      GET DIAGNOSTICS v_got = ROW_COUNT;
    END IF;
    -- 2. The ring, in push order: positions drawn only while a push is ahead (as pop_many
    -- draws them), their slots claimed by one statement that answers the rows (computed in the
    -- newest generation, looked up in an older one, as pop_many does).
    SELECT {last_pushed}, least(p_qty - v_got, greatest({last_pushed} - {last_popped}, 0)), gen.first_pos, gen.slot_base, gen.size
      INTO v_pushed, v_k, v_first, v_base, v_size FROM {newest} gen;
    IF v_k > 0 THEN
      SELECT array_agg(d.p ORDER BY d.p) INTO v_pos FROM (
        SELECT nextval('{pop_seq}') AS p FROM generate_series(1, v_k) g
        WHERE v_pushed > {last_popped}) d;  -- volatile: looked at again for each row
    ELSE
      v_pos := NULL;
    END IF;
    IF v_pos IS NOT NULL THEN
      IF v_leased THEN
        RETURN QUERY
        WITH t AS (
          UPDATE {ring} r SET state = 2, lease = (random() * 9007199254740991)::bigint + 1,
            attempts = r.attempts + 1, visible_at = v_lease_end
          FROM unnest(v_pos) p(pos)
          WHERE r.slot = {slot_near:p.pos}
            AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
          RETURNING r.msg_id, r.lease, r.attempts, r.pushed_at, r.headers, coalesce(r.body,
            (SELECT c.body FROM {content} c WHERE c.bucket = r.msg_id % {buckets} AND c.msg_id = r.msg_id)) AS body)
        SELECT t.msg_id, t.lease, t.attempts, t.pushed_at, v_lease_end, t.headers::jsonb, t.body FROM t ORDER BY t.msg_id;
      ELSE
        RETURN QUERY
        WITH t AS (
          UPDATE {ring} r SET state = 0 FROM unnest(v_pos) p(pos)
          WHERE r.slot = {slot_near:p.pos}
            AND r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > v_now)
          RETURNING r.msg_id, r.attempts, r.pushed_at, r.headers, r.body IS NULL AS big, coalesce(r.body,
            (SELECT c.body FROM {content} c WHERE c.bucket = r.msg_id % {buckets} AND c.msg_id = r.msg_id)) AS body),
        c AS (DELETE FROM {content} c USING t WHERE t.big AND c.bucket = t.msg_id % {buckets} AND c.msg_id = t.msg_id)
        -- if archive
        , a AS (INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
          SELECT t.msg_id, t.attempts, t.pushed_at, clock_timestamp(), t.body, t.headers FROM t)
        -- end if
        SELECT t.msg_id, NULL::bigint, t.attempts, t.pushed_at, NULL::timestamptz, t.headers::jsonb, t.body
        FROM t ORDER BY t.msg_id;
      END IF;
      GET DIAGNOSTICS v_n = ROW_COUNT;
      v_got := v_got + v_n;
      -- Positions not claimed above (expired, gone, or still being written) go through take, which
      -- settles each; one being written is waited for here.
      IF v_n < cardinality(v_pos) THEN
        SELECT array_agg(p.pos ORDER BY p.pos) INTO v_left FROM unnest(v_pos) p(pos)
        WHERE NOT EXISTS (SELECT 1 FROM {ring} r WHERE r.slot = {slot_of:p.pos} AND r.msg_id = p.pos
          AND r.state = CASE WHEN v_leased THEN 2 ELSE 0 END);
      ELSE
        v_left := NULL;
      END IF;
    ELSIF v_got = 0 THEN
      -- Nothing new. A position whose popper gave up may have received its message since.
      SELECT array_agg(g.pos) INTO v_left FROM (
        SELECT g.pos FROM {gap} g JOIN {ring} r ON r.slot = {slot_of:g.pos} AND r.msg_id = g.pos
        WHERE g.reason = 'skipped' AND r.state = 1 LIMIT p_qty FOR UPDATE OF g SKIP LOCKED) g;
      DELETE FROM {gap} g USING unnest(v_left) l(pos) WHERE g.pos = l.pos;
    ELSE
      v_left := NULL;
    END IF;
    -- One grace for them all, shortened for a short lease: the leases of the rows above run.
    v_since := clock_timestamp();
    FOREACH v_p IN ARRAY coalesce(v_left, '{}') LOOP
      LOOP
        v_rec := {fn_take}(v_p, p_visibility_ms, false);
        EXIT WHEN get_byte(v_rec, 0) <> 2;  -- taken (0) or gone (3)
        IF clock_timestamp() - v_since > v_grace THEN
          PERFORM {fn_release}(v_p::text);  -- its pusher is taken for dead: whoever finds it later delivers it
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
      FROM {ring} r WHERE r.slot = {slot_of:v_p} AND r.msg_id = v_p;
      v_got := v_got + 1;
    END LOOP;
    IF v_got > 0 THEN
      -- Counted once, at the end, as pop_many counts (a rollback does not undo a sequence).
      PERFORM CASE WHEN v_leased THEN nextval('{n_acquired}') ELSE nextval('{n_popped}') END
      FROM generate_series(1, v_got);
      -- if archive
      PERFORM nextval('{n_archived}') FROM generate_series(1, v_got) WHERE NOT v_leased;
      -- end if
      RETURN;
    END IF;
    -- Every position drawn was gone (void, as a delayed message leaves one, or deleted by id)
    -- while pushes are still ahead: draw on at once, as pop does.
    CONTINUE WHEN v_pos IS NOT NULL AND {last_pushed} > {last_popped};
    EXIT WHEN clock_timestamp() >= v_until;
    PERFORM pg_sleep(least(0.05, extract(epoch FROM v_until - clock_timestamp())));
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_send}(p_body bytea, p_headers jsonb DEFAULT NULL, p_delay_ms bigint DEFAULT 0,
  p_ttl_ms bigint DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_id bigint;
BEGIN
  PERFORM {fn_check_send}(1, p_delay_ms, p_ttl_ms, p_body IS NULL);
  IF p_delay_ms > 0 THEN
    RETURN {fn_defer}(p_body, octet_length(p_body)::text, p_ttl_ms, p_delay_ms,
      CASE WHEN p_headers IS NOT NULL THEN jsonb_build_array(p_headers)::text END)::bigint;
  END IF;
  -- push draws a position only while the ring has room, so a refusal leaves no hole; a position
  -- it drew and had to give up (a slot an earlier lap still held) is void, and it is tried again.
  FOR v_try IN 1..5 LOOP
    v_id := {fn_push}(p_body, p_ttl_ms, p_headers::text);
    EXIT WHEN v_id > 0 OR {room} <= 0;
  END LOOP;
  IF v_id < 0 THEN PERFORM {fn_check_send}(-1, 0, 0, false); END IF;
  RETURN v_id;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_send_batch}(p_bodies bytea[], p_headers jsonb[] DEFAULT NULL,
  p_delay_ms bigint DEFAULT 0, p_ttl_ms bigint DEFAULT 0)
RETURNS TABLE (msg_id bigint) LANGUAGE plpgsql {definer} {plan_once} AS $fn$
DECLARE v_n int := coalesce(cardinality(p_bodies), 0); v_bodies bytea; v_lengths text; v_texts text[];
  v_ids bigint[];
BEGIN
  PERFORM {fn_check_send}(v_n, p_delay_ms, p_ttl_ms, array_position(p_bodies, NULL) IS NOT NULL);
  IF p_headers IS NOT NULL AND cardinality(p_headers) <> v_n THEN
    RAISE EXCEPTION 'dbq: send_batch to queue {queue} got % headers for % bodies: give one (or NULL) per body',
      cardinality(p_headers), v_n USING ERRCODE = '22023';
  END IF;
  IF v_n = 0 THEN RETURN; END IF;
  IF p_delay_ms > 0 THEN  -- defer takes the bodies end to end, as push_many does
    SELECT string_agg(b, ''::bytea ORDER BY i), string_agg(octet_length(b)::text, ',' ORDER BY i)
    INTO v_bodies, v_lengths FROM unnest(p_bodies) WITH ORDINALITY x(b, i);
    v_ids := string_to_array({fn_defer}(v_bodies, v_lengths, p_ttl_ms, p_delay_ms,
      CASE WHEN p_headers IS NOT NULL THEN array_to_json(p_headers)::text END), ',')::bigint[];
  ELSE
    IF p_headers IS NOT NULL THEN  -- each an object (or NULL) of at most {header_bytes} bytes
      SELECT array_agg(CASE WHEN t IS NULL OR t = 'null' THEN NULL ELSE h::text END ORDER BY i) INTO v_texts
      FROM unnest(p_headers) WITH ORDINALITY AS x(h, i), jsonb_typeof(h) AS t
      WHERE t IS NULL OR t = 'null' OR (octet_length(h::text) <= {header_bytes} AND t = 'object')
        OR {fn_check_headers}(octet_length(h::text), t) IS NULL;
    END IF;
    -- A batch the ring visibly has no room for is refused whole, before any of it is written.
    IF {room} < v_n THEN
      PERFORM {fn_check_send}(-v_n, 0, 0, false);
    END IF;
    v_ids := {fn_push_array}(p_bodies, v_texts, p_ttl_ms);
    -- What the ring took stays sent (an error now would leave its positions as holes): a body
    -- it did not take answers NULL, to be sent again. Refused outright only when none was taken.
    IF NOT EXISTS (SELECT 1 FROM unnest(v_ids) i WHERE i > 0) THEN
      PERFORM {fn_check_send}(-v_n, 0, 0, false);
    END IF;
  END IF;
  RETURN QUERY SELECT CASE WHEN i > 0 THEN i END FROM unnest(v_ids) WITH ORDINALITY u(i, o) ORDER BY o;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_check_send}(p_n int, p_delay_ms bigint, p_ttl_ms bigint, p_null boolean)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  -- send's and send_batch's refusals, each naming the argument and the fix (p_n < 0: the ring
  -- took none of -p_n messages).
  IF p_n < 0 THEN
    RAISE EXCEPTION 'dbq: queue {queue} is full: its ring holds % messages (spec.ring.size); none of % was sent',
      (SELECT g.size FROM {gens} g ORDER BY g.first_pos DESC LIMIT 1), -p_n USING ERRCODE = '53400', HINT = 'consume faster, send later, or give the Queue a larger spec.ring.size';
  END IF;
  IF p_null THEN
    RAISE EXCEPTION 'dbq: send to queue {queue}: a body must not be NULL (send an empty bytea instead)'
      USING ERRCODE = '22004';
  END IF;
  IF p_delay_ms IS NULL OR p_delay_ms < 0 THEN
    RAISE EXCEPTION 'dbq: send to queue {queue}: delay_ms must be 0 or more, not %', p_delay_ms USING ERRCODE = '22023';
  END IF;
  IF p_ttl_ms IS NULL OR p_ttl_ms < 0 THEN
    RAISE EXCEPTION 'dbq: send to queue {queue}: ttl_ms must be 0 (no expiry) or more, not %', p_ttl_ms
      USING ERRCODE = '22023';
  END IF;
END $fn$
--;;
-- By id, with no lease asked (version 22 on): what a worker that keeps ids, not leases, calls
-- (PGMQ's delete, archive and set_vt). A message is found by its id without a scan: in its ring
-- slot (found from its generation) or by the spill table's key. Ready, delayed or leased alike; a lease held
-- on it is lost. An id not there (never sent, or ended already) is left out of the answer.
CREATE OR REPLACE FUNCTION {fn_delete}(p_ids bigint[])
RETURNS TABLE (msg_id bigint)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
#variable_conflict use_column
DECLARE v_ids bigint[] := coalesce(p_ids, '{}'::bigint[]); v_ring bigint[]; v_spill bigint[]; v_leased bigint;
BEGIN
  -- Ends each message as ack does: counted as popped, kept in the archive with spec.archive. A
  -- batch in two statements, the ring's then the spill table's (a message a nack moves there
  -- meanwhile is seen by the second); a body in {content} leaves with its message.
  WITH locked AS (
    SELECT r.slot, r.state AS was FROM {ring} r JOIN (SELECT DISTINCT unnest(v_ids) AS id) d
      ON r.slot = {slot_of:d.id} AND r.msg_id = d.id
    WHERE r.state IN (1, 2) FOR UPDATE OF r),
  gone AS (
    UPDATE {ring} r SET state = 0 FROM locked l WHERE r.slot = l.slot
    RETURNING r.msg_id, l.was, r.attempts, r.pushed_at, r.body, r.headers),
  unkept AS (
    DELETE FROM {content} c USING gone g WHERE g.body IS NULL AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id
    RETURNING c.msg_id, c.body)
  -- if archive
  , kept AS (
    INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT g.msg_id, g.attempts, g.pushed_at, clock_timestamp(), coalesce(g.body, u.body), g.headers
    FROM gone g LEFT JOIN unkept u ON u.msg_id = g.msg_id)
  -- end if
  SELECT array_agg(g.msg_id), count(*) FILTER (WHERE g.was = 2) INTO v_ring, v_leased FROM gone g;
  IF coalesce(cardinality(v_ring), 0) < cardinality(v_ids) THEN  -- not all in the ring: the spill table
    WITH gone AS (
      DELETE FROM {spill} s USING (SELECT DISTINCT unnest(v_ids) AS id) d WHERE s.msg_id = d.id
      RETURNING s.msg_id, s.state AS was, s.attempts, s.pushed_at, s.body, s.headers),
    unkept AS (
      DELETE FROM {content} c USING gone g WHERE g.body IS NULL AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id
      RETURNING c.msg_id, c.body)
    -- if archive
    , kept AS (
      INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT g.msg_id, g.attempts, g.pushed_at, clock_timestamp(), coalesce(g.body, u.body), g.headers
      FROM gone g LEFT JOIN unkept u ON u.msg_id = g.msg_id)
    -- end if
    SELECT array_agg(g.msg_id), v_leased + count(*) FILTER (WHERE g.was = 2) INTO v_spill, v_leased FROM gone g;
  END IF;
  v_ids := v_ring || v_spill;
  PERFORM nextval('{n_popped}') FROM unnest(v_ids);
  PERFORM nextval('{n_settled}') FROM generate_series(1, v_leased);  -- the leases it ended
  -- if archive
  PERFORM nextval('{n_archived}') FROM unnest(v_ids);
  -- end if
  IF cardinality(p_ids) = 1 THEN
    RETURN QUERY SELECT unnest(v_ids);
    RETURN;
  END IF;
  RETURN QUERY SELECT d.id FROM (  -- in the order asked, each once
    SELECT u.id, min(u.i) AS i FROM unnest(p_ids) WITH ORDINALITY u(id, i) GROUP BY u.id) d
  WHERE d.id = ANY (v_ids) ORDER BY d.i;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_archive}(p_ids bigint[])
RETURNS TABLE (msg_id bigint)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
BEGIN
  -- delete, for a queue that keeps an archive; refused for one that does not, where nothing would
  -- ever remove the copies.
  -- if archive
  RETURN QUERY SELECT d.msg_id FROM {fn_delete}(p_ids) d;
  -- else
  RAISE EXCEPTION 'dbq: queue {queue} keeps no archive: nothing archived' USING ERRCODE = '55000',
    HINT = 'set spec.archive.enabled: true on the Queue (and a retention), or delete the messages instead';
  -- end if
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_set_vt}(p_ids bigint[], p_visibility_ms bigint)
RETURNS TABLE (msg_id bigint, lease bigint, attempts int, enqueued_at timestamptz, visible_at timestamptz,
  headers jsonb, body bytea)
LANGUAGE plpgsql {definer} {plan_once} AS $fn$
#variable_conflict use_column
DECLARE v_id bigint; v_state smallint; v_visible timestamptz;
BEGIN
  -- Each message visible again p_visibility_ms from now, and not before, whatever it was; its
  -- attempts stay. One that must wait leaves ring order for the spill table, as a nacked one does
  -- (a ready one asked for 0 ms stays where it is). Answers the messages as read does, with no lease.
  IF p_visibility_ms IS NULL OR p_visibility_ms < 0 THEN
    RAISE EXCEPTION 'dbq: set_vt on queue {queue}: visibility_ms must be 0 or more, not %', p_visibility_ms
      USING ERRCODE = '22023';
  END IF;
  v_visible := clock_timestamp() + p_visibility_ms * interval '1 millisecond';
  FOREACH v_id IN ARRAY coalesce(p_ids, '{}'::bigint[]) LOOP
    SELECT r.state INTO v_state FROM {ring} r
    WHERE r.slot = {slot_of:v_id} AND r.msg_id = v_id AND r.state IN (1, 2) FOR UPDATE;
    IF FOUND AND v_state = 1 AND p_visibility_ms = 0 THEN
      RETURN QUERY SELECT r.msg_id, NULL::bigint, r.attempts, r.pushed_at, v_visible, r.headers::jsonb,
        coalesce(r.body, {fn_body_of}(v_id, false))
      FROM {ring} r WHERE r.slot = {slot_of:v_id};
      CONTINUE;
    ELSIF FOUND THEN
      INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
      SELECT r.msg_id, 1, 0, r.attempts, r.pushed_at, v_visible, r.expires_at, r.body, r.headers
      FROM {ring} r WHERE r.slot = {slot_of:v_id};
      UPDATE {ring} r SET state = 0 WHERE r.slot = {slot_of:v_id};
    ELSE
      SELECT s.state INTO v_state FROM {spill} s WHERE s.msg_id = v_id FOR UPDATE;
      CONTINUE WHEN NOT FOUND;
      UPDATE {spill} s SET state = 1, lease = 0, visible_at = v_visible WHERE s.msg_id = v_id;
    END IF;
    IF v_state = 2 THEN PERFORM nextval('{n_settled}'); END IF;  -- its lease ended
    RETURN QUERY SELECT s.msg_id, NULL::bigint, s.attempts, s.pushed_at, s.visible_at, s.headers::jsonb,
      coalesce(s.body, {fn_body_of}(v_id, false))
    FROM {spill} s WHERE s.msg_id = v_id;
  END LOOP;
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_purge}(OUT o_purged bigint)
LANGUAGE plpgsql {definer} AS $fn$
DECLARE v_popped bigint := {last_popped}; v_leased bigint; v_n bigint;
BEGIN
  -- Every message ended at once, ready, delayed or leased (a lease held is lost), as PGMQ's
  -- purge_queue does (version 23 on); counted as popped, none archived. A ring position not
  -- drawn yet becomes void, so the reader that draws it moves on. A push that commits after
  -- this is kept.
  WITH locked AS (
    SELECT r.slot, r.state AS was FROM {ring} r WHERE r.state IN (1, 2) FOR UPDATE),
  gone AS (
    UPDATE {ring} r SET state = 0 FROM locked l WHERE r.slot = l.slot
    RETURNING r.msg_id, l.was, r.body IS NULL AS big),
  unkept AS (
    DELETE FROM {content} c USING gone g WHERE g.big AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id),
  voided AS (
    INSERT INTO {gap} (pos, reason) SELECT g.msg_id, 'void' FROM gone g WHERE g.msg_id > v_popped
    ON CONFLICT (pos) DO NOTHING)
  SELECT count(*), count(*) FILTER (WHERE g.was = 2) INTO o_purged, v_leased FROM gone g;
  WITH gone AS (
    DELETE FROM {spill} s RETURNING s.msg_id, s.state AS was, s.body IS NULL AS big),
  unkept AS (
    DELETE FROM {content} c USING gone g WHERE g.big AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id)
  SELECT count(*), v_leased + count(*) FILTER (WHERE g.was = 2) INTO v_n, v_leased FROM gone g;
  o_purged := o_purged + v_n;
  PERFORM nextval('{n_popped}') FROM generate_series(1, o_purged);
  PERFORM nextval('{n_settled}') FROM generate_series(1, v_leased);
END $fn$
--;;
-- What a login may read of the queue goes through routines too, so no login needs a grant on
-- a table: the metadata a client reads when it connects, the waiting messages (peek), the
-- statistics history, dead letters and the archive; and a consumer's wait mark.
CREATE OR REPLACE FUNCTION {fn_describe}(OUT o_version int, OUT o_size bigint, OUT o_message_bytes int,
  OUT o_dead_letter_queue text, OUT o_header_bytes int, OUT o_max_headers int, OUT o_max_body_bytes int)
-- PL/pgSQL: its query is planned at the first call, once the plan has added the metadata
-- columns it reads (an upgrade adds them after the routines are made).
LANGUAGE plpgsql STABLE {definer} AS $fn$
BEGIN
  SELECT schema_version, ring_size, message_bytes, dead_letter_queue, header_bytes, max_headers, max_body_bytes
  INTO o_version, o_size, o_message_bytes, o_dead_letter_queue, o_header_bytes, o_max_headers, o_max_body_bytes
  FROM {meta} WHERE queue = {queue_literal};
END $fn$
--;;
CREATE OR REPLACE FUNCTION {fn_wait}(p_seconds int) RETURNS void
-- A consumer is about to wait: pushes notify {channel} until p_seconds from now.
LANGUAGE sql {definer} AS $fn$
  UPDATE {waiters} SET until = greatest(until, now() + p_seconds * interval '1 second') WHERE id = 1
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_peek}(p_max int)
RETURNS TABLE (msg_id bigint, body bytea, attempts int, headers text)
-- Up to p_max waiting messages (written, visible, not expired, not leased) in id order, none taken.
LANGUAGE sql STABLE {definer} AS $fn$
  SELECT w.msg_id,
    coalesce(w.body, (SELECT c.body FROM {content} c WHERE c.bucket = w.msg_id % {buckets} AND c.msg_id = w.msg_id)),
    w.attempts, w.headers
  FROM (
    SELECT r.msg_id, r.body, r.attempts, r.headers FROM {ring} r WHERE r.state = 1
      AND (r.visible_at IS NULL OR r.visible_at <= now()) AND (r.expires_at IS NULL OR r.expires_at > now())
    UNION ALL
    SELECT s.msg_id, s.body, s.attempts, s.headers FROM {spill} s WHERE s.state = 1
      AND (s.visible_at IS NULL OR s.visible_at <= now()) AND (s.expires_at IS NULL OR s.expires_at > now())
  ) w ORDER BY w.msg_id LIMIT p_max
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_history}(p_since timestamptz, p_until timestamptz)
RETURNS TABLE (at_s float8, depth bigint, in_flight bigint, pushed bigint, popped bigint, acquired bigint,
  expired bigint, oldest_age_s float8)
-- The operator's statistics samples of this queue taken in [p_since, p_until), oldest first.
LANGUAGE sql STABLE {definer} AS $fn$
  SELECT extract(epoch FROM h.at)::float8, h.depth, h.in_flight, h.pushed, h.popped, h.acquired, h.expired,
    h.oldest_age_s
  FROM {history} h WHERE h.queue = {queue_literal} AND h.at >= p_since AND h.at < p_until ORDER BY h.at
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_dead_letters}(p_held boolean, p_max int)
RETURNS TABLE (msg_id bigint, attempts int, error text, pushed_at_s float8, dead_at_s float8, body bytea,
  source text, headers text)
-- This queue's dead letters wherever they are kept ({dead}), or with p_held every dead letter its
-- own table keeps (other queues' too), in id order.
LANGUAGE sql STABLE {definer} AS $fn$
  SELECT d.msg_id, d.attempts, d.error, extract(epoch FROM d.pushed_at)::float8, extract(epoch FROM d.dead_at)::float8,
    d.body, d.source, d.headers
  FROM {dead} d WHERE NOT p_held AND d.source = {dead_source}
  UNION ALL
  SELECT o.msg_id, o.attempts, o.error, extract(epoch FROM o.pushed_at)::float8, extract(epoch FROM o.dead_at)::float8,
    o.body, o.source, o.headers
  FROM {own_dead} o WHERE p_held
  ORDER BY 1, 7 LIMIT p_max
$fn$
--;;
CREATE OR REPLACE FUNCTION {fn_archived}(p_since timestamptz, p_max int)
RETURNS TABLE (msg_id bigint, attempts int, pushed_at_s float8, acked_at_s float8, body bytea, headers text)
-- Archived messages acked or popped at or after p_since, oldest first.
LANGUAGE sql STABLE {definer} AS $fn$
  SELECT a.msg_id, a.attempts, extract(epoch FROM a.pushed_at)::float8, extract(epoch FROM a.acked_at)::float8,
    a.body, a.headers
  FROM {archive} a WHERE a.acked_at >= p_since ORDER BY a.acked_at, a.msg_id LIMIT p_max
$fn$
