-- step enable_broker 1
ALTER DATABASE CURRENT SET ENABLE_BROKER WITH NO_WAIT

-- step new_broker 1
ALTER DATABASE CURRENT SET NEW_BROKER WITH ROLLBACK IMMEDIATE

-- step set_trustworthy 1
ALTER DATABASE CURRENT SET TRUSTWORTHY ON

-- step create_schema 1
IF SCHEMA_ID(N'shopq') IS NULL EXEC(N'CREATE SCHEMA [shopq]')

-- step create_meta 1
IF OBJECT_ID(N'[shopq].[dbq_queues]', N'U') IS NULL
CREATE TABLE [shopq].[dbq_queues] (
  queue nvarchar(128) NOT NULL PRIMARY KEY,
  design nvarchar(16) NOT NULL,
  schema_version int NOT NULL,
  ring_size bigint NOT NULL,
  message_bytes int NOT NULL,
  max_attempts int NOT NULL DEFAULT 0,
  archive int NOT NULL DEFAULT 0,
  dead_letter_queue nvarchar(300) NOT NULL DEFAULT N'',
  header_bytes int NOT NULL DEFAULT 1024,
  max_headers int NOT NULL DEFAULT 32,
  max_body_bytes int NOT NULL DEFAULT 1048576,
  created_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME(),
  updated_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME())

-- step create_history 1
IF OBJECT_ID(N'[shopq].[dbq_stats_history]', N'U') IS NULL
CREATE TABLE [shopq].[dbq_stats_history] (
  queue nvarchar(128) NOT NULL,
  at datetime2(3) NOT NULL,
  depth bigint NOT NULL,
  in_flight bigint NOT NULL,
  pushed bigint NOT NULL,
  popped bigint NOT NULL,
  acquired bigint NOT NULL,
  expired bigint NOT NULL,
  oldest_age_s float NOT NULL,
  PRIMARY KEY CLUSTERED (queue, at))

-- step create_sequences 1
IF OBJECT_ID(N'[shopq].[orders_n_pushed]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_pushed] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

-- step create_sequences 2
IF OBJECT_ID(N'[shopq].[orders_n_popped]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_popped] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

-- step create_sequences 3
IF OBJECT_ID(N'[shopq].[orders_n_acquired]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_acquired] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

-- step create_sequences 4
IF OBJECT_ID(N'[shopq].[orders_n_settled]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_settled] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

-- step create_message_types 1
IF NOT EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'dbq/shopq/orders/message')
CREATE MESSAGE TYPE [dbq/shopq/orders/message] VALIDATION = NONE

-- step create_message_types 2
IF NOT EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'dbq/shopq/orders/tracer')
CREATE MESSAGE TYPE [dbq/shopq/orders/tracer] VALIDATION = NONE

-- step create_contract 1
IF NOT EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'dbq/shopq/orders/contract')
CREATE CONTRACT [dbq/shopq/orders/contract] ([dbq/shopq/orders/message] SENT BY INITIATOR, [dbq/shopq/orders/tracer] SENT BY INITIATOR)

-- step create_queue 1
IF OBJECT_ID(N'[shopq].[orders]', N'SQ') IS NULL
CREATE QUEUE [shopq].[orders] WITH STATUS = ON, RETENTION = OFF, ACTIVATION (STATUS = ON, PROCEDURE_NAME = [shopq].[handle_orders], MAX_QUEUE_READERS = 4, EXECUTE AS OWNER), POISON_MESSAGE_HANDLING (STATUS = ON)

-- step create_sender_queue 1
IF OBJECT_ID(N'[shopq].[orders_sender]', N'SQ') IS NULL
CREATE QUEUE [shopq].[orders_sender] WITH STATUS = ON, RETENTION = OFF, POISON_MESSAGE_HANDLING (STATUS = OFF)

-- step alter_queue 1
ALTER QUEUE [shopq].[orders] WITH ACTIVATION (STATUS = ON, PROCEDURE_NAME = [shopq].[handle_orders], MAX_QUEUE_READERS = 4, EXECUTE AS OWNER), POISON_MESSAGE_HANDLING (STATUS = ON)

-- step enable_queue 1
ALTER QUEUE [shopq].[orders] WITH STATUS = ON

-- step create_services 1
IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = N'dbq/shopq/orders')
  CREATE SERVICE [dbq/shopq/orders] ON QUEUE [shopq].[orders] ([dbq/shopq/orders/contract])
