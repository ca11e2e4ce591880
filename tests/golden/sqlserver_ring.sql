-- step create_schema

IF SCHEMA_ID(N'shopq') IS NULL EXEC(N'CREATE SCHEMA [shopq]')

-- step create_meta

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

-- step create_ring

IF OBJECT_ID(N'[shopq].[orders_ring]', N'U') IS NULL
CREATE TABLE [shopq].[orders_ring] (
  slot bigint NOT NULL PRIMARY KEY CLUSTERED,
  msg_id bigint NULL,
  state tinyint NOT NULL DEFAULT 0,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at datetime2(3) NULL,
  visible_at datetime2(3) NULL,
  expires_at datetime2(3) NULL,
  body varbinary(7000) NULL,
  headers nvarchar(max) NULL)

-- step fill_ring

WITH n AS (
  SELECT TOP (1000) 0 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS slot
  FROM sys.all_columns a CROSS JOIN sys.all_columns b CROSS JOIN sys.all_columns c)
INSERT INTO [shopq].[orders_ring] WITH (TABLOCK) (slot, state, body)
SELECT n.slot, 0, CAST(REPLICATE(CAST(0x00 AS varbinary(max)), 300) AS varbinary(7000))
FROM n WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_ring] r WHERE r.slot = n.slot)

-- step create_sequences

IF OBJECT_ID(N'[shopq].[orders_push_seq]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_push_seq] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_pop_seq]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_pop_seq] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_pushed]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_pushed] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_popped]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_popped] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_acquired]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_acquired] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_expired]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_expired] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_settled]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_settled] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_dead]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_dead] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_redriven]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_redriven] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_purged]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_purged] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_archived]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_archived] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_n_scavenged]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_n_scavenged] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

IF OBJECT_ID(N'[shopq].[orders_swept]', N'SO') IS NULL
CREATE SEQUENCE [shopq].[orders_swept] AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000

-- step reset_positions

DECLARE @level bigint = (SELECT MAX(CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END) + 1
  FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_push_seq]'), OBJECT_ID(N'[shopq].[orders_pop_seq]')));
DECLARE @sql nvarchar(max) =
  N'ALTER SEQUENCE [shopq].[orders_push_seq] RESTART WITH ' + CAST(@level AS nvarchar(20)) + N'; ' +
  N'ALTER SEQUENCE [shopq].[orders_pop_seq] RESTART WITH ' + CAST(@level AS nvarchar(20)) + N'; ' +
  N'DECLARE @n bigint; SET @n = NEXT VALUE FOR [shopq].[orders_push_seq]; SET @n = NEXT VALUE FOR [shopq].[orders_pop_seq];';
EXEC sys.sp_executesql @sql

-- step create_side_tables

IF OBJECT_ID(N'[shopq].[orders_spill]', N'U') IS NULL
CREATE TABLE [shopq].[orders_spill] (
  msg_id bigint NOT NULL PRIMARY KEY CLUSTERED,
  state tinyint NOT NULL,
  lease bigint NOT NULL DEFAULT 0,
  attempts int NOT NULL DEFAULT 0,
  pushed_at datetime2(3) NOT NULL,
  visible_at datetime2(3) NOT NULL,
  expires_at datetime2(3) NULL,
  body varbinary(max) NULL,
  headers nvarchar(max) NULL)

IF OBJECT_ID(N'[shopq].[orders_gap]', N'U') IS NULL
CREATE TABLE [shopq].[orders_gap] (
  pos bigint NOT NULL PRIMARY KEY CLUSTERED,
  reason varchar(8) NOT NULL CHECK (reason IN ('void', 'skipped')),
  noted_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME())

IF OBJECT_ID(N'[shopq].[orders_staged]', N'U') IS NULL
CREATE TABLE [shopq].[orders_staged] (
  stage nvarchar(200) NOT NULL,
  seq bigint NOT NULL,
  first_seq bigint NOT NULL,
  packed varbinary(max) NOT NULL,
  PRIMARY KEY CLUSTERED (stage, seq))

IF OBJECT_ID(N'[shopq].[orders_dead]', N'U') IS NULL
CREATE TABLE [shopq].[orders_dead] (
  source nvarchar(300) NOT NULL,
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  error nvarchar(4000) NULL,
  pushed_at datetime2(3) NOT NULL,
  dead_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME(),
  body varbinary(max) NOT NULL,
  headers nvarchar(max) NULL,
  PRIMARY KEY CLUSTERED (source, msg_id))

IF OBJECT_ID(N'[shopq].[orders_waiters]', N'U') IS NULL
CREATE TABLE [shopq].[orders_waiters] (
  id int NOT NULL PRIMARY KEY CHECK (id = 1),
  until datetime2(3) NOT NULL)

IF NOT EXISTS (SELECT 1 FROM [shopq].[orders_waiters]) INSERT INTO [shopq].[orders_waiters] (id, until) VALUES (1, '0001-01-01')

IF OBJECT_ID(N'[shopq].[orders_archive]', N'U') IS NULL
CREATE TABLE [shopq].[orders_archive] (
  msg_id bigint NOT NULL,
  attempts int NOT NULL,
  pushed_at datetime2(3) NOT NULL,
  acked_at datetime2(3) NOT NULL,
  body varbinary(max) NOT NULL,
  headers nvarchar(max) NULL,
  INDEX [orders_archive_at] CLUSTERED (acked_at))

IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[shopq].[orders_spill]') AND name = N'orders_spill_due') CREATE INDEX [orders_spill_due] ON [shopq].[orders_spill] (state, visible_at)

IF OBJECT_ID(N'[shopq].[orders_content]', N'U') IS NULL
CREATE TABLE [shopq].[orders_content] (
  bucket smallint NOT NULL,
  msg_id bigint NOT NULL,
  body varbinary(max) NOT NULL,
  PRIMARY KEY CLUSTERED (bucket, msg_id))

IF OBJECT_ID(N'[shopq].[orders_gens]', N'U') IS NULL
CREATE TABLE [shopq].[orders_gens] (
  first_pos bigint NOT NULL PRIMARY KEY CLUSTERED,
  slot_base bigint NOT NULL,
  size bigint NOT NULL CHECK (size > 0),
  started_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME())

INSERT INTO [shopq].[orders_gens] (first_pos, slot_base, size)
SELECT 1, 0, coalesce((SELECT ring_size FROM [shopq].[dbq_queues] WHERE queue = N'orders'), 1000)
WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_gens])

-- step key_dead_letters

IF COL_LENGTH(N'[shopq].[orders_dead]', 'source') IS NULL
BEGIN
  ALTER TABLE [shopq].[orders_dead] ADD source nvarchar(300) NULL;
  EXEC sys.sp_executesql N'UPDATE [shopq].[orders_dead] SET source = @source', N'@source nvarchar(300)',
    @source = N'shopq.orders';
  EXEC sys.sp_executesql N'ALTER TABLE [shopq].[orders_dead] ALTER COLUMN source nvarchar(300) NOT NULL';
  DECLARE @sql nvarchar(max) = N'ALTER TABLE [shopq].[orders_dead] DROP CONSTRAINT ' + QUOTENAME((SELECT name
    FROM sys.key_constraints WHERE parent_object_id = OBJECT_ID(N'[shopq].[orders_dead]') AND type = 'PK'));
  EXEC sys.sp_executesql @sql;
  EXEC sys.sp_executesql N'ALTER TABLE [shopq].[orders_dead] ADD PRIMARY KEY CLUSTERED (source, msg_id)';
END

-- step index_spill

IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[shopq].[orders_spill]') AND name = N'orders_spill_due') CREATE INDEX [orders_spill_due] ON [shopq].[orders_spill] (state, visible_at)

-- step add_headers

IF COL_LENGTH(N'[shopq].[orders_ring]', 'headers') IS NULL ALTER TABLE [shopq].[orders_ring] ADD headers nvarchar(max) NULL

IF COL_LENGTH(N'[shopq].[orders_spill]', 'headers') IS NULL ALTER TABLE [shopq].[orders_spill] ADD headers nvarchar(max) NULL

IF COL_LENGTH(N'[shopq].[orders_dead]', 'headers') IS NULL ALTER TABLE [shopq].[orders_dead] ADD headers nvarchar(max) NULL

IF COL_LENGTH(N'[shopq].[orders_archive]', 'headers') IS NULL ALTER TABLE [shopq].[orders_archive] ADD headers nvarchar(max) NULL

-- step allow_content

ALTER TABLE [shopq].[orders_spill] ALTER COLUMN body varbinary(max) NULL

ALTER TABLE [shopq].[orders_dead] ALTER COLUMN body varbinary(max) NOT NULL

ALTER TABLE [shopq].[orders_archive] ALTER COLUMN body varbinary(max) NOT NULL

-- step set_compression

-- step seed_settled

DECLARE @settled bigint = (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences
  WHERE object_id = OBJECT_ID(N'[shopq].[orders_n_acquired]'))
  - (SELECT COUNT_BIG(*) FROM [shopq].[orders_ring] WHERE state = 2) - (SELECT COUNT_BIG(*) FROM [shopq].[orders_spill] WHERE state = 2);
IF @settled > 0
BEGIN
  DECLARE @sql nvarchar(max) = N'ALTER SEQUENCE [shopq].[orders_n_settled] RESTART WITH ' + CAST(@settled AS nvarchar(20));
  EXEC sys.sp_executesql @sql;
  SET @sql = N'DECLARE @n bigint; SET @n = NEXT VALUE FOR [shopq].[orders_n_settled];';
  EXEC sys.sp_executesql @sql;
END

-- step create_history

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

-- step create_routines

