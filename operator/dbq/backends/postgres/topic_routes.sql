-- The blocks of a topic's routines written once per subscription (dbq.backends.topic_sql):
-- each starts at its `-- block:` line and ends before the next. The route's placeholders: its
-- place among the routes (v_m[index] says whether its filter matched), its queue's push and
-- push_many routines, its subscription name (text and literal), its number, its queue, its
-- counters, and the free slots of its ring (blocks `room` are written for Reject routes).
-- block: room
  -- Reject: a full queue refuses the message before any queue draws a position for it (a
  -- position drawn in a transaction that rolls back is a hole its consumers wait on). Made only
  -- with more than one copy to make: a push into a full ring draws nothing. (Nested: a
  -- condition with a query runs the executor even when the first part says no.)
  IF v_m[{index}] THEN
    IF {free} < 1 THEN
      RAISE EXCEPTION 'dbq: queue {queue} of subscription {subscription} is full: nothing was published'
        USING ERRCODE = '53400';
    END IF;
  END IF;
-- block: publish
  IF v_m[{index}] THEN  -- subscription {subscription} -> {queue}
    v_id := {push}(p_body, p_ttl_ms, p_headers);
    IF v_id > 0 THEN
      v_ids := v_ids || ({subscription_text} || v_id);
      v_counted := v_counted || '{n_routed}'::regclass;
    ELSE
-- if reject
      RAISE EXCEPTION 'dbq: queue {queue} of subscription {subscription} is full: nothing was published'
        USING ERRCODE = '53400';
-- else
      v_counted := v_counted || '{n_dropped}'::regclass;
-- end if
    END IF;
  END IF;
-- block: pick
    IF v_m[{index}] THEN v_pick_{ordinal} := v_pick_{ordinal} || v_i; END IF;
-- block: declare_many
  v_pick_{ordinal} int[] := '{}'; v_routed_{ordinal} int := 0; v_dropped_{ordinal} int := 0;
-- block: room_many
  IF cardinality(v_pick_{ordinal}) > 0 THEN  -- nested: the query runs only for a route with copies
    IF {free} < cardinality(v_pick_{ordinal}) THEN
      RAISE EXCEPTION 'dbq: queue {queue} of subscription {subscription} is full: nothing was published'
        USING ERRCODE = '53400';
    END IF;
  END IF;
-- block: publish_many
  -- subscription {subscription} -> {queue}: its messages in one push_many (the batch as it came
  -- when every message matched; one alone in a push, which costs a third of a push_many of one)
  IF cardinality(v_pick_{ordinal}) = 1 THEN
    v_got := ARRAY[{push}(v_bodies[v_pick_{ordinal}[1]], p_ttl_ms, v_headers[v_pick_{ordinal}[1]])::text];
  ELSIF cardinality(v_pick_{ordinal}) = v_n THEN
    v_got := string_to_array({push_many}(p_bodies, p_lengths, p_ttl_ms, p_headers), ',');
  ELSIF cardinality(v_pick_{ordinal}) > 1 THEN
    v_got := string_to_array({push_many}(
      (SELECT string_agg(v_bodies[k], ''::bytea ORDER BY o) FROM unnest(v_pick_{ordinal}) WITH ORDINALITY u(k, o)),
      (SELECT string_agg(v_lengths[k]::text, ',' ORDER BY o) FROM unnest(v_pick_{ordinal}) WITH ORDINALITY u(k, o)),
      p_ttl_ms,
      (SELECT CASE WHEN v_headers IS NULL THEN NULL ELSE '[' || string_agg(coalesce(v_headers[k], 'null'), ',' ORDER BY o) || ']' END
       FROM unnest(v_pick_{ordinal}) WITH ORDINALITY u(k, o))), ',');
  END IF;
  IF cardinality(v_pick_{ordinal}) > 0 THEN
    -- A copy's id, or -1 where the queue was full; added to each message's answer in one statement.
    SELECT count(*) FILTER (WHERE g::bigint > 0), count(*) FILTER (WHERE g::bigint <= 0)
    INTO v_routed_{ordinal}, v_dropped_{ordinal} FROM unnest(v_got) g;
-- if reject
    IF v_dropped_{ordinal} > 0 THEN
      RAISE EXCEPTION 'dbq: queue {queue} of subscription {subscription} is full: nothing was published'
        USING ERRCODE = '53400';
    END IF;
-- end if
    v_out := ARRAY(
      SELECT CASE WHEN p.g::bigint > 0 THEN x.o || {subscription_text} || p.g || ',' ELSE x.o END
      FROM unnest(v_out) WITH ORDINALITY AS x(o, i) LEFT JOIN unnest(v_pick_{ordinal}, v_got) AS p(k, g) ON p.k = x.i
      ORDER BY x.i);
  END IF;
-- block: count_many
  FOR v_j IN 1..v_routed_{ordinal} LOOP v_c := nextval('{n_routed}'); END LOOP;
  FOR v_j IN 1..v_dropped_{ordinal} LOOP v_c := nextval('{n_dropped}'); END LOOP;