ELSE IF NOT EXISTS (SELECT 1 FROM sys.service_contract_usages cu
  JOIN sys.services s ON s.service_id = cu.service_id
  JOIN sys.service_contracts c ON c.service_contract_id = cu.service_contract_id
  WHERE s.name = N'dbq/shopq/orders' AND c.name = N'dbq/shopq/orders/contract')
  ALTER SERVICE [dbq/shopq/orders] (ADD CONTRACT [dbq/shopq/orders/contract])

-- step create_services 2
IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = N'dbq/shopq/orders/sender')
  CREATE SERVICE [dbq/shopq/orders/sender] ON QUEUE [shopq].[orders_sender]

-- step record_version 1
MERGE [shopq].[dbq_queues] WITH (HOLDLOCK) AS m
USING (SELECT N'orders' AS queue) AS s ON m.queue = s.queue
WHEN MATCHED THEN UPDATE SET schema_version = 2, updated_at = SYSUTCDATETIME()
WHEN NOT MATCHED THEN INSERT (queue, design, schema_version, ring_size, message_bytes)
  VALUES (s.queue, N'servicebroker', 2, 0, 0);

-- step secure 1
IF DATABASE_PRINCIPAL_ID(N'dbq_o_shopq_7bf52350') IS NULL CREATE ROLE [dbq_o_shopq_7bf52350]

-- step secure 2
IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_send') IS NULL CREATE ROLE [dbq_r_orders_16adecff_send] AUTHORIZATION [dbq_o_shopq_7bf52350]

-- step secure 3
IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_receive') IS NULL CREATE ROLE [dbq_r_orders_16adecff_receive] AUTHORIZATION [dbq_o_shopq_7bf52350]

-- step secure 4
IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_peek') IS NULL CREATE ROLE [dbq_r_orders_16adecff_peek] AUTHORIZATION [dbq_o_shopq_7bf52350]

-- step secure 5
IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_monitor') IS NULL CREATE ROLE [dbq_r_orders_16adecff_monitor] AUTHORIZATION [dbq_o_shopq_7bf52350]

-- step secure 6
IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_manage') IS NULL CREATE ROLE [dbq_r_orders_16adecff_manage] AUTHORIZATION [dbq_o_shopq_7bf52350]

-- step secure 7
ALTER AUTHORIZATION ON SCHEMA::[shopq] TO [dbq_o_shopq_7bf52350]

-- step secure 8
GRANT SEND ON SERVICE::[dbq/shopq/orders] TO [dbq_r_orders_16adecff_send]

-- step secure 9
GRANT RECEIVE ON [shopq].[orders_sender] TO [dbq_r_orders_16adecff_send]

-- step secure 10
GRANT REFERENCES ON CONTRACT::[dbq/shopq/orders/contract] TO [dbq_r_orders_16adecff_send]

-- step secure 11
GRANT RECEIVE ON [shopq].[orders] TO [dbq_r_orders_16adecff_receive]

-- step secure 12
GRANT SELECT ON [shopq].[orders] TO [dbq_r_orders_16adecff_peek]

-- step secure 13
GRANT SELECT ON OBJECT::[shopq].[dbq_queues] TO [dbq_r_orders_16adecff_send], [dbq_r_orders_16adecff_receive], [dbq_r_orders_16adecff_peek], [dbq_r_orders_16adecff_monitor], [dbq_r_orders_16adecff_manage]