CREATE OR ALTER PROCEDURE [shopq].[orders_body_of] @id bigint, @remove bit, @body varbinary(max) OUTPUT
WITH EXECUTE AS OWNER
AS BEGIN
  -- The body of message @id kept in [shopq].[orders_content] (its slot or spill row holds NULL), removed with
  -- @remove: the message ends in the caller's transaction.
  SET NOCOUNT ON;
  SET @body = (SELECT body FROM [shopq].[orders_content] WITH (ROWLOCK) WHERE bucket = @id % 8 AND msg_id = @id);
  IF @body IS NULL THROW 50005, N'dbq: a message of queue orders has no body in its content table', 1;
  IF @remove = 1 DELETE FROM [shopq].[orders_content] WITH (ROWLOCK) WHERE bucket = @id % 8 AND msg_id = @id;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_place] @id bigint, @body varbinary(max), @ttl_ms bigint, @now datetime2(3),
  @headers nvarchar(max), @placed bit OUTPUT
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @popped bigint, @try int = 0, @rc int;
  SET @placed = 0;
  WHILE 1 = 1 BEGIN
    -- A slot a popper's transaction holds is skipped (READPAST), never waited for: that popper
    -- may itself be waiting for a position this push has drawn, and neither would move.
    UPDATE [shopq].[orders_ring] WITH (ROWLOCK, READPAST)
      SET msg_id = @id, state = 1, lease = 0, attempts = 0, pushed_at = @now, visible_at = NULL, body = @body,
        headers = @headers, expires_at = CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now)) END
    WHERE slot = (SELECT TOP (1) gen.slot_base + (@id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@id) ORDER BY gen.first_pos DESC) AND state = 0;
    SET @rc = @@ROWCOUNT;
    IF @rc = 1 BEGIN SET @placed = 1; RETURN; END;
    -- The slot still holds an earlier lap's message: a leased one, or an orphan whose popper
    -- drew its position a while ago, moves to the spill table.
    SELECT @popped = CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences
    WHERE object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]');
    UPDATE [shopq].[orders_ring] WITH (ROWLOCK, READPAST) SET state = 0
    OUTPUT deleted.msg_id, CASE WHEN deleted.lease > 0 THEN 2 ELSE 1 END, deleted.lease, deleted.attempts,
      deleted.pushed_at, CASE WHEN deleted.lease > 0 THEN deleted.visible_at ELSE SYSUTCDATETIME() END,
      deleted.expires_at, deleted.body, deleted.headers
    INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    WHERE slot = (SELECT TOP (1) gen.slot_base + (@id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@id) ORDER BY gen.first_pos DESC) AND (state = 2 OR (state = 1 AND @try >= 4 AND msg_id <= @popped));
    SET @try += 1;
    IF @try > 20 BEGIN
      -- Full after all (pushers raced past the check), or a popper kept the slot: the position
      -- becomes void, and the caller tries again.
      INSERT INTO [shopq].[orders_gap] (pos, reason) SELECT @id, 'void' WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_gap] WHERE pos = @id);
      RETURN;
    END;
    WAITFOR DELAY '00:00:00.001';
  END;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_push] @body varbinary(max), @ttl_ms bigint, @headers nvarchar(max) = NULL
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @id bigint, @now datetime2(3) = SYSUTCDATETIME(), @placed bit, @n bigint, @rc int, @fenced int,
    @room bigint, @base bigint, @size bigint, @slot varbinary(max) = @body;
  IF DATALENGTH(@body) > 300 BEGIN
    IF DATALENGTH(@body) > 1048576
      THROW 50001, N'dbq: message is larger than spec.messages.maxBytes (1048576) of queue orders', 1;
    SET @slot = NULL;  -- past a slot: the body waits in [shopq].[orders_content]
  END;
  IF DATALENGTH(@headers) > 2 * 1024
    THROW 50003, N'dbq: headers are larger than spec.messages.headerBytes (1024) of queue orders', 1;
  IF @headers IS NOT NULL AND (ISJSON(@headers) = 0 OR LEFT(LTRIM(@headers), 1) <> N'{')
    THROW 50004, N'dbq: headers must be a JSON object of names to values', 1;
  -- The fence, then the room and the draw, in one transaction: a resize's switch waits for this
  -- push to commit, and this push for the switch.
  SET XACT_ABORT ON;
  BEGIN TRANSACTION;
  EXEC @fenced = sys.sp_getapplock @Resource = N'dbq-fence:shopq.orders', @LockMode = 'Shared', @LockOwner = 'Transaction';
  IF @fenced < 0 OR @@TRANCOUNT = 0
    THROW 50010, N'dbq: a push to queue orders did not get the resize fence', 1;
  -- The newest generation (the position drawn is in it: no switch commits before this push).
  SELECT TOP (1) @room = gen.size - (s.pushed - CASE WHEN s.popped > gen.first_pos - 1 THEN s.popped ELSE gen.first_pos - 1 END), @base = gen.slot_base, @size = gen.size
  FROM [shopq].[orders_gens] gen CROSS JOIN (SELECT MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_push_seq]') THEN CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END END) AS pushed, MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]') THEN CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END END) AS popped FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_push_seq]'), OBJECT_ID(N'[shopq].[orders_pop_seq]'))) s ORDER BY gen.first_pos DESC;
  IF @room <= 0 BEGIN
    COMMIT TRANSACTION;
    SELECT CAST(-1 AS bigint) AS o_id;  -- full: nothing drawn, so nothing to repair
    RETURN;
  END;
  SET @id = NEXT VALUE FOR [shopq].[orders_push_seq];
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK)
    SET msg_id = @id, state = 1, lease = 0, attempts = 0, pushed_at = @now, visible_at = NULL, body = @slot,
      headers = @headers, expires_at = CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now)) END
  WHERE slot = @base + @id % @size AND state = 0;
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    EXEC [shopq].[orders_place] @id, @slot, @ttl_ms, @now, @headers, @placed OUTPUT;
    IF @placed = 0 BEGIN COMMIT TRANSACTION; SELECT CAST(-1 AS bigint) AS o_id; RETURN; END;
  END;
  IF @slot IS NULL INSERT INTO [shopq].[orders_content] (bucket, msg_id, body) VALUES (@id % 8, @id, @body);
  COMMIT TRANSACTION;
  SET @n = NEXT VALUE FOR [shopq].[orders_n_pushed];
  SELECT @id AS o_id;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_push_many] @bodies varbinary(max), @lengths nvarchar(max), @ttl_ms bigint,
  @headers nvarchar(max) = NULL
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @n int, @k int, @first sql_variant, @first_id bigint,
    @used bigint, @i int, @placed bit, @big int, @c bigint, @total bigint, @fenced int, @base bigint, @size bigint;
  -- The bodies arrive end to end in one varbinary, with their lengths as comma-separated text:
  -- two parameters any driver binds, and no encoding to undo.
  DECLARE @in TABLE (i int PRIMARY KEY, n int NOT NULL, body varbinary(max), id bigint NULL,
    done bit NOT NULL DEFAULT 0, headers nvarchar(max) NULL);
  INSERT INTO @in (i, n, body)
  SELECT i, n, SUBSTRING(ISNULL(@bodies, 0x), CAST(e - n + 1 AS int), n)
  FROM (SELECT CAST(j.[key] AS int) + 1 AS i, CAST(j.value AS int) AS n,
          SUM(CAST(j.value AS bigint)) OVER (ORDER BY CAST(j.[key] AS int) ROWS UNBOUNDED PRECEDING) AS e
        FROM OPENJSON(N'[' + @lengths + N']') j) s;
  SELECT @n = COUNT(*), @big = MAX(n), @total = SUM(CAST(n AS bigint)) FROM @in;
  IF ISNULL(@total, 0) <> ISNULL(DATALENGTH(@bodies), 0)
    THROW 50002, N'dbq: push_many got bodies whose length differs from the sum of its lengths', 1;
  IF @big > 1048576
    THROW 50001, N'dbq: message is larger than spec.messages.maxBytes (1048576) of queue orders', 1;
  IF @headers IS NOT NULL BEGIN
    IF ISJSON(@headers) = 0 OR LEFT(LTRIM(@headers), 1) <> N'['
      THROW 50004, N'dbq: headers of several messages are a JSON array of one object (or null) per body', 1;
    IF (SELECT COUNT(*) FROM OPENJSON(@headers)) <> @n
      THROW 50002, N'dbq: push_many got headers for a number of messages other than its bodies', 1;
    IF EXISTS (SELECT 1 FROM OPENJSON(@headers) j WHERE j.type NOT IN (0, 5))
      THROW 50004, N'dbq: headers must be a JSON object of names to values', 1;
    UPDATE b SET headers = CASE WHEN j.type = 5 THEN j.value END
    FROM @in b JOIN OPENJSON(@headers) j ON CAST(j.[key] AS int) + 1 = b.i;
    IF EXISTS (SELECT 1 FROM @in WHERE DATALENGTH(headers) > 2 * 1024)
      THROW 50003, N'dbq: headers are larger than spec.messages.headerBytes (1024) of queue orders', 1;
  END;
  -- The fence before the room is read, as in push.
  SET XACT_ABORT ON;
  BEGIN TRANSACTION;
  EXEC @fenced = sys.sp_getapplock @Resource = N'dbq-fence:shopq.orders', @LockMode = 'Shared', @LockOwner = 'Transaction';
  IF @fenced < 0 OR @@TRANCOUNT = 0
    THROW 50010, N'dbq: a push to queue orders did not get the resize fence', 1;
  -- The newest generation (the positions drawn are in it: no switch commits before this batch).
  SELECT TOP (1) @used = gen.size - (s.pushed - CASE WHEN s.popped > gen.first_pos - 1 THEN s.popped ELSE gen.first_pos - 1 END), @base = gen.slot_base, @size = gen.size
  FROM [shopq].[orders_gens] gen CROSS JOIN (SELECT MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_push_seq]') THEN CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END END) AS pushed, MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]') THEN CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END END) AS popped FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_push_seq]'), OBJECT_ID(N'[shopq].[orders_pop_seq]'))) s ORDER BY gen.first_pos DESC;
  SET @k = CASE WHEN @used < @n THEN CASE WHEN @used > 0 THEN @used ELSE 0 END ELSE @n END;
  IF @k > 0 BEGIN
    -- One contiguous range of positions for the batch, then one set-based update.
    EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_push_seq]', @range_size = @k,
      @range_first_value = @first OUTPUT;
    SET @first_id = CAST(@first AS bigint);
    UPDATE @in SET id = @first_id + i - 1 WHERE i <= @k;
    -- A body past a slot waits in [shopq].[orders_content]: its slot gets NULL.
    UPDATE r WITH (ROWLOCK)
      SET msg_id = b.id, state = 1, lease = 0, attempts = 0, pushed_at = @now, visible_at = NULL,
        body = CASE WHEN b.n > 300 THEN NULL ELSE b.body END, headers = b.headers, expires_at = CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now)) END
    FROM [shopq].[orders_ring] r JOIN @in b ON r.slot = @base + b.id % @size
    WHERE b.id IS NOT NULL AND r.state = 0;
    UPDATE b SET done = 1 FROM @in b JOIN [shopq].[orders_ring] r ON r.slot = @base + b.id % @size AND r.msg_id = b.id;
    -- Slots an earlier lap still holds take the slow path, one by one.
    SET @i = 1;
    WHILE @i <= @k BEGIN
      IF EXISTS (SELECT 1 FROM @in WHERE i = @i AND done = 0) BEGIN
        DECLARE @one bigint = @first_id + @i - 1,
          @b varbinary(max) = (SELECT CASE WHEN n > 300 THEN NULL ELSE body END FROM @in WHERE i = @i),
          @h nvarchar(max) = (SELECT headers FROM @in WHERE i = @i);
        EXEC [shopq].[orders_place] @one, @b, @ttl_ms, @now, @h, @placed OUTPUT;
        UPDATE @in SET done = @placed WHERE i = @i;
      END;
      SET @i += 1;
    END;
    IF @big > 300
      INSERT INTO [shopq].[orders_content] (bucket, msg_id, body)
      SELECT id % 8, id, body FROM @in WHERE done = 1 AND n > 300;
  END;
  COMMIT TRANSACTION;
  SELECT @c = COUNT(*) FROM @in WHERE done = 1;
  WHILE @c > 0 BEGIN SET @used = NEXT VALUE FOR [shopq].[orders_n_pushed]; SET @c -= 1; END;
  SELECT STRING_AGG(CAST(CASE WHEN done = 1 THEN id ELSE -1 END AS nvarchar(max)), N',')
    WITHIN GROUP (ORDER BY i) AS o_ids
  FROM @in;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_claim] @pos bigint, @lease_ms bigint, @count bit, @status int OUTPUT,
  @body varbinary(max) OUTPUT, @lease bigint OUTPUT, @attempts int OUTPUT, @headers nvarchar(max) OUTPUT,
  @pushed_at datetime2(3) = NULL OUTPUT, @visible datetime2(3) = NULL OUTPUT
