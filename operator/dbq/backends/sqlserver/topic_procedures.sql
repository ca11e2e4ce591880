-- A topic on SQL Server: its rows in the schema's topic tables, its counters, and its publish
-- procedure, generated from its subscriptions (dbq.backends.sqlserver.topic_sql fills the
-- placeholders; the routes are one block per subscription, from the `-- block:` parts below).
-- The same contract as PostgreSQL's (dbq.backends.postgres/topic_routines.sql):
--
-- EXEC publish @body, @headers, @subject, @ttl_ms -> one row, o_ids = 'subscription=id,...': in
-- one transaction, a copy of the message in the queue of every subscription whose filter
-- matches it; none if one of them is full and says onFull: Reject (error 51400). A publish made
-- while the subscriptions change waits for the change, and is refused (error 51213: publish
-- again) if the rules it was made from are no longer in force.
IF OBJECT_ID(N'{topics}', N'U') IS NULL
CREATE TABLE {topics} (
  topic nvarchar(128) NOT NULL PRIMARY KEY,
  schema_version int NOT NULL,
  rules_version bigint NOT NULL DEFAULT 0,
  unrouted nvarchar(300) NULL
)
--;;
IF OBJECT_ID(N'{subscriptions}', N'U') IS NULL
CREATE TABLE {subscriptions} (
  topic nvarchar(128) NOT NULL,
  subscription nvarchar(128) NOT NULL,
  ordinal int NOT NULL,
  queue nvarchar(300) NOT NULL,
  filter nvarchar(max) NOT NULL,
  on_full nvarchar(10) NOT NULL,
  label nvarchar(128) NULL,
  PRIMARY KEY (topic, subscription)
)
--;;
IF OBJECT_ID(N'{n_published}', N'SO') IS NULL CREATE SEQUENCE {n_published} AS bigint START WITH 1
--;;
IF OBJECT_ID(N'{n_unrouted}', N'SO') IS NULL CREATE SEQUENCE {n_unrouted} AS bigint START WITH 1
--;;
CREATE OR ALTER PROCEDURE {fn_publish} @body varbinary(max), @headers nvarchar(max), @subject nvarchar(256),
  @ttl_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  SET XACT_ABORT ON;  -- any error rolls the whole publish back
  DECLARE @ids nvarchar(max) = N'', @id bigint, @n bigint, @lock int, @copies int = 0;
  DECLARE @got TABLE (id bigint);
  DECLARE @m TABLE (route int PRIMARY KEY, matched bit NOT NULL);
  -- each subscription's filter, evaluated once (a SELECT: VALUES takes no subquery)
  INSERT INTO @m (route, matched)
{matches};
  SET @copies = (SELECT COUNT(*) FROM @m WHERE matched = 1);
  BEGIN TRANSACTION;
  -- The rules this procedure was made from must still be in force: a change takes this lock
  -- exclusively and moves the version on before it lets go.
  EXEC @lock = sp_getapplock @Resource = {lock}, @LockMode = N'Shared', @LockOwner = N'Transaction',
    @LockTimeout = 10000;
  IF @lock < 0
    THROW 51213, N'dbq: the subscriptions of topic {topic_name} are being changed: publish again', 1;
  IF NOT EXISTS (SELECT 1 FROM {topics} WHERE topic = {topic} AND rules_version = {rules_version})
    THROW 51213, N'dbq: the subscriptions of topic {topic_name} changed while publishing: publish again', 1;
{rooms}
{routes}
  IF @copies = 0 BEGIN
    SET @n = NEXT VALUE FOR {n_unrouted};
-- if unrouted
    DELETE FROM @got;
    INSERT INTO @got (id) EXEC {unrouted_push} @body, @ttl_ms, @headers;
    SET @id = (SELECT TOP (1) id FROM @got);
    IF @id IS NULL OR @id <= 0
      THROW 51400, N'dbq: queue {unrouted_queue} (unrouted messages) is full: nothing was published', 1;
    SET @ids = @ids + N'=' + CAST(@id AS nvarchar(20)) + N',';
-- end if
  END;
  SET @n = NEXT VALUE FOR {n_published};  -- counted once every copy is in
  COMMIT TRANSACTION;
  SELECT CASE WHEN @ids = N'' THEN N'' ELSE LEFT(@ids, LEN(@ids) - 1) END AS o_ids;
END
-- block: match
  SELECT {index}, CASE WHEN {predicate} THEN 1 ELSE 0 END
-- block: room
  -- Reject: a full queue refuses the message before any queue draws a position for it.
  IF @copies > 1 AND EXISTS (SELECT 1 FROM @m WHERE route = {index} AND matched = 1)
    AND {free} < 1
    THROW 51400, N'dbq: queue {queue} of subscription {subscription} is full: nothing was published', 1;
-- block: publish
  IF EXISTS (SELECT 1 FROM @m WHERE route = {index} AND matched = 1) BEGIN  -- {subscription} -> {queue}
    DELETE FROM @got;
    INSERT INTO @got (id) EXEC {push} @body, @ttl_ms, @headers;
    SET @id = (SELECT TOP (1) id FROM @got);
    IF @id > 0 BEGIN
      SET @ids = @ids + {subscription_text} + CAST(@id AS nvarchar(20)) + N',';
      SET @n = NEXT VALUE FOR {n_routed};
    END ELSE BEGIN
-- if reject
      THROW 51400, N'dbq: queue {queue} of subscription {subscription} is full: nothing was published', 1;
-- else
      SET @n = NEXT VALUE FOR {n_dropped};
-- end if
    END;
  END;