-- step secure 14
GRANT SELECT ON OBJECT::[shopq].[dbq_stats_history] TO [dbq_r_orders_16adecff_monitor]

-- alter_queue without activation
IF EXISTS (SELECT 1 FROM sys.service_queues WHERE object_id = OBJECT_ID(N'[shopq].[orders]') AND activation_procedure IS NOT NULL)
  ALTER QUEUE [shopq].[orders] WITH ACTIVATION (DROP)
ALTER QUEUE [shopq].[orders] WITH POISON_MESSAGE_HANDLING (STATUS = ON)

-- observe
SET NOCOUNT ON;
SELECT d.is_broker_enabled, CAST(d.service_broker_guid AS nvarchar(36)),
  CASE WHEN EXISTS (SELECT 1 FROM sys.databases o WHERE o.service_broker_guid = d.service_broker_guid
    AND o.database_id <> d.database_id) THEN 1 ELSE 0 END,
  d.is_trustworthy_on,
  CAST(PARSENAME(CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)), 4) AS int),
  CASE WHEN SCHEMA_ID(N'shopq') IS NULL THEN 0 ELSE 1 END,
  d.compatibility_level,
  CASE WHEN OBJECT_ID(N'[shopq].[handle_orders]', N'P') IS NULL THEN 0 ELSE 1 END
FROM sys.databases d WHERE d.database_id = DB_ID();
SELECT name FROM sys.service_message_types WHERE name IN (N'dbq/shopq/orders/message', N'dbq/shopq/orders/tracer');
SELECT c.name, mt.name FROM sys.service_contracts c
  LEFT JOIN sys.service_contract_message_usages u ON u.service_contract_id = c.service_contract_id
  LEFT JOIN sys.service_message_types mt ON mt.message_type_id = u.message_type_id
WHERE c.name = N'dbq/shopq/orders/contract';
SELECT q.name, q.is_receive_enabled, q.is_enqueue_enabled, q.is_activation_enabled, q.activation_procedure,
  CASE WHEN q.activation_procedure IS NULL OR OBJECT_ID(q.activation_procedure) IS NOT NULL THEN 1 ELSE 0 END,
  q.max_readers,
  CASE q.execute_as_principal_id WHEN -2 THEN N'OWNER' ELSE USER_NAME(q.execute_as_principal_id) END,
  q.is_poison_message_handling_enabled, it.name,
  (SELECT ISNULL(SUM(p.rows), 0) FROM sys.partitions p WHERE p.object_id = it.object_id AND p.index_id = 1)
FROM sys.service_queues q LEFT JOIN sys.internal_tables it ON it.parent_object_id = q.object_id
WHERE q.schema_id = SCHEMA_ID(N'shopq') AND q.name IN (N'orders', N'orders_sender');
SELECT s.name, q.name,
  CASE WHEN EXISTS (SELECT 1 FROM sys.service_contract_usages cu JOIN sys.service_contracts c
    ON c.service_contract_id = cu.service_contract_id
    WHERE cu.service_id = s.service_id AND c.name = N'dbq/shopq/orders/contract') THEN 1 ELSE 0 END
FROM sys.services s JOIN sys.service_queues q ON q.object_id = s.service_queue_id
WHERE s.name IN (N'dbq/shopq/orders', N'dbq/shopq/orders/sender');
SELECT o.name FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(N'shopq')
  AND ((o.type = 'SO' AND o.name IN (N'orders_n_pushed', N'orders_n_popped', N'orders_n_acquired', N'orders_n_settled')) OR (o.type = 'U' AND o.name IN (N'dbq_queues', N'dbq_stats_history')));
IF OBJECT_ID(N'[shopq].[dbq_queues]', N'U') IS NOT NULL
BEGIN
  EXEC sys.sp_executesql N'SELECT schema_version FROM [shopq].[dbq_queues] WHERE queue = @queue',
    N'@queue nvarchar(128)', @queue = N'orders';