WITH EXECUTE AS OWNER
AS BEGIN
  -- take() with OUTPUT parameters, for the procedures that call it (INSERT ... EXEC cannot nest);
  -- read also takes when the message was pushed and, leased, when its lease ends.
  SET NOCOUNT ON;
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @msg bigint, @state tinyint, @exp datetime2(3),
    @round int = 0, @n bigint, @got int, @big bit,
    @remove bit = CASE WHEN @lease_ms <= 0 THEN 1 ELSE 0 END;
  SELECT @status = 2, @body = NULL, @lease = NULL, @attempts = NULL, @headers = NULL, @pushed_at = NULL,
    @visible = NULL;
  -- A few rounds: a message committed after the update looked is taken on the next round, and
  -- a position a pusher has drawn (usually written within a millisecond) is waited for briefly.
  WHILE @round < 10 BEGIN
    SET @round += 1;
    IF @lease_ms <= 0 BEGIN
      UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET state = 0, @body = body, @attempts = attempts, @headers = headers,
        @pushed_at = pushed_at
      WHERE slot = (SELECT TOP (1) gen.slot_base + (@pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@pos) ORDER BY gen.first_pos DESC) AND msg_id = @pos AND state = 1 AND (expires_at IS NULL OR expires_at > @now);
      SET @got = @@ROWCOUNT;
    END ELSE BEGIN
      SET @lease = CAST(CRYPT_GEN_RANDOM(7) AS bigint) + 1;
      UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET state = 2, lease = @lease, @attempts = attempts = attempts + 1,
        @visible = visible_at = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, @now)),
        @body = body, @headers = headers, @pushed_at = pushed_at
      WHERE slot = (SELECT TOP (1) gen.slot_base + (@pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@pos) ORDER BY gen.first_pos DESC) AND msg_id = @pos AND state = 1 AND (expires_at IS NULL OR expires_at > @now);
      SET @got = @@ROWCOUNT;
    END;
    IF @got = 1 BEGIN
      IF @body IS NULL EXEC [shopq].[orders_body_of] @pos, @remove, @body OUTPUT;
      IF @count = 1 AND @lease_ms <= 0 SET @n = NEXT VALUE FOR [shopq].[orders_n_popped];
      IF @count = 1 AND @lease_ms > 0 SET @n = NEXT VALUE FOR [shopq].[orders_n_acquired];
      IF @lease_ms <= 0 BEGIN
        INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
        SELECT msg_id, attempts, pushed_at, SYSUTCDATETIME(), @body, headers FROM [shopq].[orders_ring] WHERE slot = (SELECT TOP (1) gen.slot_base + (@pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@pos) ORDER BY gen.first_pos DESC);
        IF @count = 1 SET @n = NEXT VALUE FOR [shopq].[orders_n_archived];
      END;
      SET @status = 0;
      RETURN;
    END;
    SET @lease = NULL;
    SELECT @msg = msg_id, @state = state, @exp = expires_at FROM [shopq].[orders_ring] WHERE slot = (SELECT TOP (1) gen.slot_base + (@pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@pos) ORDER BY gen.first_pos DESC);
    IF @msg = @pos AND @state = 1 BEGIN
      IF @exp IS NULL OR @exp > @now CONTINUE;  -- written after the update looked: take it now
      UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET state = 0, @big = CASE WHEN body IS NULL THEN 1 ELSE 0 END
      WHERE slot = (SELECT TOP (1) gen.slot_base + (@pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@pos) ORDER BY gen.first_pos DESC) AND msg_id = @pos AND state = 1;
      SET @got = @@ROWCOUNT;
      IF @got = 1 SET @n = NEXT VALUE FOR [shopq].[orders_n_expired];  -- expired (TTL): dropped
      IF @got = 1 AND @big = 1 DELETE FROM [shopq].[orders_content] WITH (ROWLOCK) WHERE bucket = @pos % 8 AND msg_id = @pos;
      SET @status = 3;
      RETURN;
    END;
    IF @msg >= @pos BEGIN  -- taken by repair, or the ring has lapped a void position
      DELETE FROM [shopq].[orders_gap] WHERE pos = @pos;
      SET @status = 3;
      RETURN;
    END;
    DELETE FROM [shopq].[orders_gap] WHERE pos = @pos AND reason = 'void';
    SET @got = @@ROWCOUNT;
    IF @got = 1 BEGIN SET @status = 3; RETURN; END;
    IF @round = 10 OR @pos > (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences
                              WHERE object_id = OBJECT_ID(N'[shopq].[orders_push_seq]')) BREAK;
    WAITFOR DELAY '00:00:00.001';
  END;
  SELECT @body = NULL, @attempts = NULL, @headers = NULL;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_take] @pos bigint, @lease_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @status int, @body varbinary(max), @lease bigint, @attempts int, @headers nvarchar(max);
  EXEC [shopq].[orders_claim] @pos, @lease_ms, 1, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT, @headers OUTPUT;
  SELECT CAST(CAST(@status AS tinyint) AS binary(1)) + CAST(CAST(ISNULL(@pos, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL(@lease, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL(@attempts, 0) AS int) AS binary(4)) + CAST(CAST(ISNULL(DATALENGTH(@headers), 0) AS int) AS binary(4)) + CAST(CAST(ISNULL(DATALENGTH(@body), 0) AS int) AS binary(4)) + ISNULL(CAST(@headers AS varbinary(max)), 0x) + ISNULL(@body, 0x) AS o_record;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_next] @lease_ms bigint, @count bit, @status int OUTPUT, @id bigint OUTPUT,
  @body varbinary(max) OUTPUT, @lease bigint OUTPUT, @attempts int OUTPUT, @headers nvarchar(max) OUTPUT,
  @pushed_at datetime2(3) = NULL OUTPUT, @visible datetime2(3) = NULL OUTPUT
WITH EXECUTE AS OWNER
AS BEGIN
  -- pop() with OUTPUT parameters, for pop_many and read.
  SET NOCOUNT ON;
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @exp datetime2(3), @pos bigint, @ahead bigint, @i int = 0,
    @n bigint, @look bit, @big bit, @remove bit = CASE WHEN @lease_ms <= 0 THEN 1 ELSE 0 END;
  SELECT @status = 1, @body = NULL, @lease = NULL, @attempts = NULL, @headers = NULL, @pushed_at = NULL,
    @visible = NULL;
  -- Redeliveries (nacked messages, expired leases, rescued orphans) wait in the spill table.
  -- One pop in 8 looks there first while the ring has messages, and every pop when
  -- it has none: looking costs a statement most pops can skip, and none waits for ever.
  SET @look = CASE WHEN RAND() * 8 < 1 THEN 1 ELSE 0 END;
  redeliveries:
  -- 1. Redeliveries.
  WHILE @look = 1 BEGIN
    SET @id = NULL;
    SELECT TOP (1) @id = msg_id, @exp = expires_at, @big = CASE WHEN body IS NULL THEN 1 ELSE 0 END
    FROM [shopq].[orders_spill] WITH (ROWLOCK, UPDLOCK, READPAST)
    WHERE state = 1 AND visible_at <= @now ORDER BY visible_at;
    IF @id IS NULL BREAK;
    IF @exp IS NOT NULL AND @exp <= @now BEGIN  -- expired while waiting
      DELETE FROM [shopq].[orders_spill] WHERE msg_id = @id;
      IF @big = 1 DELETE FROM [shopq].[orders_content] WITH (ROWLOCK) WHERE bucket = @id % 8 AND msg_id = @id;
      SET @n = NEXT VALUE FOR [shopq].[orders_n_expired];
      CONTINUE;
    END;
    IF @lease_ms <= 0 BEGIN
      SELECT @body = body, @attempts = attempts, @headers = headers, @pushed_at = pushed_at FROM [shopq].[orders_spill] WHERE msg_id = @id;
      IF @big = 1 EXEC [shopq].[orders_body_of] @id, @remove, @body OUTPUT;
      INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT msg_id, attempts, pushed_at, SYSUTCDATETIME(), @body, headers FROM [shopq].[orders_spill] WHERE msg_id = @id;
      IF @count = 1 SET @n = NEXT VALUE FOR [shopq].[orders_n_archived];
      DELETE FROM [shopq].[orders_spill] WHERE msg_id = @id;
      IF @count = 1 SET @n = NEXT VALUE FOR [shopq].[orders_n_popped];
    END ELSE BEGIN
      SET @lease = CAST(CRYPT_GEN_RANDOM(7) AS bigint) + 1;
      UPDATE [shopq].[orders_spill] SET state = 2, lease = @lease, @attempts = attempts = attempts + 1, @body = body,
        @headers = headers, @pushed_at = pushed_at,
        @visible = visible_at = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, SYSUTCDATETIME()))
      WHERE msg_id = @id;
      IF @big = 1 EXEC [shopq].[orders_body_of] @id, @remove, @body OUTPUT;
      IF @count = 1 SET @n = NEXT VALUE FOR [shopq].[orders_n_acquired];
    END;
    SET @status = 0;
    RETURN;
  END;
  -- 2. The ring, in push order.
  WHILE 1 = 1 BEGIN
    SELECT @ahead = SUM(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_push_seq]') THEN 1 ELSE -1 END
                        * CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END)
    FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_push_seq]'), OBJECT_ID(N'[shopq].[orders_pop_seq]'));
    IF @ahead <= 0 BEGIN
      IF @look = 0 BEGIN SET @look = 1; GOTO redeliveries; END;
      -- Nothing new. A position whose popper gave up may have received its message since.
      SET @pos = NULL;
      SELECT TOP (1) @pos = g.pos FROM [shopq].[orders_gap] g WITH (ROWLOCK, UPDLOCK, READPAST)
      JOIN [shopq].[orders_ring] r ON r.slot = (SELECT TOP (1) gen.slot_base + (g.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (g.pos) ORDER BY gen.first_pos DESC) AND r.msg_id = g.pos
      WHERE g.reason = 'skipped' AND r.state = 1;
      IF @pos IS NOT NULL BEGIN
        DELETE FROM [shopq].[orders_gap] WHERE pos = @pos;
        EXEC [shopq].[orders_claim] @pos, @lease_ms, @count, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
          @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
        IF @status = 0 BEGIN SET @id = @pos; RETURN; END;
      END;
      SELECT @status = 1, @id = NULL;
      RETURN;
    END;
    SET @pos = NEXT VALUE FOR [shopq].[orders_pop_seq];
    EXEC [shopq].[orders_claim] @pos, @lease_ms, @count, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
      @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
    SET @id = @pos;
    IF @status <> 3 RETURN;
    -- A run of positions that will never be written (delayed messages push void ones): the
    -- due redeliveries and delayed messages are looked at every 1000 of them, and the pop goes
    -- on until it finds a message or no position is ahead (each turn spends one position).
    SET @i += 1;
    IF @i % 1000 = 0 BEGIN SET @look = 1; GOTO redeliveries; END;
  END;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_pop] @lease_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @status int, @id bigint, @body varbinary(max), @lease bigint, @attempts int, @headers nvarchar(max);
  EXEC [shopq].[orders_next] @lease_ms, 1, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
    @headers OUTPUT;
  SELECT CAST(CAST(@status AS tinyint) AS binary(1)) + CAST(CAST(ISNULL(@id, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL(@lease, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL(@attempts, 0) AS int) AS binary(4)) + CAST(CAST(ISNULL(DATALENGTH(@headers), 0) AS int) AS binary(4)) + CAST(CAST(ISNULL(DATALENGTH(@body), 0) AS int) AS binary(4)) + ISNULL(CAST(@headers AS varbinary(max)), 0x) + ISNULL(@body, 0x) AS o_record;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_pop_many] @max int, @lease_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @ahead bigint, @k int, @first sql_variant, @first_pos bigint,
    @n bigint, @c bigint, @status int, @id bigint, @body varbinary(max), @lease bigint, @attempts int, @p bigint,
    @headers nvarchar(max);
  DECLARE @out TABLE (o_status int, o_id bigint, o_body varbinary(max), o_lease bigint, o_attempts int,
    o_headers nvarchar(max));
  DECLARE @pos TABLE (pos bigint PRIMARY KEY, taken bit NOT NULL DEFAULT 0);
  -- 1. Redeliveries go through the single pop, one by one (rare).
  WHILE (SELECT COUNT(*) FROM @out) < @max
        AND EXISTS (SELECT 1 FROM [shopq].[orders_spill] WITH (READPAST) WHERE state = 1 AND visible_at <= @now) BEGIN
    EXEC [shopq].[orders_next] @lease_ms, 0, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
      @headers OUTPUT;
    IF @status = 1 BREAK;
    INSERT INTO @out VALUES (@status, @id, @body, @lease, @attempts, @headers);
    IF @status = 2 BREAK;  -- the caller waits for that position
  END;
  SELECT @ahead = SUM(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_push_seq]') THEN 1 ELSE -1 END
                      * CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END)
  FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_push_seq]'), OBJECT_ID(N'[shopq].[orders_pop_seq]'));
  SET @k = @max - (SELECT COUNT(*) FROM @out);
  IF @ahead < @k SET @k = CASE WHEN @ahead > 0 THEN @ahead ELSE 0 END;
  IF @status = 2 OR @k <= 0 BEGIN
    IF NOT EXISTS (SELECT 1 FROM @out) BEGIN  -- empty: the single pop also looks at given-up positions
      EXEC [shopq].[orders_next] @lease_ms, 0, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
        @headers OUTPUT;
      IF @status <> 1 INSERT INTO @out VALUES (@status, @id, @body, @lease, @attempts, @headers);
    END;
    GOTO answer;
  END;
  -- 2. The ring: one contiguous range of positions, their slots claimed in one update.
  EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_pop_seq]', @range_size = @k,
    @range_first_value = @first OUTPUT;
  SET @first_pos = CAST(@first AS bigint);
  INSERT INTO @pos (pos) SELECT TOP (@k) @first_pos + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1
  FROM sys.all_columns;
  IF @lease_ms <= 0
    UPDATE r WITH (ROWLOCK) SET state = 0
    OUTPUT 0, inserted.msg_id, inserted.body, NULL, inserted.attempts, inserted.headers INTO @out
    FROM [shopq].[orders_ring] r JOIN @pos p ON r.slot = (SELECT TOP (1) gen.slot_base + (p.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC)
    WHERE r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > @now);
  ELSE
    UPDATE r WITH (ROWLOCK) SET state = 2, lease = CAST(CRYPT_GEN_RANDOM(7) AS bigint) + 1, attempts = attempts + 1,
      visible_at = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, @now))
    OUTPUT 0, inserted.msg_id, inserted.body, inserted.lease, inserted.attempts, inserted.headers INTO @out
    FROM [shopq].[orders_ring] r JOIN @pos p ON r.slot = (SELECT TOP (1) gen.slot_base + (p.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC)
    WHERE r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > @now);
  UPDATE p SET taken = 1 FROM @pos p JOIN @out o ON o.o_id = p.pos;
  -- Bodies past a slot come from [shopq].[orders_content]; a pop removes them.
  IF EXISTS (SELECT 1 FROM @out WHERE o_status = 0 AND o_body IS NULL) BEGIN
    DECLARE @bodies TABLE (msg_id bigint PRIMARY KEY, body varbinary(max));
    INSERT INTO @bodies (msg_id, body)
    SELECT c.msg_id, c.body FROM [shopq].[orders_content] c WITH (ROWLOCK)
    JOIN @out o ON c.bucket = o.o_id % 8 AND c.msg_id = o.o_id WHERE o.o_status = 0 AND o.o_body IS NULL;
    IF @lease_ms <= 0
      DELETE c FROM [shopq].[orders_content] c WITH (ROWLOCK) JOIN @bodies b ON c.bucket = b.msg_id % 8 AND c.msg_id = b.msg_id;
    UPDATE o SET o_body = b.body FROM @out o JOIN @bodies b ON b.msg_id = o.o_id WHERE o.o_status = 0;
  END;
  IF @lease_ms <= 0
    INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT r.msg_id, r.attempts, r.pushed_at, SYSUTCDATETIME(), o.o_body, r.headers
    FROM [shopq].[orders_ring] r JOIN @pos p ON r.slot = (SELECT TOP (1) gen.slot_base + (p.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC) AND r.msg_id = p.pos
    JOIN @out o ON o.o_id = p.pos AND o.o_status = 0 WHERE p.taken = 1;
  -- 3. Positions not claimed above: expired, gone, or not written yet (status 2 for the caller).
  SET @p = (SELECT MIN(pos) FROM @pos WHERE taken = 0);
  WHILE @p IS NOT NULL BEGIN
    EXEC [shopq].[orders_claim] @p, @lease_ms, 0, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT, @headers OUTPUT;
    IF @status IN (0, 2) INSERT INTO @out VALUES (@status, @p, @body, @lease, @attempts, @headers);
    SET @p = (SELECT MIN(pos) FROM @pos WHERE taken = 0 AND pos > @p);
  END;
  answer:
  -- Counted once, at the end: the totals are sequences, which a rollback (a deadlock victim
  -- retried by its client) does not undo, so nothing is counted before the last lock is taken.
  SELECT @c = COUNT(*) FROM @out WHERE o_status = 0;
  WHILE @c > 0 BEGIN
    IF @lease_ms <= 0 SET @n = NEXT VALUE FOR [shopq].[orders_n_popped]; ELSE SET @n = NEXT VALUE FOR [shopq].[orders_n_acquired];
    IF @lease_ms <= 0 SET @n = NEXT VALUE FOR [shopq].[orders_n_archived];
    SET @c -= 1;
  END;
  SELECT CAST(CAST(o_status AS tinyint) AS binary(1)) + CAST(CAST(ISNULL(o_id, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL(o_lease, 0) AS bigint) AS binary(8)) + CAST(CAST(ISNULL(o_attempts, 0) AS int) AS binary(4)) + CAST(CAST(ISNULL(DATALENGTH(o_headers), 0) AS int) AS binary(4)) + CAST(CAST(ISNULL(DATALENGTH(o_body), 0) AS int) AS binary(4)) + ISNULL(CAST(o_headers AS varbinary(max)), 0x) + ISNULL(o_body, 0x) AS o_record FROM @out ORDER BY o_status, o_id;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_release] @positions nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @released int;
  -- The popper that drew these positions gives up waiting: whoever finds their messages later
  -- (pop on an empty ring, or repair) delivers them.
  INSERT INTO [shopq].[orders_gap] (pos, reason)
  SELECT DISTINCT CAST(s.value AS bigint), 'skipped' FROM STRING_SPLIT(@positions, N',') s
  WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_gap] g WHERE g.pos = CAST(s.value AS bigint));
  SET @released = @@ROWCOUNT;
  SELECT @released AS o_released;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_ack] @id bigint, @lease bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @n bigint, @rc int, @big bit = 0, @body varbinary(max);
  DECLARE @acked TABLE (msg_id bigint, attempts int, pushed_at datetime2(3), headers nvarchar(max), big bit);
  -- A body in the row goes to the archive in the same statement; one in [shopq].[orders_content] after it.
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET state = 0
  OUTPUT inserted.msg_id, inserted.attempts, inserted.pushed_at, SYSUTCDATETIME(), inserted.body, inserted.headers
    INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
  WHERE slot = (SELECT TOP (1) gen.slot_base + (@id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@id) ORDER BY gen.first_pos DESC) AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME()
    AND body IS NOT NULL;
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    DELETE FROM [shopq].[orders_spill]
    OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, SYSUTCDATETIME(), deleted.body, deleted.headers
      INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME() AND body IS NOT NULL;
    SET @rc = @@ROWCOUNT;
  END;
  IF @rc = 0 BEGIN
    UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET state = 0
    OUTPUT inserted.msg_id, inserted.attempts, inserted.pushed_at, inserted.headers, 1 INTO @acked
    WHERE slot = (SELECT TOP (1) gen.slot_base + (@id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@id) ORDER BY gen.first_pos DESC) AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
    SET @rc = @@ROWCOUNT;
    IF @rc = 0 BEGIN
      DELETE FROM [shopq].[orders_spill] OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.headers, 1 INTO @acked
      WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
      SET @rc = @@ROWCOUNT;
    END;
    IF @rc = 1 BEGIN
      EXEC [shopq].[orders_body_of] @id, 1, @body OUTPUT;
      INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT msg_id, attempts, pushed_at, SYSUTCDATETIME(), @body, headers FROM @acked;
    END;
  END;
  IF @rc = 1
  BEGIN
    SET @n = NEXT VALUE FOR [shopq].[orders_n_popped];
    SET @n = NEXT VALUE FOR [shopq].[orders_n_settled];  -- the lease ended
    SET @n = NEXT VALUE FOR [shopq].[orders_n_archived];
    SELECT 1 AS o_ok;
  END;
  ELSE SELECT 0 AS o_ok;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_ack_many] @ids nvarchar(max), @leases nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @n bigint, @c bigint;
  DECLARE @a TABLE (id bigint PRIMARY KEY, lease bigint);
  DECLARE @done TABLE (id bigint, big bit);  -- big: its body is in [shopq].[orders_content]
  INSERT INTO @a (id, lease)
  SELECT CAST(i.value AS bigint), CAST(l.value AS bigint)
  FROM OPENJSON(N'[' + @ids + N']') i JOIN OPENJSON(N'[' + @leases + N']') l ON l.[key] = i.[key];
  UPDATE r WITH (ROWLOCK) SET state = 0
  OUTPUT inserted.msg_id, CASE WHEN inserted.body IS NULL THEN 1 ELSE 0 END INTO @done
  FROM [shopq].[orders_ring] r JOIN @a a ON r.slot = (SELECT TOP (1) gen.slot_base + (a.id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (a.id) ORDER BY gen.first_pos DESC) AND r.msg_id = a.id AND r.state = 2 AND r.lease = a.lease AND r.visible_at > SYSUTCDATETIME();
  INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT r.msg_id, r.attempts, r.pushed_at, SYSUTCDATETIME(), ISNULL(r.body, c.body), r.headers
  FROM [shopq].[orders_ring] r JOIN @done d ON r.slot = (SELECT TOP (1) gen.slot_base + (d.id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (d.id) ORDER BY gen.first_pos DESC) AND r.msg_id = d.id
  LEFT JOIN [shopq].[orders_content] c ON d.big = 1 AND c.bucket = d.id % 8 AND c.msg_id = d.id;
  DECLARE @gone TABLE (msg_id bigint, attempts int, pushed_at datetime2(3), body varbinary(max),
    headers nvarchar(max));
  DELETE s OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.body, deleted.headers INTO @gone
  FROM [shopq].[orders_spill] s JOIN @a a ON s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.visible_at > SYSUTCDATETIME()
  WHERE NOT EXISTS (SELECT 1 FROM @done d WHERE d.id = a.id);
  INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT g.msg_id, g.attempts, g.pushed_at, SYSUTCDATETIME(), ISNULL(g.body, c.body), g.headers FROM @gone g
  LEFT JOIN [shopq].[orders_content] c ON g.body IS NULL AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id;
  INSERT INTO @done (id, big) SELECT msg_id, CASE WHEN body IS NULL THEN 1 ELSE 0 END FROM @gone;
  SELECT @c = COUNT(*) FROM @done;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_archived]; SET @c -= 1; END;
  IF EXISTS (SELECT 1 FROM @done WHERE big = 1)
    DELETE c FROM [shopq].[orders_content] c WITH (ROWLOCK) JOIN @done d ON c.bucket = d.id % 8 AND c.msg_id = d.id
    WHERE d.big = 1;
  SELECT @c = COUNT(*) FROM @done;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_popped]; SET @n = NEXT VALUE FOR [shopq].[orders_n_settled]; SET @c -= 1; END;
  SELECT ISNULL(STRING_AGG(CAST(id AS nvarchar(max)), N','), N'') AS o_acked FROM @done;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_nack] @id bigint, @lease bigint, @delay_ms bigint, @error nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- o_ok: 0 no lease, 1 ready again after the delay, 2 dead-lettered (acquired 5
  -- times, when that is > 0), in this transaction. A negative delay gives it back unhandled:
  -- ready at once, and this delivery does not count as an attempt.
  -- DATEADD takes an int: the delay goes in as seconds, then the rest in milliseconds.
  DECLARE @wait_ms bigint = CASE WHEN @delay_ms > 0 THEN @delay_ms ELSE 0 END;
  DECLARE @visible datetime2(3) = DATEADD(millisecond, @wait_ms % 1000, DATEADD(second, @wait_ms / 1000, SYSUTCDATETIME()));
  DECLARE @n bigint, @rc int, @taken TABLE (attempts int, pushed_at datetime2(3), expires_at datetime2(3), body varbinary(max),
    spilled bit, headers nvarchar(max));
  BEGIN TRANSACTION;
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET state = 0
  OUTPUT deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, 0, deleted.headers INTO @taken
  WHERE slot = (SELECT TOP (1) gen.slot_base + (@id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@id) ORDER BY gen.first_pos DESC) AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  SET @rc = @@ROWCOUNT;
  IF @rc = 0
    DELETE FROM [shopq].[orders_spill] WITH (ROWLOCK)
    OUTPUT deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, 1, deleted.headers INTO @taken
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  IF NOT EXISTS (SELECT 1 FROM @taken) BEGIN COMMIT TRANSACTION; SELECT 0 AS o_ok; RETURN; END;
  SET @n = NEXT VALUE FOR [shopq].[orders_n_settled];  -- the lease ended
  IF @delay_ms < 0
    UPDATE @taken SET attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
  ELSE IF 5 > 0 AND (SELECT attempts FROM @taken) >= 5
  BEGIN
    IF (SELECT body FROM @taken) IS NULL BEGIN  -- a dead letter holds its body
      DECLARE @body varbinary(max);
      EXEC [shopq].[orders_body_of] @id, 1, @body OUTPUT;
      UPDATE @taken SET body = @body;
    END;
    INSERT INTO [shopq].[orders_dead] (source, msg_id, attempts, error, pushed_at, body, headers)
    SELECT N'shopq.orders', @id, t.attempts, LEFT(@error, 4000), t.pushed_at, t.body, JSON_MODIFY(JSON_MODIFY(ISNULL(t.headers, N'{}'), N'$."dbq-error"', LEFT(@error, 4000)), N'$."dbq-attempts"', t.attempts) FROM @taken t
    WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_dead] d WHERE d.source = N'shopq.orders' AND d.msg_id = @id);
    COMMIT TRANSACTION;
    SET @n = NEXT VALUE FOR [shopq].[orders_n_dead];
    SELECT 2 AS o_ok; RETURN;
  END;
  INSERT INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT @id, 1, 0, t.attempts, t.pushed_at, @visible, t.expires_at, t.body, t.headers FROM @taken t;
  COMMIT TRANSACTION;
  SELECT 1 AS o_ok;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_repair] @orphan_grace_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @popped bigint, @leases bigint, @orphans bigint,
    @expired bigint, @gaps bigint, @c bigint, @n bigint, @dead bigint;
  DECLARE @freed TABLE (msg_id bigint, big bit);
  SELECT @popped = CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences
  WHERE object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]');
  -- Rows a client is changing right now are skipped (READPAST): repair never waits on a client.
  -- Leases past their visibility timeout: ready again, out of ring order; those acquired
  -- 5 times (when that is > 0) go to the dead letters instead, in one transaction.
  DECLARE @lapsed TABLE (msg_id bigint, attempts int, pushed_at datetime2(3), expires_at datetime2(3),
    body varbinary(max), headers nvarchar(max));
  BEGIN TRANSACTION;
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, deleted.headers
    INTO @lapsed
  WHERE state = 2 AND visible_at < @now;
  DELETE FROM [shopq].[orders_spill] WITH (ROWLOCK, READPAST)
  OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, deleted.headers
    INTO @lapsed
  WHERE state = 2 AND visible_at < @now;
  INSERT INTO [shopq].[orders_dead] (source, msg_id, attempts, error, pushed_at, body, headers)
  SELECT N'shopq.orders', l.msg_id, l.attempts, N'lease expired (visibility timeout)', l.pushed_at,
    ISNULL(l.body, c.body), JSON_MODIFY(JSON_MODIFY(ISNULL(l.headers, N'{}'), N'$."dbq-error"', N'lease expired (visibility timeout)'), N'$."dbq-attempts"', l.attempts) FROM @lapsed l
  LEFT JOIN [shopq].[orders_content] c ON l.body IS NULL AND c.bucket = l.msg_id % 8 AND c.msg_id = l.msg_id
  WHERE 5 > 0 AND l.attempts >= 5
    AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_dead] d WHERE d.source = N'shopq.orders' AND d.msg_id = l.msg_id);
  SET @dead = @@ROWCOUNT;
  DELETE c FROM [shopq].[orders_content] c WITH (ROWLOCK) JOIN @lapsed l ON c.bucket = l.msg_id % 8 AND c.msg_id = l.msg_id
  WHERE l.body IS NULL AND 5 > 0 AND l.attempts >= 5;
  INSERT INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT l.msg_id, 1, 0, l.attempts, l.pushed_at, @now, l.expires_at, l.body, l.headers FROM @lapsed l
  WHERE NOT (5 > 0 AND l.attempts >= 5);
  COMMIT TRANSACTION;
  SELECT @leases = COUNT(*) FROM @lapsed;
  SET @c = @leases;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_settled]; SET @c -= 1; END;
  SET @c = @dead;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_dead]; SET @c -= 1; END;
  -- Orphans: ready messages whose pop position was drawn but never claimed.
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, 1, 0, deleted.attempts, deleted.pushed_at, @now, deleted.expires_at, deleted.body,
    deleted.headers
  INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  WHERE state = 1 AND msg_id <= @popped AND pushed_at <= DATEADD(millisecond, (-@orphan_grace_ms) % 1000, DATEADD(second, (-@orphan_grace_ms) / 1000, @now))
    AND (expires_at IS NULL OR expires_at > @now);
  SET @orphans = @@ROWCOUNT;
  -- Expired messages (TTL): free the slot; a position not drawn yet becomes void.
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, CASE WHEN deleted.body IS NULL THEN 1 ELSE 0 END INTO @freed
  WHERE state = 1 AND expires_at <= @now;
  SET @expired = @@ROWCOUNT;
  INSERT INTO [shopq].[orders_gap] (pos, reason) SELECT f.msg_id, 'void' FROM @freed f
  WHERE f.msg_id > @popped AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_gap] g WHERE g.pos = f.msg_id);
  DELETE FROM [shopq].[orders_spill] WITH (ROWLOCK, READPAST)
  OUTPUT deleted.msg_id, CASE WHEN deleted.body IS NULL THEN 1 ELSE 0 END INTO @freed  -- (after the gaps)
  WHERE state = 1 AND expires_at <= @now;
  SET @expired += @@ROWCOUNT;
  DELETE c FROM [shopq].[orders_content] c WITH (ROWLOCK) JOIN @freed f ON c.bucket = f.msg_id % 8 AND c.msg_id = f.msg_id
  WHERE f.big = 1;
  -- Content whose message is gone: none should be (see the PostgreSQL routine); at most 1000 a run.
  DELETE c FROM [shopq].[orders_content] c WITH (ROWLOCK, READPAST)
  JOIN (SELECT TOP (1000) x.bucket, x.msg_id FROM [shopq].[orders_content] x WITH (READPAST)
    WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_ring] r WHERE r.slot = (SELECT TOP (1) gen.slot_base + (x.msg_id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (x.msg_id) ORDER BY gen.first_pos DESC) AND r.msg_id = x.msg_id AND r.state <> 0)
      AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_spill] s WHERE s.msg_id = x.msg_id)) gone
    ON c.bucket = gone.bucket AND c.msg_id = gone.msg_id;
  SET @c = @expired;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_expired]; SET @c -= 1; END;
  -- Gaps a whole lap of the largest generation behind the pop position, or older than every
  -- generation, can never be written any more.
  DELETE g FROM [shopq].[orders_gap] g
  WHERE (g.pos <= @popped - (SELECT MAX(x.size) FROM [shopq].[orders_gens] x) OR g.pos < (SELECT MIN(x.first_pos) FROM [shopq].[orders_gens] x))
    AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_ring] r WHERE r.slot = (SELECT TOP (1) gen.slot_base + (g.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (g.pos) ORDER BY gen.first_pos DESC) AND r.msg_id = g.pos AND r.state = 1);
  SET @gaps = @@ROWCOUNT;
  SELECT @leases AS o_expired_leases, @orphans AS o_orphans, @expired AS o_expired, @gaps AS o_gaps_purged,
    @dead AS o_dead;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_void_holes] @grace_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- Holes: positions a pusher drew and never wrote. One drawn before a message already older
  -- than the grace is stalled: void it (a late write becomes an orphan that repair delivers).
  DECLARE @popped bigint, @bound bigint, @holes bigint;
  SELECT @popped = CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences
  WHERE object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]');
  SELECT @bound = MAX(msg_id) FROM [shopq].[orders_ring]
  WHERE state = 1 AND msg_id > @popped AND pushed_at <= DATEADD(millisecond, (-@grace_ms) % 1000, DATEADD(second, (-@grace_ms) / 1000, SYSUTCDATETIME()));
  IF @bound IS NULL BEGIN SELECT CAST(0 AS bigint); RETURN; END;
  -- Per generation, each of its slots stands for the one position of its part of
  -- (@popped, @bound) that maps to it (a part never spans more than a lap).
  INSERT INTO [shopq].[orders_gap] (pos, reason)
  SELECT c.p, 'void' FROM (
    SELECT r.msg_id, w.hi, w.lo + ((r.slot - w.slot_base - w.lo % w.size + w.size) % w.size) AS p
    FROM (SELECT x.slot_base, x.size,
            CASE WHEN @popped + 1 > x.first_pos THEN @popped + 1 ELSE x.first_pos END AS lo,
            ISNULL(LEAD(x.first_pos) OVER (ORDER BY x.first_pos), @bound) AS hi
          FROM [shopq].[orders_gens] x) AS w
    JOIN [shopq].[orders_ring] r ON r.slot >= w.slot_base AND r.slot < w.slot_base + w.size
    WHERE w.lo < w.hi) AS c
  WHERE c.p < @bound AND c.p < c.hi AND (c.msg_id IS NULL OR c.msg_id <> c.p)
    AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_gap] g WHERE g.pos = c.p);
  SET @holes = @@ROWCOUNT;
  SELECT @holes;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_stats]
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- From the totals, not a count of the ring (see the PostgreSQL routine).
  DECLARE @pushed bigint, @popped bigint, @acquired bigint, @expired bigint, @settled bigint, @pos bigint,
    @dead bigint, @redriven bigint, @purged bigint, @delayed bigint, @in_flight bigint, @depth bigint,
    @archived bigint, @scavenged bigint, @oldest datetime2(3);
  SELECT
    @pushed = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_pushed]') THEN v END),
    @popped = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_popped]') THEN v END),
    @acquired = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_acquired]') THEN v END),
    @expired = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_expired]') THEN v END),
    @settled = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_settled]') THEN v END),
    @dead = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_dead]') THEN v END),
    @redriven = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_redriven]') THEN v END),
    @purged = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_purged]') THEN v END),
    @archived = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_archived]') THEN v END),
    @scavenged = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_n_scavenged]') THEN v END),
    @pos = MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]') THEN v END)
  FROM (SELECT object_id, CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END AS v FROM sys.sequences
    WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_n_pushed]'), OBJECT_ID(N'[shopq].[orders_n_popped]'), OBJECT_ID(N'[shopq].[orders_n_acquired]'),
      OBJECT_ID(N'[shopq].[orders_n_expired]'), OBJECT_ID(N'[shopq].[orders_n_settled]'), OBJECT_ID(N'[shopq].[orders_n_dead]'), OBJECT_ID(N'[shopq].[orders_n_redriven]'),
      OBJECT_ID(N'[shopq].[orders_n_purged]'), OBJECT_ID(N'[shopq].[orders_n_archived]'), OBJECT_ID(N'[shopq].[orders_n_scavenged]'),
      OBJECT_ID(N'[shopq].[orders_pop_seq]'))) s;
  SET @in_flight = CASE WHEN @acquired > @settled THEN @acquired - @settled ELSE 0 END;
  SELECT @delayed = COUNT_BIG(*) FROM [shopq].[orders_spill] WHERE state = 1 AND visible_at > SYSUTCDATETIME();
  SET @depth = @pushed + @redriven - @popped - @expired - @dead - @in_flight - @delayed;
  IF @depth < 0 SET @depth = 0;
  -- The oldest ready message, from a bounded look at the head.
  SELECT @oldest = MIN(pushed_at) FROM (
    SELECT r.pushed_at FROM [shopq].[orders_ring] r
    JOIN (SELECT TOP (64) @pos + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS pos FROM sys.all_objects) p
      ON r.slot = (SELECT TOP (1) gen.slot_base + (p.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (p.pos) ORDER BY gen.first_pos DESC) AND r.msg_id = p.pos
    WHERE r.state = 1
    UNION ALL
    SELECT r.pushed_at FROM [shopq].[orders_gap] g JOIN [shopq].[orders_ring] r ON r.slot = (SELECT TOP (1) gen.slot_base + (g.pos) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (g.pos) ORDER BY gen.first_pos DESC) AND r.msg_id = g.pos
    WHERE g.reason = 'skipped' AND r.state = 1
    UNION ALL
    SELECT s.pushed_at FROM (SELECT TOP (64) state, pushed_at, visible_at FROM [shopq].[orders_spill] ORDER BY msg_id) s
    WHERE s.state = 1 AND s.visible_at <= SYSUTCDATETIME()) head;
  SELECT @depth AS o_depth, @in_flight AS o_in_flight, @pushed AS o_pushed, @popped AS o_popped,
    @acquired AS o_acquired, @expired AS o_expired,
    CASE WHEN @depth > 0 THEN ISNULL(DATEDIFF_BIG(millisecond, @oldest, SYSUTCDATETIME()) / 1000.0, 0) ELSE 0 END
      AS o_oldest_age_s,
    CASE WHEN @dead > @redriven + @purged THEN @dead - @redriven - @purged ELSE 0 END AS o_dead,
    @delayed AS o_delayed,
    CASE WHEN @archived > @scavenged THEN @archived - @scavenged ELSE 0 END AS o_archived;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_defer] @bodies varbinary(max), @lengths nvarchar(max), @ttl_ms bigint, @delay_ms bigint,
  @headers nvarchar(max) = NULL
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- Delayed messages wait aside in the spill table until due; each takes a push position given
  -- up at once as void (see the PostgreSQL routine).
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @visible datetime2(3), @n int, @big int, @total bigint,
    @first sql_variant, @first_id bigint, @c bigint, @used bigint;
  DECLARE @in TABLE (i int PRIMARY KEY, n int NOT NULL, body varbinary(max), headers nvarchar(max) NULL);
  INSERT INTO @in (i, n, body)
  SELECT i, n, SUBSTRING(ISNULL(@bodies, 0x), CAST(e - n + 1 AS int), n)
  FROM (SELECT CAST(j.[key] AS int) + 1 AS i, CAST(j.value AS int) AS n,
          SUM(CAST(j.value AS bigint)) OVER (ORDER BY CAST(j.[key] AS int) ROWS UNBOUNDED PRECEDING) AS e
        FROM OPENJSON(N'[' + @lengths + N']') j) s;
  SELECT @n = COUNT(*), @big = MAX(n), @total = SUM(CAST(n AS bigint)) FROM @in;
  IF ISNULL(@total, 0) <> ISNULL(DATALENGTH(@bodies), 0)
    THROW 50002, N'dbq: defer got bodies whose length differs from the sum of its lengths', 1;
  IF @big > 1048576  -- a delayed message's spill row holds its body, whatever its size
    THROW 50001, N'dbq: message is larger than spec.messages.maxBytes (1048576) of queue orders', 1;
  IF @headers IS NOT NULL BEGIN
    IF ISJSON(@headers) = 0 OR LEFT(LTRIM(@headers), 1) <> N'['
      THROW 50004, N'dbq: headers of several messages are a JSON array of one object (or null) per body', 1;
    IF (SELECT COUNT(*) FROM OPENJSON(@headers)) <> @n
      THROW 50002, N'dbq: defer got headers for a number of messages other than its bodies', 1;
    IF EXISTS (SELECT 1 FROM OPENJSON(@headers) j WHERE j.type NOT IN (0, 5))
      THROW 50004, N'dbq: headers must be a JSON object of names to values', 1;
    UPDATE b SET headers = CASE WHEN j.type = 5 THEN j.value END
    FROM @in b JOIN OPENJSON(@headers) j ON CAST(j.[key] AS int) + 1 = b.i;
    IF EXISTS (SELECT 1 FROM @in WHERE DATALENGTH(headers) > 2 * 1024)
      THROW 50003, N'dbq: headers are larger than spec.messages.headerBytes (1024) of queue orders', 1;
  END;
  IF @n = 0 BEGIN SELECT N'' AS o_ids; RETURN; END;
  SET @delay_ms = CASE WHEN @delay_ms > 0 THEN @delay_ms ELSE 0 END;
  SET @visible = DATEADD(millisecond, @delay_ms % 1000, DATEADD(second, @delay_ms / 1000, @now));
  EXEC sys.sp_sequence_get_range @sequence_name = N'[shopq].[orders_push_seq]', @range_size = @n, @range_first_value = @first OUTPUT;
  SET @first_id = CAST(@first AS bigint);
  BEGIN TRANSACTION;
  INSERT INTO [shopq].[orders_gap] (pos, reason) SELECT @first_id + i - 1, 'void' FROM @in b
  WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_gap] g WHERE g.pos = @first_id + b.i - 1);
  INSERT INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT @first_id + i - 1, 1, 0, 0, @now, @visible,
    CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @visible)) END, body,
    headers FROM @in;
  COMMIT TRANSACTION;
  SET @c = @n;
  WHILE @c > 0 BEGIN SET @used = NEXT VALUE FOR [shopq].[orders_n_pushed]; SET @c -= 1; END;
  SELECT STRING_AGG(CAST(@first_id + i - 1 AS nvarchar(max)), N',') WITHIN GROUP (ORDER BY i) AS o_ids FROM @in;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_extend] @id bigint, @lease bigint, @visibility_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @rc int, @lease_ms bigint = CASE WHEN @visibility_ms > 1 THEN @visibility_ms ELSE 1 END;
  DECLARE @until datetime2(3) = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, SYSUTCDATETIME()));
  UPDATE [shopq].[orders_ring] WITH (ROWLOCK) SET visible_at = @until
  WHERE slot = (SELECT TOP (1) gen.slot_base + (@id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (@id) ORDER BY gen.first_pos DESC) AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    UPDATE [shopq].[orders_spill] WITH (ROWLOCK) SET visible_at = @until
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
    SET @rc = @@ROWCOUNT;
  END;
  SELECT CASE WHEN @rc = 1 THEN 1 ELSE 0 END AS o_ok;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_redrive] @ids nvarchar(max), @max int
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- Dead letters back to delivery (the given ids, or the oldest @max when none are given):
  -- headers as pushed (without dbq's dead-letter keys).
  DECLARE @moved TABLE (msg_id bigint, pushed_at datetime2(3), body varbinary(max), headers nvarchar(max));
  DECLARE @c bigint, @n bigint;
  BEGIN TRANSACTION;
  DELETE d OUTPUT deleted.msg_id, deleted.pushed_at, deleted.body, deleted.headers INTO @moved
  FROM [shopq].[orders_dead] d WITH (ROWLOCK, READPAST)
  WHERE d.source = N'shopq.orders' AND d.msg_id IN (SELECT TOP (@max) x.msg_id FROM [shopq].[orders_dead] x WITH (READPAST)
    WHERE x.source = N'shopq.orders'
      AND (@ids = N'' OR x.msg_id IN (SELECT CAST(value AS bigint) FROM OPENJSON(N'[' + @ids + N']')))
    ORDER BY x.msg_id);
  INSERT INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT m.msg_id, 1, 0, 0, m.pushed_at, SYSUTCDATETIME(), NULL, m.body,
    NULLIF(JSON_MODIFY(JSON_MODIFY(m.headers, N'$."dbq-error"', NULL), N'$."dbq-attempts"', NULL), N'{}')
  FROM @moved m
  WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_spill] s WHERE s.msg_id = m.msg_id);
  COMMIT TRANSACTION;
  SELECT @c = COUNT(*) FROM @moved;
  SELECT @c AS o_moved;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_redriven]; SET @c -= 1; END;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_purge_dead] @ids nvarchar(max), @max int
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @c bigint, @n bigint;
  DELETE d FROM [shopq].[orders_dead] d WITH (ROWLOCK, READPAST)
  WHERE d.source = N'shopq.orders' AND d.msg_id IN (SELECT TOP (@max) x.msg_id FROM [shopq].[orders_dead] x WITH (READPAST)
    WHERE x.source = N'shopq.orders'
      AND (@ids = N'' OR x.msg_id IN (SELECT CAST(value AS bigint) FROM OPENJSON(N'[' + @ids + N']')))
    ORDER BY x.msg_id);
  SET @c = @@ROWCOUNT;
  SELECT @c AS o_purged;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_purged]; SET @c -= 1; END;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_scavenge] @retention_ms bigint, @max int
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- Archived messages older than the retention, the oldest @max of them: one bounded batch (see
  -- the PostgreSQL routine).
  DECLARE @c bigint, @n bigint;
  DELETE a FROM (SELECT TOP (@max) * FROM [shopq].[orders_archive] WITH (ROWLOCK, READPAST)
    WHERE acked_at < DATEADD(second, -CAST(@retention_ms / 1000 AS int), SYSUTCDATETIME()) ORDER BY acked_at) a;
  SET @c = @@ROWCOUNT;
  SELECT @c AS o_scavenged;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_scavenged]; SET @c -= 1; END;
