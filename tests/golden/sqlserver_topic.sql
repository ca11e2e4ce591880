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
IF OBJECT_ID(N'[shopq].[dbq_topics]', N'U') IS NULL
CREATE TABLE [shopq].[dbq_topics] (
  topic nvarchar(128) NOT NULL PRIMARY KEY,
  schema_version int NOT NULL,
  rules_version bigint NOT NULL DEFAULT 0,
  unrouted nvarchar(300) NULL
)
--;;
IF OBJECT_ID(N'[shopq].[dbq_subscriptions]', N'U') IS NULL
CREATE TABLE [shopq].[dbq_subscriptions] (
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
IF OBJECT_ID(N'[shopq].[orders_n_published]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_n_published] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_n_unrouted]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_n_unrouted] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_s1_routed]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_s1_routed] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_s1_dropped]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_s1_dropped] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_s2_routed]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_s2_routed] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_s2_dropped]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_s2_dropped] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_s3_routed]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_s3_routed] AS bigint START WITH 1
--;;
IF OBJECT_ID(N'[shopq].[orders_s3_dropped]', N'SO') IS NULL CREATE SEQUENCE [shopq].[orders_s3_dropped] AS bigint START WITH 1
--;;
CREATE OR ALTER PROCEDURE [shopq].[orders_publish] @body varbinary(max), @headers nvarchar(max), @subject nvarchar(256),
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
  SELECT 1, CASE WHEN (EXISTS (SELECT 1 FROM OPENJSON(@headers) AS j WHERE j.[key] = N'region' AND ((j.[type] = 1 AND CAST(j.[value] AS varbinary(max)) = CAST(N'de' AS varbinary(max))) OR (j.[type] = 1 AND CAST(j.[value] AS varbinary(max)) = CAST(N'it''s' AS varbinary(max)))))) THEN 1 ELSE 0 END
  UNION ALL
  SELECT 2, CASE WHEN (EXISTS (SELECT 1 FROM OPENJSON(@headers) AS j WHERE j.[key] = N'amount' AND j.[type] = 2 AND TRY_CAST(j.[value] AS float) >= TRY_CAST(N'1000' AS float))) AND (EXISTS (SELECT 1 FROM OPENJSON(@headers) AS j WHERE j.[key] = N'vip' AND (j.[type] = 3 AND j.[value] = N'true'))) THEN 1 ELSE 0 END
  UNION ALL
  SELECT 3, CASE WHEN (@subject IS NOT NULL AND SUBSTRING(CAST(@subject AS varbinary(max)), 1, 12) = CAST(N'order.' AS varbinary(max))) THEN 1 ELSE 0 END;
  SET @copies = (SELECT COUNT(*) FROM @m WHERE matched = 1);
  BEGIN TRANSACTION;
  -- The rules this procedure was made from must still be in force: a change takes this lock
  -- exclusively and moves the version on before it lets go.
  EXEC @lock = sp_getapplock @Resource = N'dbq-topic:shopq.orders', @LockMode = N'Shared', @LockOwner = N'Transaction',
    @LockTimeout = 10000;
  IF @lock < 0
    THROW 51213, N'dbq: the subscriptions of topic orders are being changed: publish again', 1;
  IF NOT EXISTS (SELECT 1 FROM [shopq].[dbq_topics] WHERE topic = N'orders' AND rules_version = 7)
    THROW 51213, N'dbq: the subscriptions of topic orders changed while publishing: publish again', 1;
  -- Reject: a full queue refuses the message before any queue draws a position for it.
  IF @copies > 1 AND EXISTS (SELECT 1 FROM @m WHERE route = 1 AND matched = 1)
    AND (1000 - (SELECT SUM(CASE WHEN object_id = OBJECT_ID(N'[shopq].[eu_push_seq]') THEN 1 ELSE -1 END * CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END) FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[eu_push_seq]'), OBJECT_ID(N'[shopq].[eu_pop_seq]')))) < 1
    THROW 51400, N'dbq: queue shopq.eu of subscription eu-orders is full: nothing was published', 1;
  -- Reject: a full queue refuses the message before any queue draws a position for it.
  IF @copies > 1 AND EXISTS (SELECT 1 FROM @m WHERE route = 3 AND matched = 1)
    AND (1000 - (SELECT SUM(CASE WHEN object_id = OBJECT_ID(N'[shopq].[all_push_seq]') THEN 1 ELSE -1 END * CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END) FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[all_push_seq]'), OBJECT_ID(N'[shopq].[all_pop_seq]')))) < 1
    THROW 51400, N'dbq: queue shopq.all of subscription all is full: nothing was published', 1;
  IF EXISTS (SELECT 1 FROM @m WHERE route = 1 AND matched = 1) BEGIN  -- eu-orders -> shopq.eu
    DELETE FROM @got;
    INSERT INTO @got (id) EXEC [shopq].[eu_push] @body, @ttl_ms, @headers;
    SET @id = (SELECT TOP (1) id FROM @got);
    IF @id > 0 BEGIN
      SET @ids = @ids + N'eu-orders=' + CAST(@id AS nvarchar(20)) + N',';
      SET @n = NEXT VALUE FOR [shopq].[orders_s1_routed];
    END ELSE BEGIN
      THROW 51400, N'dbq: queue shopq.eu of subscription eu-orders is full: nothing was published', 1;
    END;
  END;
  IF EXISTS (SELECT 1 FROM @m WHERE route = 2 AND matched = 1) BEGIN  -- big -> shopq.big
    DELETE FROM @got;
    INSERT INTO @got (id) EXEC [shopq].[big_push] @body, @ttl_ms, @headers;
    SET @id = (SELECT TOP (1) id FROM @got);
    IF @id > 0 BEGIN
      SET @ids = @ids + N'big=' + CAST(@id AS nvarchar(20)) + N',';
      SET @n = NEXT VALUE FOR [shopq].[orders_s2_routed];
    END ELSE BEGIN
      SET @n = NEXT VALUE FOR [shopq].[orders_s2_dropped];
    END;
  END;
  IF EXISTS (SELECT 1 FROM @m WHERE route = 3 AND matched = 1) BEGIN  -- all -> shopq.all
    DELETE FROM @got;
    INSERT INTO @got (id) EXEC [shopq].[all_push] @body, @ttl_ms, @headers;
    SET @id = (SELECT TOP (1) id FROM @got);
    IF @id > 0 BEGIN
      SET @ids = @ids + N'all=' + CAST(@id AS nvarchar(20)) + N',';
      SET @n = NEXT VALUE FOR [shopq].[orders_s3_routed];
    END ELSE BEGIN
      THROW 51400, N'dbq: queue shopq.all of subscription all is full: nothing was published', 1;
    END;
  END;
  IF @copies = 0 BEGIN
    SET @n = NEXT VALUE FOR [shopq].[orders_n_unrouted];
    DELETE FROM @got;
    INSERT INTO @got (id) EXEC [shopq].[rest_push] @body, @ttl_ms, @headers;
    SET @id = (SELECT TOP (1) id FROM @got);
    IF @id IS NULL OR @id <= 0
      THROW 51400, N'dbq: queue shopq.rest (unrouted messages) is full: nothing was published', 1;
    SET @ids = @ids + N'=' + CAST(@id AS nvarchar(20)) + N',';
  END;
  SET @n = NEXT VALUE FOR [shopq].[orders_n_published];  -- counted once every copy is in
  COMMIT TRANSACTION;
  SELECT CASE WHEN @ids = N'' THEN N'' ELSE LEFT(@ids, LEN(@ids) - 1) END AS o_ids;
END
--;;
MERGE [shopq].[dbq_topics] WITH (HOLDLOCK) AS t USING (SELECT ? AS topic) AS s ON t.topic = s.topic WHEN MATCHED THEN UPDATE SET rules_version = ?, unrouted = ? WHEN NOT MATCHED THEN INSERT (topic, schema_version, rules_version, unrouted) VALUES (s.topic, 1, ?, ?); -- ['orders', 7, 'shopq.rest', 7, 'shopq.rest']
--;;
DELETE FROM [shopq].[dbq_subscriptions] WHERE topic = ? -- ['orders']
--;;
INSERT INTO [shopq].[dbq_subscriptions] (topic, subscription, ordinal, queue, filter, on_full, label) VALUES (?, ?, ?, ?, ?, ?, ?) -- ['orders', 'eu_orders', 1, 'shopq.eu', '{"subject": [], "headers": [{"key": "region", "in": ["de", "it\'s"]}]}', 'Reject', 'eu-orders']
--;;
INSERT INTO [shopq].[dbq_subscriptions] (topic, subscription, ordinal, queue, filter, on_full, label) VALUES (?, ?, ?, ?, ?, ?, ?) -- ['orders', 'big', 2, 'shopq.big', '{"subject": [], "headers": [{"key": "amount", "gte": 1000}, {"key": "vip", "is": true}]}', 'Drop', None]
--;;
INSERT INTO [shopq].[dbq_subscriptions] (topic, subscription, ordinal, queue, filter, on_full, label) VALUES (?, ?, ?, ?, ?, ?, ?) -- ['orders', 'all', 3, 'shopq.all', '{"subject": [{"prefix": "order."}], "headers": []}', 'Reject', None]
--;;
DROP PROCEDURE IF EXISTS [shopq].[orders_publish]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_n_published]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_n_unrouted]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_s1_routed]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_s1_dropped]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_s2_routed]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_s2_dropped]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_s3_routed]
--;;
DROP SEQUENCE IF EXISTS [shopq].[orders_s3_dropped]
--;;
IF OBJECT_ID(N'[shopq].[dbq_subscriptions]', N'U') IS NOT NULL DELETE FROM [shopq].[dbq_subscriptions] WHERE topic = N'orders'
--;;
IF OBJECT_ID(N'[shopq].[dbq_topics]', N'U') IS NOT NULL DELETE FROM [shopq].[dbq_topics] WHERE topic = N'orders'