END
ELSE SELECT CAST(NULL AS int) WHERE 1 = 0;
SELECT ce.state, COUNT_BIG(*) FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id
WHERE s.name IN (N'dbq/shopq/orders', N'dbq/shopq/orders/sender') GROUP BY ce.state;
SELECT TOP (10) tq.to_service_name, tq.transmission_status, DATEDIFF_BIG(second, tq.enqueue_time, GETUTCDATE()),
  COUNT_BIG(*) OVER ()
FROM sys.transmission_queue tq
WHERE tq.from_service_name IN (N'dbq/shopq/orders', N'dbq/shopq/orders/sender') OR tq.to_service_name IN (N'dbq/shopq/orders', N'dbq/shopq/orders/sender')
ORDER BY CASE WHEN tq.transmission_status = N'' THEN 1 ELSE 0 END, tq.enqueue_time;
IF HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') = 1
BEGIN
  SELECT m.state, DATEDIFF_BIG(second, m.last_activated_time, GETUTCDATE()), m.tasks_waiting, 1
  FROM sys.dm_broker_queue_monitors m
  WHERE m.database_id = DB_ID() AND m.queue_id = OBJECT_ID(N'[shopq].[orders]');
END
ELSE SELECT N'', 0, 0, 0;

-- cleanup
SET NOCOUNT ON;
DECLARE @stalled int = ?, @batch int = ?, @h uniqueidentifier, @replies int = 0, @senders int = 0, @cleaned int = 0;
DECLARE @got TABLE (h uniqueidentifier, kind nvarchar(256));
DECLARE @taken int = 1, @received int = 0;
-- One RECEIVE answers one conversation group: receive again until the batch or the queue ends.
WHILE @taken > 0 AND @received < @batch
BEGIN
  RECEIVE TOP (@batch) conversation_handle, message_type_name FROM [shopq].[orders_sender] INTO @got;
  SET @taken = @@ROWCOUNT;
  SET @received += @taken;
END;
DECLARE ends CURSOR LOCAL FAST_FORWARD FOR
  SELECT DISTINCT h FROM @got;
OPEN ends; FETCH NEXT FROM ends INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h; SET @replies += 1; FETCH NEXT FROM ends INTO @h;
END;
CLOSE ends; DEALLOCATE ends;
DECLARE stalled CURSOR LOCAL FAST_FORWARD FOR
  SELECT TOP (@batch) ce.conversation_handle FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id
  WHERE s.name = N'dbq/shopq/orders/sender' AND ce.state IN ('SO', 'CO') AND DATEADD(second, -2147483647, ce.lifetime) < DATEADD(second, -@stalled, GETUTCDATE());
OPEN stalled; FETCH NEXT FROM stalled INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h; SET @senders += 1; FETCH NEXT FROM stalled INTO @h;
END;
CLOSE stalled; DEALLOCATE stalled;
DECLARE leftover CURSOR LOCAL FAST_FORWARD FOR
  SELECT TOP (@batch) ce.conversation_handle FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id
  WHERE s.name = N'dbq/shopq/orders' AND (ce.state = 'DI' OR (ce.state IN ('CO', 'SI') AND DATEADD(second, -2147483647, ce.lifetime) < DATEADD(second, -2 * @stalled, GETUTCDATE())))
    AND NOT EXISTS (SELECT 1 FROM [shopq].[orders] WITH (NOLOCK) WHERE conversation_handle = ce.conversation_handle);
OPEN leftover; FETCH NEXT FROM leftover INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h; SET @cleaned += 1; FETCH NEXT FROM leftover INTO @h;
END;
CLOSE leftover; DEALLOCATE leftover;
-- dbq: error path: errored conversations, and ends the other side never answered
DECLARE failed CURSOR LOCAL FAST_FORWARD FOR
  SELECT TOP (@batch) ce.conversation_handle FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id
  WHERE (s.name IN (N'dbq/shopq/orders', N'dbq/shopq/orders/sender') AND ce.state = 'ER')
  OR (s.name = N'dbq/shopq/orders' AND ce.state = 'DO' AND DATEADD(second, -2147483647, ce.lifetime) < DATEADD(second, -2 * @stalled, GETUTCDATE()));