END

-- The row contract (see the PostgreSQL routines): answers as rows, refusals as errors. Headers
-- are JSON text; send_batch takes its bodies end to end with their lengths, as push_many does
-- (T-SQL has no arrays a driver binds). read takes message by message through next.
CREATE OR ALTER PROCEDURE [shopq].[orders_read] @qty int, @visibility_ms bigint, @wait_ms bigint = 0
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @rows TABLE (i int IDENTITY PRIMARY KEY, msg_id bigint, lease bigint, attempts int,
    enqueued_at datetime2(3), visible_at datetime2(3), headers nvarchar(max), body varbinary(max));
  DECLARE @status int, @id bigint, @body varbinary(max), @lease bigint, @attempts int, @headers nvarchar(max),
    @pushed_at datetime2(3), @visible datetime2(3), @since datetime2(3), @until datetime2(3), @got int = 0,
    @grace bigint;
  IF @qty IS NULL OR @qty < 1
    THROW 50002, N'dbq: read from queue orders: qty must be at least 1', 1;
  IF @visibility_ms IS NULL OR @visibility_ms < 0
    THROW 50002, N'dbq: read from queue orders: visibility_ms must be 0 (at most once) or a lease in milliseconds', 1;
  IF @wait_ms IS NULL OR @wait_ms < 0
    THROW 50002, N'dbq: read from queue orders: wait_ms must be 0 or more', 1;
  -- A position whose push has not committed yet is waited for, up to 2000 ms in all
  -- (a quarter of a shorter lease), then given up as release does.
  SET @grace = CASE WHEN @visibility_ms > 0 AND @visibility_ms / 4 < 2000
                    THEN @visibility_ms / 4 ELSE 2000 END;
  SET @until = DATEADD(millisecond, @wait_ms % 1000, DATEADD(second, @wait_ms / 1000, SYSUTCDATETIME()));
  WHILE 1 = 1 BEGIN
    SET @since = SYSUTCDATETIME();
    WHILE @got < @qty BEGIN
      EXEC [shopq].[orders_next] @visibility_ms, 1, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
        @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
      WHILE @status = 2 AND DATEDIFF(millisecond, @since, SYSUTCDATETIME()) < @grace BEGIN
        WAITFOR DELAY '00:00:00.001';
        EXEC [shopq].[orders_claim] @id, @visibility_ms, 1, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
          @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
      END;
      IF @status = 2
        INSERT INTO [shopq].[orders_gap] (pos, reason) SELECT @id, 'skipped' WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_gap] WHERE pos = @id);
      IF @status = 1 BREAK;
      IF @status = 0 BEGIN
        INSERT INTO @rows (msg_id, lease, attempts, enqueued_at, visible_at, headers, body)
        VALUES (@id, @lease, @attempts, @pushed_at, @visible, @headers, @body);
        SET @got += 1;
      END;
    END;
    IF @got > 0 OR SYSUTCDATETIME() >= @until BREAK;
    WAITFOR DELAY '00:00:00.050';
  END;
  SELECT msg_id, lease, attempts, enqueued_at, visible_at, headers, body FROM @rows ORDER BY i;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_send] @body varbinary(max), @headers nvarchar(max) = NULL, @delay_ms bigint = 0,
  @ttl_ms bigint = 0
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @one TABLE (o_id bigint);
  DECLARE @deferred TABLE (o_ids nvarchar(max));
  DECLARE @id bigint = -1, @try int = 0, @length nvarchar(20) = CAST(DATALENGTH(@body) AS nvarchar(20)),
    @wrapped nvarchar(max) = N'[' + @headers + N']', @full nvarchar(400);
  IF @body IS NULL
    THROW 50006, N'dbq: send to queue orders: a body must not be NULL (send an empty varbinary instead)', 1;
  IF @delay_ms IS NULL OR @delay_ms < 0 OR @ttl_ms IS NULL OR @ttl_ms < 0
    THROW 50002, N'dbq: send to queue orders: delay_ms and ttl_ms must be 0 or more', 1;
  IF @delay_ms > 0 BEGIN
    INSERT INTO @deferred EXEC [shopq].[orders_defer] @body, @length, @ttl_ms, @delay_ms, @wrapped;
    SELECT CAST(o_ids AS bigint) AS msg_id FROM @deferred;
    RETURN;
  END;
  -- push draws a position only while the ring has room; a position it had to give up (a slot an
  -- earlier lap still held) is void, and it is tried again.
  WHILE @try < 5 AND @id < 0 BEGIN
    SET @try += 1;
    DELETE FROM @one;
    INSERT INTO @one EXEC [shopq].[orders_push] @body, @ttl_ms, @headers;
    SET @id = (SELECT o_id FROM @one);
    IF @id < 0 AND (SELECT TOP (1) gen.size - (s.pushed - CASE WHEN s.popped > gen.first_pos - 1 THEN s.popped ELSE gen.first_pos - 1 END) FROM [shopq].[orders_gens] gen CROSS JOIN (SELECT MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_push_seq]') THEN CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END END) AS pushed, MAX(CASE WHEN object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]') THEN CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END END) AS popped FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'[shopq].[orders_push_seq]'), OBJECT_ID(N'[shopq].[orders_pop_seq]'))) s ORDER BY gen.first_pos DESC) <= 0 BREAK;
  END;
  IF @id < 0 BEGIN
    SET @full = CONCAT(N'dbq: queue orders is full: its ring holds ', (SELECT TOP (1) gen.size FROM [shopq].[orders_gens] gen ORDER BY gen.first_pos DESC), N' messages (spec.ring.size)');
    THROW 50007, @full, 1;
  END;
  SELECT @id AS msg_id;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_send_batch] @bodies varbinary(max), @lengths nvarchar(max),
  @headers nvarchar(max) = NULL, @delay_ms bigint = 0, @ttl_ms bigint = 0
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @answer TABLE (o_ids nvarchar(max));
  DECLARE @ids nvarchar(max), @full nvarchar(400);
  IF @delay_ms IS NULL OR @delay_ms < 0 OR @ttl_ms IS NULL OR @ttl_ms < 0
    THROW 50002, N'dbq: send_batch to queue orders: delay_ms and ttl_ms must be 0 or more', 1;
  IF @delay_ms > 0
    INSERT INTO @answer EXEC [shopq].[orders_defer] @bodies, @lengths, @ttl_ms, @delay_ms, @headers;
  ELSE
    INSERT INTO @answer EXEC [shopq].[orders_push_many] @bodies, @lengths, @ttl_ms, @headers;
  SET @ids = (SELECT o_ids FROM @answer);
  -- What the ring took stays sent; a body it did not take answers NULL, to be sent again.
  -- Refused outright only when none was taken.
  IF @ids <> N'' AND NOT EXISTS (SELECT 1 FROM OPENJSON(N'[' + @ids + N']') WHERE CAST(value AS bigint) > 0) BEGIN
    SET @full = CONCAT(N'dbq: queue orders is full: its ring holds ', (SELECT TOP (1) gen.size FROM [shopq].[orders_gens] gen ORDER BY gen.first_pos DESC),
      N' messages (spec.ring.size); none of the batch was sent');
    THROW 50007, @full, 1;
  END;
  SELECT CASE WHEN CAST(j.value AS bigint) > 0 THEN CAST(j.value AS bigint) END AS msg_id
  FROM OPENJSON(N'[' + ISNULL(@ids, N'') + N']') j ORDER BY CAST(j.[key] AS int);
