-- A topic on PostgreSQL: its rows in the schema's topic tables, its counters, and its publish
-- routine, generated from its subscriptions (dbq.backends.topic_sql fills the placeholders: the
-- routes are one block per subscription, each with its compiled filter and its queue's push; the
-- body's dollar-quote tag is one its filters' values do not hold; the headers the filters name
-- are read into variables first, once per message).
--
-- publish(body, headers, subject, ttl_ms) -> 'subscription=id,...': in one transaction, a copy
-- of the message in the queue of every subscription whose filter matches it; none if one of
-- them is full and says onFull: Reject (SQLSTATE 53400). The copies keep the body and headers;
-- the subject travels in the headers (dbq-subject), put there by the client. A message no
-- subscription matched goes to the unrouted queue when the topic has one (its id under '').
-- Both first check that the rules they were made from are still in force (a change takes the
-- topic's lock exclusively, replaces them and moves the version on before it lets go).
-- publish_many does the same for several messages (bodies end to end, their lengths, a JSON
-- array of headers and one of subjects), one push_many per subscription, and answers each
-- message's copies, separated by ';'.
-- Both run as the schema's owner role ({definer}): a login calls them with the topic's publish
-- right alone, never with a right on the subscribers' queues.
CREATE SEQUENCE IF NOT EXISTS {n_published}
--;;
CREATE SEQUENCE IF NOT EXISTS {n_unrouted}
--;;
CREATE OR REPLACE FUNCTION {fn_publish}(p_body bytea, p_headers text, p_subject text, p_ttl_ms bigint, OUT o_ids text)
LANGUAGE plpgsql {definer} AS {tag}
DECLARE v_h jsonb := p_headers::jsonb; v_s text := p_subject; v_id bigint; v_ids text[] := '{}';
  v_m boolean[]; v_copies int; v_counted regclass[] := '{}'; v_c regclass; v_n bigint;
  {declare_reads}
BEGIN
{in_force}
{reads}
  v_m := {matches};  -- each subscription's filter, in one expression
  v_copies := cardinality(array_positions(v_m, true));
{rooms}
{routes}
  IF v_copies = 0 THEN
    v_n := nextval('{n_unrouted}');
-- if unrouted
    v_id := {unrouted_push}(p_body, p_ttl_ms, p_headers);
    IF v_id <= 0 THEN
      RAISE EXCEPTION 'dbq: queue {unrouted_queue} (unrouted messages) is full: nothing was published'
        USING ERRCODE = '53400';
    END IF;
    v_ids := v_ids || ('=' || v_id);
-- end if
  END IF;
  -- Counted once every copy is in (a Reject above raised before any count); assignments, not
  -- PERFORM: an expression runs without a query of its own.
  v_n := nextval('{n_published}');
  FOREACH v_c IN ARRAY v_counted LOOP
    v_n := nextval(v_c);
  END LOOP;
  o_ids := array_to_string(v_ids, ',');
END {tag}
--;;
CREATE OR REPLACE FUNCTION {fn_publish_many}(p_bodies bytea, p_lengths text, p_headers text, p_subjects text,
  p_ttl_ms bigint, OUT o_ids text)
LANGUAGE plpgsql {definer} AS {tag}
DECLARE v_bodies bytea[]; v_lengths int[]; v_headers text[]; v_subjects text[]; v_n int; v_i int; v_j int;
  v_h jsonb; v_s text; v_got text[]; v_out text[]; v_m boolean[]; v_unmatched int[] := '{}'; v_c bigint;
  v_hits int[] := '{}';
  {declare_reads}
{declare_many}
BEGIN
{in_force}
  SELECT array_agg(substring(coalesce(p_bodies, '') FROM (e - n + 1)::int FOR n) ORDER BY i), array_agg(n ORDER BY i)
  INTO v_bodies, v_lengths
  FROM (SELECT i, n, sum(n) OVER (ORDER BY i) AS e
        FROM unnest(string_to_array(p_lengths, ',')::int[]) WITH ORDINALITY AS x(n, i)) s;
  v_n := coalesce(cardinality(v_bodies), 0);
  IF p_headers IS NOT NULL THEN
    SELECT array_agg(CASE WHEN json_typeof(e) = 'null' THEN NULL ELSE e::text END ORDER BY i) INTO v_headers
    FROM json_array_elements(p_headers::json) WITH ORDINALITY AS x(e, i);
  END IF;
  IF p_subjects IS NOT NULL THEN
    SELECT array_agg(e ORDER BY i) INTO v_subjects FROM json_array_elements_text(p_subjects::json) WITH ORDINALITY AS x(e, i);
  END IF;
  v_out := array_fill(''::text, ARRAY[v_n]);
  FOR v_i IN 1..v_n LOOP
    v_h := v_headers[v_i]::jsonb;
    v_s := v_subjects[v_i];
{reads_many}
    v_m := {matches};
{picks}
    IF NOT true = ANY (v_m) THEN v_unmatched := v_unmatched || v_i; END IF;
    v_hits := v_hits || array_positions(v_m, true);  -- the routes with copies to make
  END LOOP;
{rooms_many}
{routes_many}
  FOR v_j IN 1..cardinality(v_unmatched) LOOP v_c := nextval('{n_unrouted}'); END LOOP;
-- if unrouted
  IF cardinality(v_unmatched) > 0 THEN
    v_got := string_to_array({unrouted_push_many}(
      (SELECT string_agg(v_bodies[k], ''::bytea ORDER BY o) FROM unnest(v_unmatched) WITH ORDINALITY u(k, o)),
      (SELECT string_agg(v_lengths[k]::text, ',' ORDER BY o) FROM unnest(v_unmatched) WITH ORDINALITY u(k, o)),
      p_ttl_ms,
      (SELECT CASE WHEN v_headers IS NULL THEN NULL ELSE '[' || string_agg(coalesce(v_headers[k], 'null'), ',' ORDER BY o) || ']' END
       FROM unnest(v_unmatched) WITH ORDINALITY u(k, o))), ',');
    FOR v_j IN 1..cardinality(v_unmatched) LOOP
      IF v_got[v_j]::bigint <= 0 THEN
        RAISE EXCEPTION 'dbq: queue {unrouted_queue} (unrouted messages) is full: nothing was published'
          USING ERRCODE = '53400';
      END IF;
      v_out[v_unmatched[v_j]] := v_out[v_unmatched[v_j]] || '=' || v_got[v_j];
    END LOOP;
  END IF;
-- end if
  FOR v_j IN 1..v_n LOOP v_c := nextval('{n_published}'); END LOOP;
{counts_many}
  o_ids := array_to_string(v_out, ';');
END {tag}