OPEN failed; FETCH NEXT FROM failed INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h WITH CLEANUP; SET @cleaned += 1; FETCH NEXT FROM failed INTO @h;
END;
CLOSE failed; DEALLOCATE failed;
SELECT @replies, @senders, @cleaned;

-- maintenance: figures
SELECT it.name, ISNULL(SUM(ps.page_count), 0), ISNULL(SUM(ps.record_count), 0),
  ISNULL(SUM(ps.ghost_record_count), 0), ISNULL(MAX(ps.avg_fragmentation_in_percent), 0)
FROM sys.internal_tables it
CROSS APPLY sys.dm_db_index_physical_stats(DB_ID(), it.object_id, 1, NULL, 'SAMPLED') ps
WHERE it.parent_object_id = OBJECT_ID(N'[shopq].[orders]') AND ps.index_level = 0
GROUP BY it.name

-- maintenance: rebuild
ALTER QUEUE [shopq].[orders] REBUILD WITH (MAXDOP = 1)

-- maintenance: reorganize
ALTER QUEUE [shopq].[orders] REORGANIZE WITH (LOB_COMPACTION = ON)

-- teardown: end every conversation
SET NOCOUNT ON;
-- dbq: error path: a forced teardown drops the queue, so no conversation can end normally
DECLARE @h uniqueidentifier, @ended int = 0;
DECLARE every CURSOR LOCAL FAST_FORWARD FOR
  SELECT ce.conversation_handle FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id WHERE s.name IN (N'dbq/shopq/orders', N'dbq/shopq/orders/sender') AND ce.state <> 'CD';
OPEN every; FETCH NEXT FROM every INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h WITH CLEANUP; SET @ended += 1; FETCH NEXT FROM every INTO @h;
END;
CLOSE every; DEALLOCATE every;
SELECT @ended;

-- teardown 1
IF EXISTS (SELECT 1 FROM sys.services WHERE name = N'dbq/shopq/orders') DROP SERVICE [dbq/shopq/orders]

-- teardown 2
IF EXISTS (SELECT 1 FROM sys.services WHERE name = N'dbq/shopq/orders/sender') DROP SERVICE [dbq/shopq/orders/sender]

-- teardown 3
IF OBJECT_ID(N'[shopq].[orders]', N'SQ') IS NOT NULL DROP QUEUE [shopq].[orders]

-- teardown 4
IF OBJECT_ID(N'[shopq].[orders_sender]', N'SQ') IS NOT NULL DROP QUEUE [shopq].[orders_sender]

-- teardown 5
IF EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'dbq/shopq/orders/contract') DROP CONTRACT [dbq/shopq/orders/contract]

-- teardown 6
IF EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'dbq/shopq/orders/message') DROP MESSAGE TYPE [dbq/shopq/orders/message]

-- teardown 7
IF EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'dbq/shopq/orders/tracer') DROP MESSAGE TYPE [dbq/shopq/orders/tracer]

-- teardown 8
DROP SEQUENCE IF EXISTS [shopq].[orders_n_pushed]

-- teardown 9
DROP SEQUENCE IF EXISTS [shopq].[orders_n_popped]

-- teardown 10
DROP SEQUENCE IF EXISTS [shopq].[orders_n_acquired]

-- teardown 11
DROP SEQUENCE IF EXISTS [shopq].[orders_n_settled]

-- teardown 12
IF OBJECT_ID(N'[shopq].[dbq_queues]', N'U') IS NOT NULL DELETE FROM [shopq].[dbq_queues] WHERE queue = N'orders'