END

-- By id, with no lease asked (version 22 on), the ids comma-separated as ack_many takes them: a
-- message is found by its slot (from its generation) or the spill table's key, ready, delayed or leased
-- alike; a lease held on it is lost. An id not there is left out of the answer.
CREATE OR ALTER PROCEDURE [shopq].[orders_delete] @ids nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- Ends each message as ack does: counted as popped, kept in the archive with spec.archive.
  DECLARE @n bigint, @c bigint;
  DECLARE @a TABLE (i int PRIMARY KEY, id bigint);
  DECLARE @gone TABLE (msg_id bigint PRIMARY KEY, state smallint, attempts int, pushed_at datetime2(3),
    body varbinary(max), headers nvarchar(max));
  INSERT INTO @a (i, id) SELECT CAST([key] AS int), CAST(value AS bigint) FROM OPENJSON(N'[' + ISNULL(@ids, N'') + N']');
  BEGIN TRANSACTION;
  UPDATE r WITH (ROWLOCK) SET state = 0
  OUTPUT deleted.msg_id, deleted.state, deleted.attempts, deleted.pushed_at, deleted.body, deleted.headers INTO @gone
  FROM [shopq].[orders_ring] r JOIN (SELECT DISTINCT id FROM @a) a ON r.slot = (SELECT TOP (1) gen.slot_base + (a.id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (a.id) ORDER BY gen.first_pos DESC) AND r.msg_id = a.id AND r.state IN (1, 2);
  DELETE s OUTPUT deleted.msg_id, deleted.state, deleted.attempts, deleted.pushed_at, deleted.body, deleted.headers INTO @gone
  FROM [shopq].[orders_spill] s JOIN (SELECT DISTINCT id FROM @a) a ON s.msg_id = a.id
  WHERE NOT EXISTS (SELECT 1 FROM @gone g WHERE g.msg_id = a.id);
  INSERT INTO [shopq].[orders_archive] (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT g.msg_id, g.attempts, g.pushed_at, SYSUTCDATETIME(), ISNULL(g.body, c.body), g.headers FROM @gone g
  LEFT JOIN [shopq].[orders_content] c ON g.body IS NULL AND c.bucket = g.msg_id % 8 AND c.msg_id = g.msg_id;
  DELETE c FROM [shopq].[orders_content] c WITH (ROWLOCK) JOIN @gone g ON g.body IS NULL AND c.bucket = g.msg_id % 8
    AND c.msg_id = g.msg_id;
  COMMIT TRANSACTION;
  SELECT @c = COUNT(*) FROM @gone;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_popped]; SET @c -= 1; END;
  SELECT @c = COUNT(*) FROM @gone;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_archived]; SET @c -= 1; END;
  SELECT @c = COUNT(*) FROM @gone WHERE state = 2;  -- their leases ended
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_settled]; SET @c -= 1; END;
  SELECT g.msg_id FROM @gone g JOIN (SELECT id, MIN(i) AS i FROM @a GROUP BY id) a ON a.id = g.msg_id ORDER BY a.i;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_archive] @ids nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- delete, for a queue that keeps an archive; refused for one that does not, where nothing would
  -- ever remove the copies.
  EXEC [shopq].[orders_delete] @ids;
