-- A topic on PostgreSQL: its rows in the schema's topic tables, its counters, and its publish
-- routine, generated from its subscriptions (dbq.backends.topic_sql fills the placeholders: the
-- routes are one block per subscription, each with its compiled filter and its queue's push; the
-- body's dollar-quote tag is one its filters' values do not hold).
--
-- publish(body, headers, subject, ttl_ms) -> 'subscription=id,...': in one transaction, a copy
-- of the message in the queue of every subscription whose filter matches it; none if one of
-- them is full and says onFull: Reject (SQLSTATE 53400). The copies keep the body and headers;
-- the subject travels in the headers (dbq-subject), put there by the client.
CREATE SEQUENCE IF NOT EXISTS {n_published}
--;;
CREATE SEQUENCE IF NOT EXISTS {n_unrouted}
--;;
CREATE OR REPLACE FUNCTION {fn_publish}(p_body bytea, p_headers text, p_subject text, p_ttl_ms bigint, OUT o_ids text)
LANGUAGE plpgsql AS {tag}
DECLARE v_h jsonb := p_headers::jsonb; v_id bigint; v_ids text[] := '{}'; v_matched boolean := false;
  v_routed int[] := '{}'; v_dropped int[] := '{}';
BEGIN
  -- The rules this routine was made from must still be in force: a change takes this lock
  -- exclusively, and moves the version on before it lets go.
  PERFORM pg_advisory_xact_lock_shared(hashtext({lock}));
  IF (SELECT rules_version FROM {topics} WHERE topic = {topic}) IS DISTINCT FROM {rules_version} THEN
    RAISE EXCEPTION 'dbq: the subscriptions of topic {topic_name} changed while publishing: publish again'
      USING ERRCODE = '40001';
  END IF;
{routes}
  IF NOT v_matched THEN
{unrouted}
  END IF;
  -- Counted once every copy is in (a Reject above raised before any count).
  PERFORM nextval('{n_published}');
{counts}
  o_ids := array_to_string(v_ids, ',');
END {tag}