-- teardown 13
IF OBJECT_ID(N'[shopq].[dbq_stats_history]', N'U') IS NOT NULL DELETE FROM [shopq].[dbq_stats_history] WHERE queue = N'orders'

-- client: provisioned
SELECT COUNT(*) FROM sys.services WHERE name = N'dbq/shopq/orders'

-- client: commit an empty receive
IF @@TRANCOUNT > 0 COMMIT TRANSACTION

-- client: begin dialog
SET NOCOUNT ON;
DECLARE @h uniqueidentifier;
BEGIN DIALOG CONVERSATION @h FROM SERVICE [dbq/shopq/orders/sender] TO SERVICE N'dbq/shopq/orders'
  ON CONTRACT [dbq/shopq/orders/contract] WITH ENCRYPTION = OFF, LIFETIME = 2147483647;
SELECT @h, conversation_id FROM sys.conversation_endpoints WHERE conversation_handle = @h;

-- client: end dialog
DECLARE @h uniqueidentifier = ?; END CONVERSATION @h;

-- client: send 3
SET NOCOUNT ON; SET XACT_ABORT ON;
DECLARE @h uniqueidentifier = ?;
BEGIN TRANSACTION;
SEND ON CONVERSATION @h MESSAGE TYPE [dbq/shopq/orders/message] (?);
SEND ON CONVERSATION @h MESSAGE TYPE [dbq/shopq/orders/message] (?);
SEND ON CONVERSATION @h MESSAGE TYPE [dbq/shopq/orders/message] (?);
COMMIT TRANSACTION;
DECLARE @first_pushed sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_n_pushed]', @range_size = 3, @range_first_value = @first_pushed OUTPUT;

-- client: pop
SET NOCOUNT ON;
DECLARE @n int = ?, @timeout int = ?, @h uniqueidentifier, @taken bigint;
DECLARE @got TABLE (h uniqueidentifier, seq bigint, kind nvarchar(256), body varbinary(max));
BEGIN TRANSACTION;
WAITFOR (RECEIVE TOP (@n) conversation_handle, message_sequence_number, message_type_name, message_body
  FROM [shopq].[orders] INTO @got), TIMEOUT @timeout;
DECLARE ends CURSOR LOCAL FAST_FORWARD FOR
  SELECT DISTINCT h FROM @got WHERE kind IN (N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog', N'http://schemas.microsoft.com/SQL/ServiceBroker/Error');
OPEN ends; FETCH NEXT FROM ends INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h; FETCH NEXT FROM ends INTO @h;
END;
CLOSE ends; DEALLOCATE ends;
SET @taken = (SELECT COUNT_BIG(*) FROM @got WHERE kind = N'dbq/shopq/orders/message');
IF @taken > 0
BEGIN
DECLARE @first_popped sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_n_popped]', @range_size = @taken, @range_first_value = @first_popped OUTPUT;
END;
COMMIT TRANSACTION;
SELECT h, seq, CASE kind WHEN N'dbq/shopq/orders/tracer' THEN N'tracer' ELSE N'message' END, body
FROM @got WHERE kind IN (N'dbq/shopq/orders/message', N'dbq/shopq/orders/tracer') ORDER BY seq;

-- client: acquire
SET NOCOUNT ON;
DECLARE @n int = ?, @timeout int = ?, @h uniqueidentifier, @taken bigint;
DECLARE @got TABLE (h uniqueidentifier, seq bigint, kind nvarchar(256), body varbinary(max));
BEGIN TRANSACTION;
WAITFOR (RECEIVE TOP (@n) conversation_handle, message_sequence_number, message_type_name, message_body
  FROM [shopq].[orders] INTO @got), TIMEOUT @timeout;