END

CREATE OR ALTER PROCEDURE [shopq].[orders_set_vt] @ids nvarchar(max), @visibility_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- Each message visible again @visibility_ms from now, and not before; its attempts stay. One
  -- that must wait leaves ring order for the spill table, as a nacked one does (a ready one asked
  -- for 0 ms stays where it is). Answers the messages as read does, with no lease.
  IF @visibility_ms IS NULL OR @visibility_ms < 0
    THROW 50002, N'dbq: set_vt on queue orders: visibility_ms must be 0 or more', 1;
  DECLARE @visible datetime2(3) = DATEADD(millisecond, @visibility_ms % 1000, DATEADD(second, @visibility_ms / 1000, SYSUTCDATETIME()));
  DECLARE @n bigint, @c bigint;
  DECLARE @a TABLE (i int PRIMARY KEY, id bigint);
  DECLARE @moved TABLE (msg_id bigint PRIMARY KEY, state smallint, attempts int, pushed_at datetime2(3),
    expires_at datetime2(3), body varbinary(max), headers nvarchar(max));
  DECLARE @kept TABLE (msg_id bigint PRIMARY KEY, state smallint);
  INSERT INTO @a (i, id) SELECT CAST([key] AS int), CAST(value AS bigint) FROM OPENJSON(N'[' + ISNULL(@ids, N'') + N']');
  BEGIN TRANSACTION;
  UPDATE r WITH (ROWLOCK) SET state = 0
  OUTPUT deleted.msg_id, deleted.state, deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body,
    deleted.headers INTO @moved
  FROM [shopq].[orders_ring] r JOIN (SELECT DISTINCT id FROM @a) a ON r.slot = (SELECT TOP (1) gen.slot_base + (a.id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (a.id) ORDER BY gen.first_pos DESC) AND r.msg_id = a.id
  WHERE r.state = 2 OR (r.state = 1 AND @visibility_ms > 0);
  INSERT INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT msg_id, 1, 0, attempts, pushed_at, @visible, expires_at, body, headers FROM @moved;
  UPDATE s WITH (ROWLOCK) SET state = 1, lease = 0, visible_at = @visible
  OUTPUT deleted.msg_id, deleted.state INTO @kept
  FROM [shopq].[orders_spill] s JOIN (SELECT DISTINCT id FROM @a) a ON s.msg_id = a.id
  WHERE NOT EXISTS (SELECT 1 FROM @moved m WHERE m.msg_id = a.id);
  COMMIT TRANSACTION;
  SELECT @c = (SELECT COUNT(*) FROM @moved WHERE state = 2) + (SELECT COUNT(*) FROM @kept WHERE state = 2);
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR [shopq].[orders_n_settled]; SET @c -= 1; END;  -- their leases ended
  SELECT x.msg_id, CAST(NULL AS bigint) AS lease, x.attempts, x.pushed_at AS enqueued_at, x.visible_at, x.headers,
    ISNULL(x.body, c.body) AS body
  FROM (SELECT s.msg_id, s.attempts, s.pushed_at, s.visible_at, s.headers, s.body FROM [shopq].[orders_spill] s
        WHERE s.msg_id IN (SELECT msg_id FROM @moved UNION SELECT msg_id FROM @kept)
        UNION ALL
        SELECT r.msg_id, r.attempts, r.pushed_at, @visible, r.headers, r.body FROM [shopq].[orders_ring] r
        JOIN (SELECT DISTINCT id FROM @a) d ON r.slot = (SELECT TOP (1) gen.slot_base + (d.id) % gen.size FROM [shopq].[orders_gens] gen WHERE gen.first_pos <= (d.id) ORDER BY gen.first_pos DESC) AND r.msg_id = d.id
        WHERE r.state = 1 AND @visibility_ms = 0) x
  LEFT JOIN [shopq].[orders_content] c ON x.body IS NULL AND c.bucket = x.msg_id % 8 AND c.msg_id = x.msg_id
  JOIN (SELECT id, MIN(i) AS i FROM @a GROUP BY id) a ON a.id = x.msg_id ORDER BY a.i;
END

-- step record_version

IF COL_LENGTH(N'[shopq].[dbq_queues]', 'max_attempts') IS NULL
ALTER TABLE [shopq].[dbq_queues] ADD max_attempts int NOT NULL DEFAULT 0

IF COL_LENGTH(N'[shopq].[dbq_queues]', 'archive') IS NULL
ALTER TABLE [shopq].[dbq_queues] ADD archive int NOT NULL DEFAULT 0

IF COL_LENGTH(N'[shopq].[dbq_queues]', 'dead_letter_queue') IS NULL
ALTER TABLE [shopq].[dbq_queues] ADD dead_letter_queue nvarchar(300) NOT NULL DEFAULT N''

IF COL_LENGTH(N'[shopq].[dbq_queues]', 'header_bytes') IS NULL
ALTER TABLE [shopq].[dbq_queues] ADD header_bytes int NOT NULL DEFAULT 1024

IF COL_LENGTH(N'[shopq].[dbq_queues]', 'max_headers') IS NULL
ALTER TABLE [shopq].[dbq_queues] ADD max_headers int NOT NULL DEFAULT 32

IF COL_LENGTH(N'[shopq].[dbq_queues]', 'max_body_bytes') IS NULL
ALTER TABLE [shopq].[dbq_queues] ADD max_body_bytes int NOT NULL DEFAULT 1048576

MERGE [shopq].[dbq_queues] WITH (HOLDLOCK) AS m
USING (SELECT N'orders' AS queue) AS s ON m.queue = s.queue
WHEN MATCHED THEN UPDATE SET schema_version = 25, message_bytes = 300,
  max_attempts = 5, archive = 1, dead_letter_queue = N'', header_bytes = 1024,
  max_headers = 32, max_body_bytes = 1048576, updated_at = SYSUTCDATETIME()
WHEN NOT MATCHED THEN INSERT (queue, design, schema_version, ring_size, message_bytes, max_attempts, archive,
    dead_letter_queue, header_bytes, max_headers, max_body_bytes)
  VALUES (s.queue, N'ring', 25, 1000, 300, 5, 1, N'',
    1024, 32, 1048576);

-- step secure

IF DATABASE_PRINCIPAL_ID(N'dbq_o_shopq_7bf52350') IS NULL CREATE ROLE [dbq_o_shopq_7bf52350]

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_send') IS NULL CREATE ROLE [dbq_r_orders_16adecff_send] AUTHORIZATION [dbq_o_shopq_7bf52350]

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_receive') IS NULL CREATE ROLE [dbq_r_orders_16adecff_receive] AUTHORIZATION [dbq_o_shopq_7bf52350]

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_peek') IS NULL CREATE ROLE [dbq_r_orders_16adecff_peek] AUTHORIZATION [dbq_o_shopq_7bf52350]

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_monitor') IS NULL CREATE ROLE [dbq_r_orders_16adecff_monitor] AUTHORIZATION [dbq_o_shopq_7bf52350]

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_manage') IS NULL CREATE ROLE [dbq_r_orders_16adecff_manage] AUTHORIZATION [dbq_o_shopq_7bf52350]

ALTER AUTHORIZATION ON SCHEMA::[shopq] TO [dbq_o_shopq_7bf52350]

GRANT EXECUTE ON OBJECT::[shopq].[orders_push] TO [dbq_r_orders_16adecff_send]

GRANT EXECUTE ON OBJECT::[shopq].[orders_push_many] TO [dbq_r_orders_16adecff_send]

GRANT EXECUTE ON OBJECT::[shopq].[orders_defer] TO [dbq_r_orders_16adecff_send]

GRANT EXECUTE ON OBJECT::[shopq].[orders_send] TO [dbq_r_orders_16adecff_send]

GRANT EXECUTE ON OBJECT::[shopq].[orders_send_batch] TO [dbq_r_orders_16adecff_send]

GRANT SELECT ON OBJECT::[shopq].[dbq_queues] TO [dbq_r_orders_16adecff_send]

GRANT EXECUTE ON OBJECT::[shopq].[orders_take] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_pop] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_pop_many] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_release] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_ack] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_ack_many] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_nack] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_extend] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_read] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_delete] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_archive] TO [dbq_r_orders_16adecff_receive]

