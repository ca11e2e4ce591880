-- The topics of a schema and their subscriptions, as their publish routines route them (one row
-- per topic, one per subscription; dbq.backends.topic_sql writes them with each change).
CREATE TABLE IF NOT EXISTS {topics} (
  topic text PRIMARY KEY,
  schema_version int NOT NULL,
  rules_version bigint NOT NULL DEFAULT 0,
  unrouted text
)
--;;
CREATE TABLE IF NOT EXISTS {subscriptions} (
  topic text NOT NULL,
  subscription text NOT NULL,
  ordinal int NOT NULL,
  queue text NOT NULL,
  filter jsonb NOT NULL,
  on_full text NOT NULL,
  label text,  -- the Subscription's name, when it is not `subscription`
  PRIMARY KEY (topic, subscription)
)
--;;
ALTER TABLE {subscriptions} ADD COLUMN IF NOT EXISTS label text