DECLARE ends CURSOR LOCAL FAST_FORWARD FOR
  SELECT DISTINCT h FROM @got WHERE kind IN (N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog', N'http://schemas.microsoft.com/SQL/ServiceBroker/Error');
OPEN ends; FETCH NEXT FROM ends INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  END CONVERSATION @h; FETCH NEXT FROM ends INTO @h;
END;
CLOSE ends; DEALLOCATE ends;
SET @taken = (SELECT COUNT_BIG(*) FROM @got WHERE kind = N'dbq/shopq/orders/message');
IF @taken > 0
BEGIN
DECLARE @first_acquired sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_n_acquired]', @range_size = @taken, @range_first_value = @first_acquired OUTPUT;
END;
SELECT h, seq, CASE kind WHEN N'dbq/shopq/orders/tracer' THEN N'tracer' ELSE N'message' END, body
FROM @got WHERE kind IN (N'dbq/shopq/orders/message', N'dbq/shopq/orders/tracer') ORDER BY seq;

-- client: ack
SET NOCOUNT ON; IF @@TRANCOUNT > 0 COMMIT TRANSACTION;
DECLARE @first_settled sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_n_settled]', @range_size = 1, @range_first_value = @first_settled OUTPUT;

-- client: nack
SET NOCOUNT ON; IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
DECLARE @first_settled sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_n_settled]', @range_size = 1, @range_first_value = @first_settled OUTPUT;

-- client: conversation id
SELECT conversation_id FROM sys.conversation_endpoints WHERE conversation_handle = ?

-- client: stats
SET NOCOUNT ON;
DECLARE @age float = (SELECT ISNULL(DATEDIFF_BIG(millisecond, MIN(message_enqueue_time), SYSDATETIMEOFFSET()), 0)
  / 1000.0 FROM [shopq].[orders] WITH (NOLOCK));
SELECT
  (SELECT ISNULL(SUM(p.rows), 0) FROM sys.internal_tables it JOIN sys.partitions p
    ON p.object_id = it.object_id AND p.index_id = 1 WHERE it.parent_object_id = OBJECT_ID(N'[shopq].[orders]')),
  (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_n_acquired]')) - (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_n_settled]')),
  (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_n_pushed]')), (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_n_popped]')), (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_n_acquired]')), 0, @age;

-- client: tracer token
SET NOCOUNT ON;
DECLARE @timeout int = ?, @h uniqueidentifier, @target uniqueidentifier, @sent datetime2(7), @ms bigint = NULL;
DECLARE @got TABLE (h uniqueidentifier);
BEGIN DIALOG CONVERSATION @h FROM SERVICE [dbq/shopq/orders/sender] TO SERVICE N'dbq/shopq/orders'
  ON CONTRACT [dbq/shopq/orders/contract] WITH ENCRYPTION = OFF, LIFETIME = 2147483647;
SET @sent = SYSUTCDATETIME();
SEND ON CONVERSATION @h MESSAGE TYPE [dbq/shopq/orders/tracer] (0x);
SELECT @target = t.conversation_handle FROM sys.conversation_endpoints i
  JOIN sys.conversation_endpoints t ON t.conversation_id = i.conversation_id AND t.is_initiator = 0
  WHERE i.conversation_handle = @h;
IF @target IS NOT NULL
  WAITFOR (RECEIVE TOP (1) conversation_handle FROM [shopq].[orders] INTO @got WHERE conversation_handle = @target),
    TIMEOUT @timeout;
IF EXISTS (SELECT 1 FROM @got) SET @ms = DATEDIFF_BIG(microsecond, @sent, SYSUTCDATETIME()) / 1000;
DECLARE @status nvarchar(4000) = ISNULL((SELECT TOP (1) transmission_status FROM sys.transmission_queue
  WHERE conversation_handle = @h), N'');
-- Plain ends: the target's end reaches the sender's queue, where cleanup ends the sender's side.
IF @target IS NOT NULL END CONVERSATION @target;
ELSE END CONVERSATION @h;
SELECT CASE WHEN @ms IS NULL THEN 0 ELSE 1 END, ISNULL(@ms, 0), @status;