GRANT EXECUTE ON OBJECT::[shopq].[orders_set_vt] TO [dbq_r_orders_16adecff_receive]

GRANT SELECT ON OBJECT::[shopq].[dbq_queues] TO [dbq_r_orders_16adecff_receive]

GRANT SELECT ON OBJECT::[shopq].[dbq_queues] TO [dbq_r_orders_16adecff_peek]

GRANT SELECT ON OBJECT::[shopq].[orders_ring] TO [dbq_r_orders_16adecff_peek]

GRANT SELECT ON OBJECT::[shopq].[orders_spill] TO [dbq_r_orders_16adecff_peek]

GRANT SELECT ON OBJECT::[shopq].[orders_content] TO [dbq_r_orders_16adecff_peek]

GRANT EXECUTE ON OBJECT::[shopq].[orders_stats] TO [dbq_r_orders_16adecff_monitor]

GRANT SELECT ON OBJECT::[shopq].[dbq_queues] TO [dbq_r_orders_16adecff_monitor]

GRANT SELECT ON OBJECT::[shopq].[dbq_stats_history] TO [dbq_r_orders_16adecff_monitor]

GRANT EXECUTE ON OBJECT::[shopq].[orders_redrive] TO [dbq_r_orders_16adecff_manage]

GRANT EXECUTE ON OBJECT::[shopq].[orders_purge_dead] TO [dbq_r_orders_16adecff_manage]

GRANT EXECUTE ON OBJECT::[shopq].[orders_repair] TO [dbq_r_orders_16adecff_manage]

GRANT EXECUTE ON OBJECT::[shopq].[orders_void_holes] TO [dbq_r_orders_16adecff_manage]

GRANT EXECUTE ON OBJECT::[shopq].[orders_scavenge] TO [dbq_r_orders_16adecff_manage]

GRANT SELECT ON OBJECT::[shopq].[dbq_queues] TO [dbq_r_orders_16adecff_manage]

GRANT SELECT ON OBJECT::[shopq].[orders_dead] TO [dbq_r_orders_16adecff_manage]

GRANT SELECT ON OBJECT::[shopq].[orders_dead] TO [dbq_r_orders_16adecff_manage]

GRANT SELECT ON OBJECT::[shopq].[orders_archive] TO [dbq_r_orders_16adecff_manage]

-- teardown

DROP PROCEDURE IF EXISTS [shopq].[orders_place]

DROP PROCEDURE IF EXISTS [shopq].[orders_claim]

DROP PROCEDURE IF EXISTS [shopq].[orders_next]

DROP PROCEDURE IF EXISTS [shopq].[orders_push]

DROP PROCEDURE IF EXISTS [shopq].[orders_push_many]

DROP PROCEDURE IF EXISTS [shopq].[orders_take]

DROP PROCEDURE IF EXISTS [shopq].[orders_pop]

DROP PROCEDURE IF EXISTS [shopq].[orders_pop_many]

DROP PROCEDURE IF EXISTS [shopq].[orders_release]

DROP PROCEDURE IF EXISTS [shopq].[orders_ack]

DROP PROCEDURE IF EXISTS [shopq].[orders_ack_many]

DROP PROCEDURE IF EXISTS [shopq].[orders_nack]

DROP PROCEDURE IF EXISTS [shopq].[orders_repair]

DROP PROCEDURE IF EXISTS [shopq].[orders_void_holes]

DROP PROCEDURE IF EXISTS [shopq].[orders_stats]

DROP PROCEDURE IF EXISTS [shopq].[orders_defer]

DROP PROCEDURE IF EXISTS [shopq].[orders_extend]

DROP PROCEDURE IF EXISTS [shopq].[orders_redrive]

DROP PROCEDURE IF EXISTS [shopq].[orders_purge_dead]

DROP PROCEDURE IF EXISTS [shopq].[orders_scavenge]

DROP PROCEDURE IF EXISTS [shopq].[orders_body_of]

DROP PROCEDURE IF EXISTS [shopq].[orders_read]

DROP PROCEDURE IF EXISTS [shopq].[orders_send]

DROP PROCEDURE IF EXISTS [shopq].[orders_send_batch]

DROP PROCEDURE IF EXISTS [shopq].[orders_delete]

DROP PROCEDURE IF EXISTS [shopq].[orders_archive]

DROP PROCEDURE IF EXISTS [shopq].[orders_set_vt]

DROP TABLE IF EXISTS [shopq].[orders_ring]

DROP TABLE IF EXISTS [shopq].[orders_spill]

DROP TABLE IF EXISTS [shopq].[orders_gap]

DROP TABLE IF EXISTS [shopq].[orders_staged]

DROP TABLE IF EXISTS [shopq].[orders_dead]

DROP TABLE IF EXISTS [shopq].[orders_waiters]

DROP TABLE IF EXISTS [shopq].[orders_archive]

DROP TABLE IF EXISTS [shopq].[orders_content]

DROP TABLE IF EXISTS [shopq].[orders_gens]

DROP SEQUENCE IF EXISTS [shopq].[orders_push_seq]

DROP SEQUENCE IF EXISTS [shopq].[orders_pop_seq]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_pushed]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_popped]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_acquired]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_expired]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_settled]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_dead]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_redriven]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_purged]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_archived]

DROP SEQUENCE IF EXISTS [shopq].[orders_n_scavenged]

DROP SEQUENCE IF EXISTS [shopq].[orders_swept]

DELETE FROM [shopq].[dbq_queues] WHERE queue = N'orders'

DELETE FROM [shopq].[dbq_stats_history] WHERE queue = N'orders'

IF NOT EXISTS (SELECT 1 FROM [shopq].[dbq_queues]) DROP TABLE IF EXISTS [shopq].[dbq_queues], [shopq].[dbq_stats_history];
IF NOT EXISTS (SELECT 1 FROM sys.objects WHERE schema_id = SCHEMA_ID(N'shopq'))
  EXEC(N'DROP SCHEMA [shopq]')

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_send') IS NOT NULL BEGIN
  DECLARE @drop nvarchar(max) = N'';
  SELECT @drop = @drop + N'ALTER ROLE [dbq_r_orders_16adecff_send] DROP MEMBER ' + QUOTENAME(USER_NAME(member_principal_id)) + N'; ' FROM sys.database_role_members WHERE role_principal_id = DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_send');
  EXEC(@drop);
  DROP ROLE [dbq_r_orders_16adecff_send];
END

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_receive') IS NOT NULL BEGIN
  DECLARE @drop nvarchar(max) = N'';
  SELECT @drop = @drop + N'ALTER ROLE [dbq_r_orders_16adecff_receive] DROP MEMBER ' + QUOTENAME(USER_NAME(member_principal_id)) + N'; ' FROM sys.database_role_members WHERE role_principal_id = DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_receive');
  EXEC(@drop);
  DROP ROLE [dbq_r_orders_16adecff_receive];
END

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_peek') IS NOT NULL BEGIN
  DECLARE @drop nvarchar(max) = N'';
  SELECT @drop = @drop + N'ALTER ROLE [dbq_r_orders_16adecff_peek] DROP MEMBER ' + QUOTENAME(USER_NAME(member_principal_id)) + N'; ' FROM sys.database_role_members WHERE role_principal_id = DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_peek');
  EXEC(@drop);
  DROP ROLE [dbq_r_orders_16adecff_peek];
END

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_monitor') IS NOT NULL BEGIN
  DECLARE @drop nvarchar(max) = N'';
  SELECT @drop = @drop + N'ALTER ROLE [dbq_r_orders_16adecff_monitor] DROP MEMBER ' + QUOTENAME(USER_NAME(member_principal_id)) + N'; ' FROM sys.database_role_members WHERE role_principal_id = DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_monitor');
  EXEC(@drop);
  DROP ROLE [dbq_r_orders_16adecff_monitor];
END

IF DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_manage') IS NOT NULL BEGIN
  DECLARE @drop nvarchar(max) = N'';
  SELECT @drop = @drop + N'ALTER ROLE [dbq_r_orders_16adecff_manage] DROP MEMBER ' + QUOTENAME(USER_NAME(member_principal_id)) + N'; ' FROM sys.database_role_members WHERE role_principal_id = DATABASE_PRINCIPAL_ID(N'dbq_r_orders_16adecff_manage');
  EXEC(@drop);
  DROP ROLE [dbq_r_orders_16adecff_manage];
END

IF SCHEMA_ID(N'shopq') IS NULL AND DATABASE_PRINCIPAL_ID(N'dbq_o_shopq_7bf52350') IS NOT NULL DROP ROLE [dbq_o_shopq_7bf52350]

-- calls

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_push] ?, ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_push_many] ?, ?, ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_take] ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_pop] ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_pop_many] ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_release] ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_ack] ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_ack_many] ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_nack] ?, ?, ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_repair] ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_void_holes] ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_stats]; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_defer] ?, ?, ?, ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_extend] ?, ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_redrive] ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_purge_dead] ?, ?; COMMIT TRAN;

SET XACT_ABORT ON; BEGIN TRAN; EXEC [shopq].[orders_scavenge] ?, ?; COMMIT TRAN;

-- client reads

SELECT TOP (?) w.msg_id, COALESCE(w.body, (SELECT c.body FROM [shopq].[orders_content] c WHERE c.bucket = w.msg_id % 8 AND c.msg_id = w.msg_id)), w.attempts, w.headers FROM (SELECT msg_id, body, attempts, headers FROM [shopq].[orders_ring] WHERE state = 1 AND (visible_at IS NULL OR visible_at <= SYSUTCDATETIME()) AND (expires_at IS NULL OR expires_at > SYSUTCDATETIME()) UNION ALL SELECT msg_id, body, attempts, headers FROM [shopq].[orders_spill] WHERE state = 1 AND (visible_at IS NULL OR visible_at <= SYSUTCDATETIME()) AND (expires_at IS NULL OR expires_at > SYSUTCDATETIME())) w ORDER BY w.msg_id

SELECT dead_letter_queue FROM [shopq].[dbq_queues] WHERE queue = ?

SELECT TOP (?) msg_id, attempts, error, DATEDIFF_BIG(millisecond, '1970-01-01', pushed_at) / 1000.0, DATEDIFF_BIG(millisecond, '1970-01-01', dead_at) / 1000.0, body, source, headers FROM [shopq].[orders_dead] WHERE source = ? ORDER BY msg_id, source

SELECT TOP (?) msg_id, attempts, error, DATEDIFF_BIG(millisecond, '1970-01-01', pushed_at) / 1000.0, DATEDIFF_BIG(millisecond, '1970-01-01', dead_at) / 1000.0, body, source, headers FROM [shopq].[orders_dead] ORDER BY msg_id, source

SELECT * FROM [shopq].[dbq_queues] WHERE queue = ?

DELETE FROM [errors].[dlq_dead] WHERE source = N'shopq.orders'

SELECT msg_id, attempts, DATEDIFF_BIG(millisecond, '1970-01-01', pushed_at) / 1000.0, DATEDIFF_BIG(millisecond, '1970-01-01', acked_at) / 1000.0, body, headers FROM [shopq].[orders_archive] WHERE acked_at >= CAST(? AS datetime2(3)) ORDER BY acked_at, msg_id OFFSET 0 ROWS FETCH NEXT ? ROWS ONLY

SELECT DATEDIFF_BIG(millisecond, '1970-01-01', at) / 1000.0, depth, in_flight, pushed, popped, acquired, expired, oldest_age_s FROM [shopq].[dbq_stats_history] WHERE queue = ? AND at >= CAST(? AS datetime2(3)) AND at < CAST(? AS datetime2(3)) ORDER BY at

-- staging (dbq.spark)

INSERT INTO [shopq].[orders_staged] (stage, seq, first_seq, packed) VALUES (?, ?, ?, ?)

SELECT packed FROM [shopq].[orders_staged] WHERE stage = ? AND seq > ? AND first_seq <= ? ORDER BY seq

SELECT max(seq) FROM [shopq].[orders_staged] WHERE stage = ? AND seq > ?

DELETE FROM [shopq].[orders_staged] WHERE stage = ? AND seq <= ?

DELETE FROM [shopq].[orders_staged] WHERE stage = ? AND seq > ?

DELETE FROM [shopq].[orders_staged] WHERE stage = ?

-- observe

SELECT CAST(PARSENAME(CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)), 4) AS int), (SELECT compatibility_level FROM sys.databases WHERE database_id = DB_ID())

SELECT COUNT(*) FROM sys.schemas WHERE name = ?

SELECT o.name, CASE o.type WHEN 'U' THEN 'r' WHEN 'SO' THEN 'S' END FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(?) AND o.type IN ('U', 'SO') AND o.name IN (SELECT value FROM STRING_SPLIT(?, ','))

SELECT o.name FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(?) AND o.type = 'P' AND o.name IN (SELECT value FROM STRING_SPLIT(?, ','))

SELECT (SELECT COUNT_BIG(*) FROM [shopq].[orders_ring] WHERE state = 1) + (SELECT COUNT_BIG(*) FROM [shopq].[orders_spill] WHERE state = 1), (SELECT COUNT_BIG(*) FROM [shopq].[orders_ring] WHERE state = 2) + (SELECT COUNT_BIG(*) FROM [shopq].[orders_spill] WHERE state = 2)

-- statistics history

INSERT INTO [shopq].[dbq_stats_history] (queue, at, depth, in_flight, pushed, popped, acquired, expired, oldest_age_s) VALUES (N'orders', SYSUTCDATETIME(), ?, ?, ?, ?, ?, ?, ?)

DELETE FROM [shopq].[dbq_stats_history] WHERE queue = N'orders' AND at < DATEADD(second, -CAST(? AS int), SYSUTCDATETIME())

SELECT TOP 1 DATEDIFF_BIG(millisecond, at, SYSUTCDATETIME()) / 1000.0, pushed, popped + acquired FROM [shopq].[dbq_stats_history] WHERE queue = N'orders' AND at >= DATEADD(second, -CAST(? AS int), SYSUTCDATETIME()) ORDER BY at

-- the schema's lock around provisioning and teardown

DECLARE @granted int;
EXEC @granted = sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session';
IF @granted < 0 BEGIN
  DECLARE @why nvarchar(200) = CONCAT(N'dbq: the schema lock was not granted (sp_getapplock returned ', @granted, N')');
  THROW 51000, @why, 1;
END;

DECLARE @lock nvarchar(255) = ?, @released int; IF APPLOCK_MODE('public', @lock, 'Session') <> 'NoLock' EXEC @released = sys.sp_releaseapplock @Resource = @lock, @LockOwner = 'Session';

-- online resize

SELECT slot_base, size FROM [shopq].[orders_gens] ORDER BY first_pos DESC

SELECT count(*) FROM [shopq].[orders_ring] WHERE slot IN (0, 999)

SELECT first_pos, slot_base, size, (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_pop_seq]')) FROM [shopq].[orders_gens] ORDER BY first_pos

SELECT CASE WHEN (SELECT count(*) FROM [shopq].[orders_gens]) > 1
  OR (SELECT min(slot) FROM [shopq].[orders_ring]) < (SELECT min(slot_base) FROM [shopq].[orders_gens])
  OR (SELECT max(slot) FROM [shopq].[orders_ring]) >= (SELECT max(slot_base + size) FROM [shopq].[orders_gens]) THEN 1 ELSE 0 END

SET NOCOUNT ON; DECLARE @got int;
EXEC @got = sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session', @LockTimeout = 0;
SELECT CASE WHEN @got >= 0 THEN 1 ELSE 0 END

DECLARE @lock nvarchar(255) = ?, @released int; IF APPLOCK_MODE('public', @lock, 'Session') <> 'NoLock' EXEC @released = sys.sp_releaseapplock @Resource = @lock, @LockOwner = 'Session';

WITH n AS (
  SELECT TOP (4000) 1000 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS slot
  FROM sys.all_columns a CROSS JOIN sys.all_columns b CROSS JOIN sys.all_columns c)
INSERT INTO [shopq].[orders_ring] (slot, state, body)
SELECT n.slot, 0, CAST(REPLICATE(CAST(0x00 AS varbinary(max)), 300) AS varbinary(7000))
FROM n WHERE NOT EXISTS (SELECT 1 FROM [shopq].[orders_ring] r WHERE r.slot = n.slot)

SET NOCOUNT ON; SET XACT_ABORT ON;
DECLARE @fenced int, @boundary bigint, @updated int;
BEGIN TRANSACTION;
EXEC @fenced = sys.sp_getapplock @Resource = N'dbq-fence:shopq.orders', @LockMode = 'Exclusive',
  @LockOwner = 'Transaction', @LockTimeout = 100;
IF @fenced < 0 OR @@TRANCOUNT = 0 THROW 50011, N'dbq: the resize fence is busy', 1;
SET @boundary = (SELECT CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1 ELSE CAST(current_value AS bigint) END FROM sys.sequences WHERE object_id = OBJECT_ID(N'[shopq].[orders_push_seq]')) + 1;
UPDATE [shopq].[orders_gens] SET slot_base = 1000, size = 4000, started_at = SYSUTCDATETIME()
WHERE first_pos = @boundary;
SET @updated = @@ROWCOUNT;
IF @updated = 0
  INSERT INTO [shopq].[orders_gens] (first_pos, slot_base, size) VALUES (@boundary, 1000, 4000);
UPDATE [shopq].[dbq_queues] SET ring_size = 4000, updated_at = SYSUTCDATETIME() WHERE queue = N'orders';
COMMIT TRANSACTION;

SET NOCOUNT ON;
DECLARE @moved int = 1;
WHILE @moved > 0 BEGIN
  UPDATE TOP (4000) [shopq].[orders_ring] WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, CASE WHEN deleted.lease > 0 THEN 2 ELSE 1 END, deleted.lease, deleted.attempts,
    deleted.pushed_at, CASE WHEN deleted.lease > 0 THEN deleted.visible_at ELSE SYSUTCDATETIME() END,
    deleted.expires_at, deleted.body, deleted.headers
  INTO [shopq].[orders_spill] (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  WHERE slot >= 0 AND slot < 1000 AND state <> 0;
  SET @moved = @@ROWCOUNT;
END

SET NOCOUNT ON;
DECLARE @gone int;
DELETE FROM [shopq].[orders_gens] WHERE first_pos = 1
  AND first_pos < (SELECT MAX(first_pos) FROM [shopq].[orders_gens])
  AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_ring] WHERE slot >= 0 AND slot < 1000 AND state <> 0);
SET @gone = @@ROWCOUNT;
SELECT @gone

DELETE FROM [shopq].[orders_ring] WHERE slot >= 0 AND slot < 1000 AND state = 0
  AND NOT EXISTS (SELECT 1 FROM [shopq].[orders_gens] g WHERE slot >= g.slot_base AND slot < g.slot_base + g.size)

SELECT coalesce(min(slot), 0), coalesce(max(slot), -1) FROM [shopq].[orders_ring]

SELECT count(*) FROM [shopq].[orders_ring] WHERE slot >= 0 AND slot < 1000 AND state = 2

-- maintenance

SELECT name, 0, 0 FROM sys.objects WHERE 1 = 0 AND schema_id = SCHEMA_ID(?)

SELECT i.name, o.name, ps.page_count, 0, ps.avg_fragmentation_in_percent FROM sys.dm_db_index_physical_stats(DB_ID(), NULL, NULL, NULL, 'LIMITED') AS ps JOIN sys.indexes AS i ON i.object_id = ps.object_id AND i.index_id = ps.index_id JOIN sys.objects AS o ON o.object_id = ps.object_id WHERE o.schema_id = SCHEMA_ID(?) AND o.name IN (N'orders_ring', N'orders_spill', N'orders_gap', N'orders_staged', N'orders_dead', N'orders_waiters', N'orders_archive', N'orders_content', N'orders_gens') AND ps.index_level = 0 AND i.name IS NOT NULL

SELECT CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8) THEN 1 ELSE 0 END

DECLARE @granted int; EXEC @granted = sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session', @LockTimeout = 0; SELECT CASE WHEN @granted >= 0 THEN 1 ELSE 0 END

DECLARE @lock nvarchar(255) = ?, @released int; IF APPLOCK_MODE('public', @lock, 'Session') <> 'NoLock' EXEC @released = sys.sp_releaseapplock @Resource = @lock, @LockOwner = 'Session'; SELECT 1

ALTER INDEX [orders_ring_pkey] ON [shopq].[orders_ring] REORGANIZE

ALTER INDEX [orders_ring_pkey] ON [shopq].[orders_ring] REBUILD WITH (ONLINE = ON)
