-- The ring's procedures on SQL Server, one CREATE OR ALTER per procedure, separated by `--;;` lines.
--
-- Rendered by `dbq.backends.ring_sql.render_template` with the placeholders of the PostgreSQL
-- routines (see backends/postgres/ring_routines.sql), procedures as {fn_<verb>}, and
-- {record}, {take_record}, {out_record} packing one answer record. A lease is 56 random bits
-- + 1; positions and totals are read from sys.sequences with {drawn}: the last value given out
-- by NEXT VALUE FOR or sys.sp_sequence_get_range, 0 before the first (dbq.contract.broker.SEQUENCE_DRAWN).
-- INSERT ... EXEC cannot nest, so procedures call each other through OUTPUT parameters.
-- Every procedure runs WITH EXECUTE AS OWNER: it reads sys.sequences and OBJECT_ID, whose rows a
-- login with only EXECUTE on the procedures would not see (metadata visibility).
-- Blocks between `-- if archive` and `-- end if` (or `-- else`) are kept only with spec.archive.
-- Headers are JSON text in nvarchar(max) (NULL for none), travelling as in the PostgreSQL
-- routines; {nack_dead_headers} and {repair_dead_headers} write a dead letter's. A size check
-- here is a guard (nvarchar holds UTF-16, at most twice the UTF-8 size the client checks).
-- A body past {max_bytes} bytes waits in {content}, as on PostgreSQL (see its routines): the
-- slot's body is NULL, and whatever ends the message removes it in the same transaction.
-- Generations (version 24 on), as on PostgreSQL: {slot_of:P} is the slot of position P from
-- {gens}, {room} the free slots of the newest generation, {newest_size} its size;
-- {room_in:G} the free slots of generation row G beside {drawn_pair} (as s: both sequences'
-- last positions). {fence} takes
-- the shared side of the applock a resize's switch takes exclusively; it is owned by the
-- transaction push and push_many open around their draw (XACT_ABORT: an error ends both).
--;;
CREATE OR ALTER PROCEDURE {fn_body_of} @id bigint, @remove bit, @body varbinary(max) OUTPUT
WITH EXECUTE AS OWNER
AS BEGIN
  -- The body of message @id kept in {content} (its slot or spill row holds NULL), removed with
  -- @remove: the message ends in the caller's transaction.
  SET NOCOUNT ON;
  SET @body = (SELECT body FROM {content} WITH (ROWLOCK) WHERE bucket = @id % {buckets} AND msg_id = @id);
  IF @body IS NULL THROW 50005, N'dbq: a message of queue {queue} has no body in its content table', 1;
  IF @remove = 1 DELETE FROM {content} WITH (ROWLOCK) WHERE bucket = @id % {buckets} AND msg_id = @id;
END
--;;
CREATE OR ALTER PROCEDURE {fn_place} @id bigint, @body varbinary(max), @ttl_ms bigint, @now datetime2(3),
  @headers nvarchar(max), @placed bit OUTPUT
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @popped bigint, @try int = 0, @rc int;
  SET @placed = 0;
  WHILE 1 = 1 BEGIN
    -- A slot a popper's transaction holds is skipped (READPAST), never waited for: that popper
    -- may itself be waiting for a position this push has drawn, and neither would move.
    UPDATE {ring} WITH (ROWLOCK, READPAST)
      SET msg_id = @id, state = 1, lease = 0, attempts = 0, pushed_at = @now, visible_at = NULL, body = @body,
        headers = @headers, expires_at = CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now)) END
    WHERE slot = {slot_of:@id} AND state = 0;
    SET @rc = @@ROWCOUNT;
    IF @rc = 1 BEGIN SET @placed = 1; RETURN; END;
    -- The slot still holds an earlier lap's message: a leased one, or an orphan whose popper
    -- drew its position a while ago, moves to the spill table.
    SELECT @popped = {drawn} FROM sys.sequences
    WHERE object_id = OBJECT_ID(N'{pop_seq}');
    UPDATE {ring} WITH (ROWLOCK, READPAST) SET state = 0
    OUTPUT deleted.msg_id, CASE WHEN deleted.lease > 0 THEN 2 ELSE 1 END, deleted.lease, deleted.attempts,
      deleted.pushed_at, CASE WHEN deleted.lease > 0 THEN deleted.visible_at ELSE SYSUTCDATETIME() END,
      deleted.expires_at, deleted.body, deleted.headers
    INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
    WHERE slot = {slot_of:@id} AND (state = 2 OR (state = 1 AND @try >= 4 AND msg_id <= @popped));
    SET @try += 1;
    IF @try > 20 BEGIN
      -- Full after all (pushers raced past the check), or a popper kept the slot: the position
      -- becomes void, and the caller tries again.
      INSERT INTO {gap} (pos, reason) SELECT @id, 'void' WHERE NOT EXISTS (SELECT 1 FROM {gap} WHERE pos = @id);
      RETURN;
    END;
    WAITFOR DELAY '00:00:00.001';
  END;
END
--;;
CREATE OR ALTER PROCEDURE {fn_push} @body varbinary(max), @ttl_ms bigint, @headers nvarchar(max) = NULL
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @id bigint, @now datetime2(3) = SYSUTCDATETIME(), @placed bit, @n bigint, @rc int, @fenced int,
    @room bigint, @base bigint, @size bigint, @slot varbinary(max) = @body;
  IF DATALENGTH(@body) > {max_bytes} BEGIN
    IF DATALENGTH(@body) > {max_body_bytes}
      THROW 50001, N'dbq: message is larger than spec.messages.maxBytes ({max_body_bytes}) of queue {queue}', 1;
    SET @slot = NULL;  -- past a slot: the body waits in {content}
  END;
  IF DATALENGTH(@headers) > 2 * {header_bytes}
    THROW 50003, N'dbq: headers are larger than spec.messages.headerBytes ({header_bytes}) of queue {queue}', 1;
  IF @headers IS NOT NULL AND (ISJSON(@headers) = 0 OR LEFT(LTRIM(@headers), 1) <> N'{')
    THROW 50004, N'dbq: headers must be a JSON object of names to values', 1;
  -- The fence, then the room and the draw, in one transaction: a resize's switch waits for this
  -- push to commit, and this push for the switch.
  SET XACT_ABORT ON;
  BEGIN TRANSACTION;
  {fence}
  -- The newest generation (the position drawn is in it: no switch commits before this push).
  SELECT TOP (1) @room = {room_in:gen}, @base = gen.slot_base, @size = gen.size
  FROM {gens} gen CROSS JOIN {drawn_pair} s ORDER BY gen.first_pos DESC;
  IF @room <= 0 BEGIN
    COMMIT TRANSACTION;
    SELECT CAST(-1 AS bigint) AS o_id;  -- full: nothing drawn, so nothing to repair
    RETURN;
  END;
  SET @id = NEXT VALUE FOR {push_seq};
  UPDATE {ring} WITH (ROWLOCK)
    SET msg_id = @id, state = 1, lease = 0, attempts = 0, pushed_at = @now, visible_at = NULL, body = @slot,
      headers = @headers, expires_at = CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now)) END
  WHERE slot = @base + @id % @size AND state = 0;
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    EXEC {fn_place} @id, @slot, @ttl_ms, @now, @headers, @placed OUTPUT;
    IF @placed = 0 BEGIN COMMIT TRANSACTION; SELECT CAST(-1 AS bigint) AS o_id; RETURN; END;
  END;
  IF @slot IS NULL INSERT INTO {content} (bucket, msg_id, body) VALUES (@id % {buckets}, @id, @body);
  COMMIT TRANSACTION;
  SET @n = NEXT VALUE FOR {n_pushed};
  SELECT @id AS o_id;
END
--;;
CREATE OR ALTER PROCEDURE {fn_push_many} @bodies varbinary(max), @lengths nvarchar(max), @ttl_ms bigint,
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
  IF @big > {max_body_bytes}
    THROW 50001, N'dbq: message is larger than spec.messages.maxBytes ({max_body_bytes}) of queue {queue}', 1;
  IF @headers IS NOT NULL BEGIN
    IF ISJSON(@headers) = 0 OR LEFT(LTRIM(@headers), 1) <> N'['
      THROW 50004, N'dbq: headers of several messages are a JSON array of one object (or null) per body', 1;
    IF (SELECT COUNT(*) FROM OPENJSON(@headers)) <> @n
      THROW 50002, N'dbq: push_many got headers for a number of messages other than its bodies', 1;
    IF EXISTS (SELECT 1 FROM OPENJSON(@headers) j WHERE j.type NOT IN (0, 5))
      THROW 50004, N'dbq: headers must be a JSON object of names to values', 1;
    UPDATE b SET headers = CASE WHEN j.type = 5 THEN j.value END
    FROM @in b JOIN OPENJSON(@headers) j ON CAST(j.[key] AS int) + 1 = b.i;
    IF EXISTS (SELECT 1 FROM @in WHERE DATALENGTH(headers) > 2 * {header_bytes})
      THROW 50003, N'dbq: headers are larger than spec.messages.headerBytes ({header_bytes}) of queue {queue}', 1;
  END;
  -- The fence before the room is read, as in push.
  SET XACT_ABORT ON;
  BEGIN TRANSACTION;
  {fence}
  -- The newest generation (the positions drawn are in it: no switch commits before this batch).
  SELECT TOP (1) @used = {room_in:gen}, @base = gen.slot_base, @size = gen.size
  FROM {gens} gen CROSS JOIN {drawn_pair} s ORDER BY gen.first_pos DESC;
  SET @k = CASE WHEN @used < @n THEN CASE WHEN @used > 0 THEN @used ELSE 0 END ELSE @n END;
  IF @k > 0 BEGIN
    -- One contiguous range of positions for the batch, then one set-based update.
    EXEC sys.sp_sequence_get_range @sequence_name = N'{push_seq}', @range_size = @k,
      @range_first_value = @first OUTPUT;
    SET @first_id = CAST(@first AS bigint);
    UPDATE @in SET id = @first_id + i - 1 WHERE i <= @k;
    -- A body past a slot waits in {content}: its slot gets NULL.
    UPDATE r WITH (ROWLOCK)
      SET msg_id = b.id, state = 1, lease = 0, attempts = 0, pushed_at = @now, visible_at = NULL,
        body = CASE WHEN b.n > {max_bytes} THEN NULL ELSE b.body END, headers = b.headers, expires_at = CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now)) END
    FROM {ring} r JOIN @in b ON r.slot = @base + b.id % @size
    WHERE b.id IS NOT NULL AND r.state = 0;
    UPDATE b SET done = 1 FROM @in b JOIN {ring} r ON r.slot = @base + b.id % @size AND r.msg_id = b.id;
    -- Slots an earlier lap still holds take the slow path, one by one.
    SET @i = 1;
    WHILE @i <= @k BEGIN
      IF EXISTS (SELECT 1 FROM @in WHERE i = @i AND done = 0) BEGIN
        DECLARE @one bigint = @first_id + @i - 1,
          @b varbinary(max) = (SELECT CASE WHEN n > {max_bytes} THEN NULL ELSE body END FROM @in WHERE i = @i),
          @h nvarchar(max) = (SELECT headers FROM @in WHERE i = @i);
        EXEC {fn_place} @one, @b, @ttl_ms, @now, @h, @placed OUTPUT;
        UPDATE @in SET done = @placed WHERE i = @i;
      END;
      SET @i += 1;
    END;
    IF @big > {max_bytes}
      INSERT INTO {content} (bucket, msg_id, body)
      SELECT id % {buckets}, id, body FROM @in WHERE done = 1 AND n > {max_bytes};
  END;
  COMMIT TRANSACTION;
  SELECT @c = COUNT(*) FROM @in WHERE done = 1;
  WHILE @c > 0 BEGIN SET @used = NEXT VALUE FOR {n_pushed}; SET @c -= 1; END;
  SELECT STRING_AGG(CAST(CASE WHEN done = 1 THEN id ELSE -1 END AS nvarchar(max)), N',')
    WITHIN GROUP (ORDER BY i) AS o_ids
  FROM @in;
END
--;;
CREATE OR ALTER PROCEDURE {fn_claim} @pos bigint, @lease_ms bigint, @count bit, @status int OUTPUT,
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
      UPDATE {ring} WITH (ROWLOCK) SET state = 0, @body = body, @attempts = attempts, @headers = headers,
        @pushed_at = pushed_at
      WHERE slot = {slot_of:@pos} AND msg_id = @pos AND state = 1 AND (expires_at IS NULL OR expires_at > @now);
      SET @got = @@ROWCOUNT;
    END ELSE BEGIN
      SET @lease = CAST(CRYPT_GEN_RANDOM(7) AS bigint) + 1;
      UPDATE {ring} WITH (ROWLOCK) SET state = 2, lease = @lease, @attempts = attempts = attempts + 1,
        @visible = visible_at = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, @now)),
        @body = body, @headers = headers, @pushed_at = pushed_at
      WHERE slot = {slot_of:@pos} AND msg_id = @pos AND state = 1 AND (expires_at IS NULL OR expires_at > @now);
      SET @got = @@ROWCOUNT;
    END;
    IF @got = 1 BEGIN
      IF @body IS NULL EXEC {fn_body_of} @pos, @remove, @body OUTPUT;
      IF @count = 1 AND @lease_ms <= 0 SET @n = NEXT VALUE FOR {n_popped};
      IF @count = 1 AND @lease_ms > 0 SET @n = NEXT VALUE FOR {n_acquired};
      -- if archive
      IF @lease_ms <= 0 BEGIN
        INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
        SELECT msg_id, attempts, pushed_at, SYSUTCDATETIME(), @body, headers FROM {ring} WHERE slot = {slot_of:@pos};
        IF @count = 1 SET @n = NEXT VALUE FOR {n_archived};
      END;
      -- end if
      SET @status = 0;
      RETURN;
    END;
    SET @lease = NULL;
    SELECT @msg = msg_id, @state = state, @exp = expires_at FROM {ring} WHERE slot = {slot_of:@pos};
    IF @msg = @pos AND @state = 1 BEGIN
      IF @exp IS NULL OR @exp > @now CONTINUE;  -- written after the update looked: take it now
      UPDATE {ring} WITH (ROWLOCK) SET state = 0, @big = CASE WHEN body IS NULL THEN 1 ELSE 0 END
      WHERE slot = {slot_of:@pos} AND msg_id = @pos AND state = 1;
      SET @got = @@ROWCOUNT;
      IF @got = 1 SET @n = NEXT VALUE FOR {n_expired};  -- expired (TTL): dropped
      IF @got = 1 AND @big = 1 DELETE FROM {content} WITH (ROWLOCK) WHERE bucket = @pos % {buckets} AND msg_id = @pos;
      SET @status = 3;
      RETURN;
    END;
    IF @msg >= @pos BEGIN  -- taken by repair, or the ring has lapped a void position
      DELETE FROM {gap} WHERE pos = @pos;
      SET @status = 3;
      RETURN;
    END;
    DELETE FROM {gap} WHERE pos = @pos AND reason = 'void';
    SET @got = @@ROWCOUNT;
    IF @got = 1 BEGIN SET @status = 3; RETURN; END;
    IF @round = 10 OR @pos > (SELECT {drawn} FROM sys.sequences
                              WHERE object_id = OBJECT_ID(N'{push_seq}')) BREAK;
    WAITFOR DELAY '00:00:00.001';
  END;
  SELECT @body = NULL, @attempts = NULL, @headers = NULL;
END
--;;
CREATE OR ALTER PROCEDURE {fn_take} @pos bigint, @lease_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @status int, @body varbinary(max), @lease bigint, @attempts int, @headers nvarchar(max);
  EXEC {fn_claim} @pos, @lease_ms, 1, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT, @headers OUTPUT;
  SELECT {take_record} AS o_record;
END
--;;
CREATE OR ALTER PROCEDURE {fn_next} @lease_ms bigint, @count bit, @status int OUTPUT, @id bigint OUTPUT,
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
  -- One pop in {spill_share} looks there first while the ring has messages, and every pop when
  -- it has none: looking costs a statement most pops can skip, and none waits for ever.
  SET @look = CASE WHEN RAND() * {spill_share} < 1 THEN 1 ELSE 0 END;
  redeliveries:
  -- 1. Redeliveries.
  WHILE @look = 1 BEGIN
    SET @id = NULL;
    SELECT TOP (1) @id = msg_id, @exp = expires_at, @big = CASE WHEN body IS NULL THEN 1 ELSE 0 END
    FROM {spill} WITH (ROWLOCK, UPDLOCK, READPAST)
    WHERE state = 1 AND visible_at <= @now ORDER BY visible_at;
    IF @id IS NULL BREAK;
    IF @exp IS NOT NULL AND @exp <= @now BEGIN  -- expired while waiting
      DELETE FROM {spill} WHERE msg_id = @id;
      IF @big = 1 DELETE FROM {content} WITH (ROWLOCK) WHERE bucket = @id % {buckets} AND msg_id = @id;
      SET @n = NEXT VALUE FOR {n_expired};
      CONTINUE;
    END;
    IF @lease_ms <= 0 BEGIN
      SELECT @body = body, @attempts = attempts, @headers = headers, @pushed_at = pushed_at FROM {spill} WHERE msg_id = @id;
      IF @big = 1 EXEC {fn_body_of} @id, @remove, @body OUTPUT;
      -- if archive
      INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT msg_id, attempts, pushed_at, SYSUTCDATETIME(), @body, headers FROM {spill} WHERE msg_id = @id;
      IF @count = 1 SET @n = NEXT VALUE FOR {n_archived};
      -- end if
      DELETE FROM {spill} WHERE msg_id = @id;
      IF @count = 1 SET @n = NEXT VALUE FOR {n_popped};
    END ELSE BEGIN
      SET @lease = CAST(CRYPT_GEN_RANDOM(7) AS bigint) + 1;
      UPDATE {spill} SET state = 2, lease = @lease, @attempts = attempts = attempts + 1, @body = body,
        @headers = headers, @pushed_at = pushed_at,
        @visible = visible_at = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, SYSUTCDATETIME()))
      WHERE msg_id = @id;
      IF @big = 1 EXEC {fn_body_of} @id, @remove, @body OUTPUT;
      IF @count = 1 SET @n = NEXT VALUE FOR {n_acquired};
    END;
    SET @status = 0;
    RETURN;
  END;
  -- 2. The ring, in push order.
  WHILE 1 = 1 BEGIN
    SELECT @ahead = SUM(CASE WHEN object_id = OBJECT_ID(N'{push_seq}') THEN 1 ELSE -1 END
                        * {drawn})
    FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'{push_seq}'), OBJECT_ID(N'{pop_seq}'));
    IF @ahead <= 0 BEGIN
      IF @look = 0 BEGIN SET @look = 1; GOTO redeliveries; END;
      -- Nothing new. A position whose popper gave up may have received its message since.
      SET @pos = NULL;
      SELECT TOP (1) @pos = g.pos FROM {gap} g WITH (ROWLOCK, UPDLOCK, READPAST)
      JOIN {ring} r ON r.slot = {slot_of:g.pos} AND r.msg_id = g.pos
      WHERE g.reason = 'skipped' AND r.state = 1;
      IF @pos IS NOT NULL BEGIN
        DELETE FROM {gap} WHERE pos = @pos;
        EXEC {fn_claim} @pos, @lease_ms, @count, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
          @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
        IF @status = 0 BEGIN SET @id = @pos; RETURN; END;
      END;
      SELECT @status = 1, @id = NULL;
      RETURN;
    END;
    SET @pos = NEXT VALUE FOR {pop_seq};
    EXEC {fn_claim} @pos, @lease_ms, @count, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
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
--;;
CREATE OR ALTER PROCEDURE {fn_pop} @lease_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @status int, @id bigint, @body varbinary(max), @lease bigint, @attempts int, @headers nvarchar(max);
  EXEC {fn_next} @lease_ms, 1, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
    @headers OUTPUT;
  SELECT {record} AS o_record;
END
--;;
CREATE OR ALTER PROCEDURE {fn_pop_many} @max int, @lease_ms bigint
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
        AND EXISTS (SELECT 1 FROM {spill} WITH (READPAST) WHERE state = 1 AND visible_at <= @now) BEGIN
    EXEC {fn_next} @lease_ms, 0, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
      @headers OUTPUT;
    IF @status = 1 BREAK;
    INSERT INTO @out VALUES (@status, @id, @body, @lease, @attempts, @headers);
    IF @status = 2 BREAK;  -- the caller waits for that position
  END;
  SELECT @ahead = SUM(CASE WHEN object_id = OBJECT_ID(N'{push_seq}') THEN 1 ELSE -1 END
                      * {drawn})
  FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'{push_seq}'), OBJECT_ID(N'{pop_seq}'));
  SET @k = @max - (SELECT COUNT(*) FROM @out);
  IF @ahead < @k SET @k = CASE WHEN @ahead > 0 THEN @ahead ELSE 0 END;
  IF @status = 2 OR @k <= 0 BEGIN
    IF NOT EXISTS (SELECT 1 FROM @out) BEGIN  -- empty: the single pop also looks at given-up positions
      EXEC {fn_next} @lease_ms, 0, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
        @headers OUTPUT;
      IF @status <> 1 INSERT INTO @out VALUES (@status, @id, @body, @lease, @attempts, @headers);
    END;
    GOTO answer;
  END;
  -- 2. The ring: one contiguous range of positions, their slots claimed in one update.
  EXEC sys.sp_sequence_get_range @sequence_name = N'{pop_seq}', @range_size = @k,
    @range_first_value = @first OUTPUT;
  SET @first_pos = CAST(@first AS bigint);
  INSERT INTO @pos (pos) SELECT TOP (@k) @first_pos + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1
  FROM sys.all_columns;
  IF @lease_ms <= 0
    UPDATE r WITH (ROWLOCK) SET state = 0
    OUTPUT 0, inserted.msg_id, inserted.body, NULL, inserted.attempts, inserted.headers INTO @out
    FROM {ring} r JOIN @pos p ON r.slot = {slot_of:p.pos}
    WHERE r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > @now);
  ELSE
    UPDATE r WITH (ROWLOCK) SET state = 2, lease = CAST(CRYPT_GEN_RANDOM(7) AS bigint) + 1, attempts = attempts + 1,
      visible_at = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, @now))
    OUTPUT 0, inserted.msg_id, inserted.body, inserted.lease, inserted.attempts, inserted.headers INTO @out
    FROM {ring} r JOIN @pos p ON r.slot = {slot_of:p.pos}
    WHERE r.msg_id = p.pos AND r.state = 1 AND (r.expires_at IS NULL OR r.expires_at > @now);
  UPDATE p SET taken = 1 FROM @pos p JOIN @out o ON o.o_id = p.pos;
  -- Bodies past a slot come from {content}; a pop removes them.
  IF EXISTS (SELECT 1 FROM @out WHERE o_status = 0 AND o_body IS NULL) BEGIN
    DECLARE @bodies TABLE (msg_id bigint PRIMARY KEY, body varbinary(max));
    INSERT INTO @bodies (msg_id, body)
    SELECT c.msg_id, c.body FROM {content} c WITH (ROWLOCK)
    JOIN @out o ON c.bucket = o.o_id % {buckets} AND c.msg_id = o.o_id WHERE o.o_status = 0 AND o.o_body IS NULL;
    IF @lease_ms <= 0
      DELETE c FROM {content} c WITH (ROWLOCK) JOIN @bodies b ON c.bucket = b.msg_id % {buckets} AND c.msg_id = b.msg_id;
    UPDATE o SET o_body = b.body FROM @out o JOIN @bodies b ON b.msg_id = o.o_id WHERE o.o_status = 0;
  END;
  -- if archive
  IF @lease_ms <= 0
    INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
    SELECT r.msg_id, r.attempts, r.pushed_at, SYSUTCDATETIME(), o.o_body, r.headers
    FROM {ring} r JOIN @pos p ON r.slot = {slot_of:p.pos} AND r.msg_id = p.pos
    JOIN @out o ON o.o_id = p.pos AND o.o_status = 0 WHERE p.taken = 1;
  -- end if
  -- 3. Positions not claimed above: expired, gone, or not written yet (status 2 for the caller).
  SET @p = (SELECT MIN(pos) FROM @pos WHERE taken = 0);
  WHILE @p IS NOT NULL BEGIN
    EXEC {fn_claim} @p, @lease_ms, 0, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT, @headers OUTPUT;
    IF @status IN (0, 2) INSERT INTO @out VALUES (@status, @p, @body, @lease, @attempts, @headers);
    SET @p = (SELECT MIN(pos) FROM @pos WHERE taken = 0 AND pos > @p);
  END;
  answer:
  -- Counted once, at the end: the totals are sequences, which a rollback (a deadlock victim
  -- retried by its client) does not undo, so nothing is counted before the last lock is taken.
  SELECT @c = COUNT(*) FROM @out WHERE o_status = 0;
  WHILE @c > 0 BEGIN
    IF @lease_ms <= 0 SET @n = NEXT VALUE FOR {n_popped}; ELSE SET @n = NEXT VALUE FOR {n_acquired};
    -- if archive
    IF @lease_ms <= 0 SET @n = NEXT VALUE FOR {n_archived};
    -- end if
    SET @c -= 1;
  END;
  SELECT {out_record} AS o_record FROM @out ORDER BY o_status, o_id;
END
--;;
CREATE OR ALTER PROCEDURE {fn_release} @positions nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @released int;
  -- The popper that drew these positions gives up waiting: whoever finds their messages later
  -- (pop on an empty ring, or repair) delivers them.
  INSERT INTO {gap} (pos, reason)
  SELECT DISTINCT CAST(s.value AS bigint), 'skipped' FROM STRING_SPLIT(@positions, N',') s
  WHERE NOT EXISTS (SELECT 1 FROM {gap} g WHERE g.pos = CAST(s.value AS bigint));
  SET @released = @@ROWCOUNT;
  SELECT @released AS o_released;
END
--;;
CREATE OR ALTER PROCEDURE {fn_ack} @id bigint, @lease bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @n bigint, @rc int, @big bit = 0, @body varbinary(max);
  DECLARE @acked TABLE (msg_id bigint, attempts int, pushed_at datetime2(3), headers nvarchar(max), big bit);
  -- if archive
  -- A body in the row goes to the archive in the same statement; one in {content} after it.
  UPDATE {ring} WITH (ROWLOCK) SET state = 0
  OUTPUT inserted.msg_id, inserted.attempts, inserted.pushed_at, SYSUTCDATETIME(), inserted.body, inserted.headers
    INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
  WHERE slot = {slot_of:@id} AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME()
    AND body IS NOT NULL;
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    DELETE FROM {spill}
    OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, SYSUTCDATETIME(), deleted.body, deleted.headers
      INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME() AND body IS NOT NULL;
    SET @rc = @@ROWCOUNT;
  END;
  IF @rc = 0 BEGIN
    UPDATE {ring} WITH (ROWLOCK) SET state = 0
    OUTPUT inserted.msg_id, inserted.attempts, inserted.pushed_at, inserted.headers, 1 INTO @acked
    WHERE slot = {slot_of:@id} AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
    SET @rc = @@ROWCOUNT;
    IF @rc = 0 BEGIN
      DELETE FROM {spill} OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.headers, 1 INTO @acked
      WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
      SET @rc = @@ROWCOUNT;
    END;
    IF @rc = 1 BEGIN
      EXEC {fn_body_of} @id, 1, @body OUTPUT;
      INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
      SELECT msg_id, attempts, pushed_at, SYSUTCDATETIME(), @body, headers FROM @acked;
    END;
  END;
  -- else
  UPDATE {ring} WITH (ROWLOCK) SET state = 0, @big = CASE WHEN body IS NULL THEN 1 ELSE 0 END
  WHERE slot = {slot_of:@id} AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    DELETE FROM {spill} OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.headers,
      CASE WHEN deleted.body IS NULL THEN 1 ELSE 0 END INTO @acked
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
    SET @rc = @@ROWCOUNT;
    IF @rc = 1 SET @big = (SELECT big FROM @acked);
  END;
  IF @big = 1 DELETE FROM {content} WITH (ROWLOCK) WHERE bucket = @id % {buckets} AND msg_id = @id;
  -- end if
  IF @rc = 1
  BEGIN
    SET @n = NEXT VALUE FOR {n_popped};
    SET @n = NEXT VALUE FOR {n_settled};  -- the lease ended
    -- if archive
    SET @n = NEXT VALUE FOR {n_archived};
    -- end if
    SELECT 1 AS o_ok;
  END;
  ELSE SELECT 0 AS o_ok;
END
--;;
CREATE OR ALTER PROCEDURE {fn_ack_many} @ids nvarchar(max), @leases nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @n bigint, @c bigint;
  DECLARE @a TABLE (id bigint PRIMARY KEY, lease bigint);
  DECLARE @done TABLE (id bigint, big bit);  -- big: its body is in {content}
  INSERT INTO @a (id, lease)
  SELECT CAST(i.value AS bigint), CAST(l.value AS bigint)
  FROM OPENJSON(N'[' + @ids + N']') i JOIN OPENJSON(N'[' + @leases + N']') l ON l.[key] = i.[key];
  UPDATE r WITH (ROWLOCK) SET state = 0
  OUTPUT inserted.msg_id, CASE WHEN inserted.body IS NULL THEN 1 ELSE 0 END INTO @done
  FROM {ring} r JOIN @a a ON r.slot = {slot_of:a.id} AND r.msg_id = a.id AND r.state = 2 AND r.lease = a.lease AND r.visible_at > SYSUTCDATETIME();
  -- if archive
  INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT r.msg_id, r.attempts, r.pushed_at, SYSUTCDATETIME(), ISNULL(r.body, c.body), r.headers
  FROM {ring} r JOIN @done d ON r.slot = {slot_of:d.id} AND r.msg_id = d.id
  LEFT JOIN {content} c ON d.big = 1 AND c.bucket = d.id % {buckets} AND c.msg_id = d.id;
  DECLARE @gone TABLE (msg_id bigint, attempts int, pushed_at datetime2(3), body varbinary(max),
    headers nvarchar(max));
  DELETE s OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.body, deleted.headers INTO @gone
  FROM {spill} s JOIN @a a ON s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.visible_at > SYSUTCDATETIME()
  WHERE NOT EXISTS (SELECT 1 FROM @done d WHERE d.id = a.id);
  INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT g.msg_id, g.attempts, g.pushed_at, SYSUTCDATETIME(), ISNULL(g.body, c.body), g.headers FROM @gone g
  LEFT JOIN {content} c ON g.body IS NULL AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id;
  INSERT INTO @done (id, big) SELECT msg_id, CASE WHEN body IS NULL THEN 1 ELSE 0 END FROM @gone;
  SELECT @c = COUNT(*) FROM @done;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_archived}; SET @c -= 1; END;
  -- else
  -- A separate statement: a lease moved to the spill table meanwhile is seen here.
  DELETE s OUTPUT deleted.msg_id, CASE WHEN deleted.body IS NULL THEN 1 ELSE 0 END INTO @done
  FROM {spill} s JOIN @a a ON s.msg_id = a.id AND s.state = 2 AND s.lease = a.lease AND s.visible_at > SYSUTCDATETIME()
  WHERE NOT EXISTS (SELECT 1 FROM @done d WHERE d.id = a.id);
  -- end if
  IF EXISTS (SELECT 1 FROM @done WHERE big = 1)
    DELETE c FROM {content} c WITH (ROWLOCK) JOIN @done d ON c.bucket = d.id % {buckets} AND c.msg_id = d.id
    WHERE d.big = 1;
  SELECT @c = COUNT(*) FROM @done;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_popped}; SET @n = NEXT VALUE FOR {n_settled}; SET @c -= 1; END;
  SELECT ISNULL(STRING_AGG(CAST(id AS nvarchar(max)), N','), N'') AS o_acked FROM @done;
END
--;;
CREATE OR ALTER PROCEDURE {fn_nack} @id bigint, @lease bigint, @delay_ms bigint, @error nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- o_ok: 0 no lease, 1 ready again after the delay, 2 dead-lettered (acquired {max_attempts}
  -- times, when that is > 0), in this transaction. A negative delay gives it back unhandled:
  -- ready at once, and this delivery does not count as an attempt.
  -- DATEADD takes an int: the delay goes in as seconds, then the rest in milliseconds.
  DECLARE @wait_ms bigint = CASE WHEN @delay_ms > 0 THEN @delay_ms ELSE 0 END;
  DECLARE @visible datetime2(3) = DATEADD(millisecond, @wait_ms % 1000, DATEADD(second, @wait_ms / 1000, SYSUTCDATETIME()));
  DECLARE @n bigint, @rc int, @taken TABLE (attempts int, pushed_at datetime2(3), expires_at datetime2(3), body varbinary(max),
    spilled bit, headers nvarchar(max));
  BEGIN TRANSACTION;
  UPDATE {ring} WITH (ROWLOCK) SET state = 0
  OUTPUT deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, 0, deleted.headers INTO @taken
  WHERE slot = {slot_of:@id} AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  SET @rc = @@ROWCOUNT;
  IF @rc = 0
    DELETE FROM {spill} WITH (ROWLOCK)
    OUTPUT deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, 1, deleted.headers INTO @taken
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  IF NOT EXISTS (SELECT 1 FROM @taken) BEGIN COMMIT TRANSACTION; SELECT 0 AS o_ok; RETURN; END;
  SET @n = NEXT VALUE FOR {n_settled};  -- the lease ended
  IF @delay_ms < 0
    UPDATE @taken SET attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
  ELSE IF {max_attempts} > 0 AND (SELECT attempts FROM @taken) >= {max_attempts}
  BEGIN
    IF (SELECT body FROM @taken) IS NULL BEGIN  -- a dead letter holds its body
      DECLARE @body varbinary(max);
      EXEC {fn_body_of} @id, 1, @body OUTPUT;
      UPDATE @taken SET body = @body;
    END;
    INSERT INTO {dead} (source, msg_id, attempts, error, pushed_at, body, headers)
    SELECT {dead_source}, @id, t.attempts, LEFT(@error, 4000), t.pushed_at, t.body, {nack_dead_headers} FROM @taken t
    WHERE NOT EXISTS (SELECT 1 FROM {dead} d WHERE d.source = {dead_source} AND d.msg_id = @id);
    COMMIT TRANSACTION;
    SET @n = NEXT VALUE FOR {n_dead};
    SELECT 2 AS o_ok; RETURN;
  END;
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT @id, 1, 0, t.attempts, t.pushed_at, @visible, t.expires_at, t.body, t.headers FROM @taken t;
  COMMIT TRANSACTION;
  SELECT 1 AS o_ok;
END
--;;
CREATE OR ALTER PROCEDURE {fn_repair} @orphan_grace_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @now datetime2(3) = SYSUTCDATETIME(), @popped bigint, @leases bigint, @orphans bigint,
    @expired bigint, @gaps bigint, @c bigint, @n bigint, @dead bigint;
  DECLARE @freed TABLE (msg_id bigint, big bit);
  SELECT @popped = {drawn} FROM sys.sequences
  WHERE object_id = OBJECT_ID(N'{pop_seq}');
  -- Rows a client is changing right now are skipped (READPAST): repair never waits on a client.
  -- Leases past their visibility timeout: ready again, out of ring order; those acquired
  -- {max_attempts} times (when that is > 0) go to the dead letters instead, in one transaction.
  DECLARE @lapsed TABLE (msg_id bigint, attempts int, pushed_at datetime2(3), expires_at datetime2(3),
    body varbinary(max), headers nvarchar(max));
  BEGIN TRANSACTION;
  UPDATE {ring} WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, deleted.headers
    INTO @lapsed
  WHERE state = 2 AND visible_at < @now;
  DELETE FROM {spill} WITH (ROWLOCK, READPAST)
  OUTPUT deleted.msg_id, deleted.attempts, deleted.pushed_at, deleted.expires_at, deleted.body, deleted.headers
    INTO @lapsed
  WHERE state = 2 AND visible_at < @now;
  INSERT INTO {dead} (source, msg_id, attempts, error, pushed_at, body, headers)
  SELECT {dead_source}, l.msg_id, l.attempts, N'lease expired (visibility timeout)', l.pushed_at,
    ISNULL(l.body, c.body), {repair_dead_headers} FROM @lapsed l
  LEFT JOIN {content} c ON l.body IS NULL AND c.bucket = l.msg_id % {buckets} AND c.msg_id = l.msg_id
  WHERE {max_attempts} > 0 AND l.attempts >= {max_attempts}
    AND NOT EXISTS (SELECT 1 FROM {dead} d WHERE d.source = {dead_source} AND d.msg_id = l.msg_id);
  SET @dead = @@ROWCOUNT;
  DELETE c FROM {content} c WITH (ROWLOCK) JOIN @lapsed l ON c.bucket = l.msg_id % {buckets} AND c.msg_id = l.msg_id
  WHERE l.body IS NULL AND {max_attempts} > 0 AND l.attempts >= {max_attempts};
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT l.msg_id, 1, 0, l.attempts, l.pushed_at, @now, l.expires_at, l.body, l.headers FROM @lapsed l
  WHERE NOT ({max_attempts} > 0 AND l.attempts >= {max_attempts});
  COMMIT TRANSACTION;
  SELECT @leases = COUNT(*) FROM @lapsed;
  SET @c = @leases;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_settled}; SET @c -= 1; END;
  SET @c = @dead;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_dead}; SET @c -= 1; END;
  -- Orphans: ready messages whose pop position was drawn but never claimed.
  UPDATE {ring} WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, 1, 0, deleted.attempts, deleted.pushed_at, @now, deleted.expires_at, deleted.body,
    deleted.headers
  INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  WHERE state = 1 AND msg_id <= @popped AND pushed_at <= DATEADD(millisecond, (-@orphan_grace_ms) % 1000, DATEADD(second, (-@orphan_grace_ms) / 1000, @now))
    AND (expires_at IS NULL OR expires_at > @now);
  SET @orphans = @@ROWCOUNT;
  -- Expired messages (TTL): free the slot; a position not drawn yet becomes void.
  UPDATE {ring} WITH (ROWLOCK, READPAST) SET state = 0
  OUTPUT deleted.msg_id, CASE WHEN deleted.body IS NULL THEN 1 ELSE 0 END INTO @freed
  WHERE state = 1 AND expires_at <= @now;
  SET @expired = @@ROWCOUNT;
  INSERT INTO {gap} (pos, reason) SELECT f.msg_id, 'void' FROM @freed f
  WHERE f.msg_id > @popped AND NOT EXISTS (SELECT 1 FROM {gap} g WHERE g.pos = f.msg_id);
  DELETE FROM {spill} WITH (ROWLOCK, READPAST)
  OUTPUT deleted.msg_id, CASE WHEN deleted.body IS NULL THEN 1 ELSE 0 END INTO @freed  -- (after the gaps)
  WHERE state = 1 AND expires_at <= @now;
  SET @expired += @@ROWCOUNT;
  DELETE c FROM {content} c WITH (ROWLOCK) JOIN @freed f ON c.bucket = f.msg_id % {buckets} AND c.msg_id = f.msg_id
  WHERE f.big = 1;
  -- Content whose message is gone: none should be (see the PostgreSQL routine); at most 1000 a run.
  DELETE c FROM {content} c WITH (ROWLOCK, READPAST)
  JOIN (SELECT TOP (1000) x.bucket, x.msg_id FROM {content} x WITH (READPAST)
    WHERE NOT EXISTS (SELECT 1 FROM {ring} r WHERE r.slot = {slot_of:x.msg_id} AND r.msg_id = x.msg_id AND r.state <> 0)
      AND NOT EXISTS (SELECT 1 FROM {spill} s WHERE s.msg_id = x.msg_id)) gone
    ON c.bucket = gone.bucket AND c.msg_id = gone.msg_id;
  SET @c = @expired;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_expired}; SET @c -= 1; END;
  -- Gaps a whole lap of the largest generation behind the pop position, or older than every
  -- generation, can never be written any more.
  DELETE g FROM {gap} g
  WHERE (g.pos <= @popped - (SELECT MAX(x.size) FROM {gens} x) OR g.pos < (SELECT MIN(x.first_pos) FROM {gens} x))
    AND NOT EXISTS (SELECT 1 FROM {ring} r WHERE r.slot = {slot_of:g.pos} AND r.msg_id = g.pos AND r.state = 1);
  SET @gaps = @@ROWCOUNT;
  SELECT @leases AS o_expired_leases, @orphans AS o_orphans, @expired AS o_expired, @gaps AS o_gaps_purged,
    @dead AS o_dead;
END
--;;
CREATE OR ALTER PROCEDURE {fn_void_holes} @grace_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- Holes: positions a pusher drew and never wrote. One drawn before a message already older
  -- than the grace is stalled: void it (a late write becomes an orphan that repair delivers).
  DECLARE @popped bigint, @bound bigint, @holes bigint;
  SELECT @popped = {drawn} FROM sys.sequences
  WHERE object_id = OBJECT_ID(N'{pop_seq}');
  SELECT @bound = MAX(msg_id) FROM {ring}
  WHERE state = 1 AND msg_id > @popped AND pushed_at <= DATEADD(millisecond, (-@grace_ms) % 1000, DATEADD(second, (-@grace_ms) / 1000, SYSUTCDATETIME()));
  IF @bound IS NULL BEGIN SELECT CAST(0 AS bigint); RETURN; END;
  -- Per generation, each of its slots stands for the one position of its part of
  -- (@popped, @bound) that maps to it (a part never spans more than a lap).
  INSERT INTO {gap} (pos, reason)
  SELECT c.p, 'void' FROM (
    SELECT r.msg_id, w.hi, w.lo + ((r.slot - w.slot_base - w.lo % w.size + w.size) % w.size) AS p
    FROM (SELECT x.slot_base, x.size,
            CASE WHEN @popped + 1 > x.first_pos THEN @popped + 1 ELSE x.first_pos END AS lo,
            ISNULL(LEAD(x.first_pos) OVER (ORDER BY x.first_pos), @bound) AS hi
          FROM {gens} x) AS w
    JOIN {ring} r ON r.slot >= w.slot_base AND r.slot < w.slot_base + w.size
    WHERE w.lo < w.hi) AS c
  WHERE c.p < @bound AND c.p < c.hi AND (c.msg_id IS NULL OR c.msg_id <> c.p)
    AND NOT EXISTS (SELECT 1 FROM {gap} g WHERE g.pos = c.p);
  SET @holes = @@ROWCOUNT;
  SELECT @holes;
END
--;;
CREATE OR ALTER PROCEDURE {fn_stats}
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- From the totals, not a count of the ring (see the PostgreSQL routine).
  DECLARE @pushed bigint, @popped bigint, @acquired bigint, @expired bigint, @settled bigint, @pos bigint,
    @dead bigint, @redriven bigint, @purged bigint, @delayed bigint, @in_flight bigint, @depth bigint,
    @archived bigint, @scavenged bigint, @oldest datetime2(3);
  SELECT
    @pushed = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_pushed}') THEN v END),
    @popped = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_popped}') THEN v END),
    @acquired = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_acquired}') THEN v END),
    @expired = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_expired}') THEN v END),
    @settled = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_settled}') THEN v END),
    @dead = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_dead}') THEN v END),
    @redriven = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_redriven}') THEN v END),
    @purged = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_purged}') THEN v END),
    @archived = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_archived}') THEN v END),
    @scavenged = MAX(CASE WHEN object_id = OBJECT_ID(N'{n_scavenged}') THEN v END),
    @pos = MAX(CASE WHEN object_id = OBJECT_ID(N'{pop_seq}') THEN v END)
  FROM (SELECT object_id, {drawn} AS v FROM sys.sequences
    WHERE object_id IN (OBJECT_ID(N'{n_pushed}'), OBJECT_ID(N'{n_popped}'), OBJECT_ID(N'{n_acquired}'),
      OBJECT_ID(N'{n_expired}'), OBJECT_ID(N'{n_settled}'), OBJECT_ID(N'{n_dead}'), OBJECT_ID(N'{n_redriven}'),
      OBJECT_ID(N'{n_purged}'), OBJECT_ID(N'{n_archived}'), OBJECT_ID(N'{n_scavenged}'),
      OBJECT_ID(N'{pop_seq}'))) s;
  SET @in_flight = CASE WHEN @acquired > @settled THEN @acquired - @settled ELSE 0 END;
  SELECT @delayed = COUNT_BIG(*) FROM {spill} WHERE state = 1 AND visible_at > SYSUTCDATETIME();
  SET @depth = @pushed + @redriven - @popped - @expired - @dead - @in_flight - @delayed;
  IF @depth < 0 SET @depth = 0;
  -- The oldest ready message, from a bounded look at the head.
  SELECT @oldest = MIN(pushed_at) FROM (
    SELECT r.pushed_at FROM {ring} r
    JOIN (SELECT TOP ({head_look}) @pos + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS pos FROM sys.all_objects) p
      ON r.slot = {slot_of:p.pos} AND r.msg_id = p.pos
    WHERE r.state = 1
    UNION ALL
    SELECT r.pushed_at FROM {gap} g JOIN {ring} r ON r.slot = {slot_of:g.pos} AND r.msg_id = g.pos
    WHERE g.reason = 'skipped' AND r.state = 1
    UNION ALL
    SELECT s.pushed_at FROM (SELECT TOP ({head_look}) state, pushed_at, visible_at FROM {spill} ORDER BY msg_id) s
    WHERE s.state = 1 AND s.visible_at <= SYSUTCDATETIME()) head;
  SELECT @depth AS o_depth, @in_flight AS o_in_flight, @pushed AS o_pushed, @popped AS o_popped,
    @acquired AS o_acquired, @expired AS o_expired,
    CASE WHEN @depth > 0 THEN ISNULL(DATEDIFF_BIG(millisecond, @oldest, SYSUTCDATETIME()) / 1000.0, 0) ELSE 0 END
      AS o_oldest_age_s,
    CASE WHEN @dead > @redriven + @purged THEN @dead - @redriven - @purged ELSE 0 END AS o_dead,
    @delayed AS o_delayed,
    CASE WHEN @archived > @scavenged THEN @archived - @scavenged ELSE 0 END AS o_archived;
END
--;;
CREATE OR ALTER PROCEDURE {fn_defer} @bodies varbinary(max), @lengths nvarchar(max), @ttl_ms bigint, @delay_ms bigint,
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
  IF @big > {max_body_bytes}  -- a delayed message's spill row holds its body, whatever its size
    THROW 50001, N'dbq: message is larger than spec.messages.maxBytes ({max_body_bytes}) of queue {queue}', 1;
  IF @headers IS NOT NULL BEGIN
    IF ISJSON(@headers) = 0 OR LEFT(LTRIM(@headers), 1) <> N'['
      THROW 50004, N'dbq: headers of several messages are a JSON array of one object (or null) per body', 1;
    IF (SELECT COUNT(*) FROM OPENJSON(@headers)) <> @n
      THROW 50002, N'dbq: defer got headers for a number of messages other than its bodies', 1;
    IF EXISTS (SELECT 1 FROM OPENJSON(@headers) j WHERE j.type NOT IN (0, 5))
      THROW 50004, N'dbq: headers must be a JSON object of names to values', 1;
    UPDATE b SET headers = CASE WHEN j.type = 5 THEN j.value END
    FROM @in b JOIN OPENJSON(@headers) j ON CAST(j.[key] AS int) + 1 = b.i;
    IF EXISTS (SELECT 1 FROM @in WHERE DATALENGTH(headers) > 2 * {header_bytes})
      THROW 50003, N'dbq: headers are larger than spec.messages.headerBytes ({header_bytes}) of queue {queue}', 1;
  END;
  IF @n = 0 BEGIN SELECT N'' AS o_ids; RETURN; END;
  SET @delay_ms = CASE WHEN @delay_ms > 0 THEN @delay_ms ELSE 0 END;
  SET @visible = DATEADD(millisecond, @delay_ms % 1000, DATEADD(second, @delay_ms / 1000, @now));
  EXEC sys.sp_sequence_get_range @sequence_name = N'{push_seq}', @range_size = @n, @range_first_value = @first OUTPUT;
  SET @first_id = CAST(@first AS bigint);
  BEGIN TRANSACTION;
  INSERT INTO {gap} (pos, reason) SELECT @first_id + i - 1, 'void' FROM @in b
  WHERE NOT EXISTS (SELECT 1 FROM {gap} g WHERE g.pos = @first_id + b.i - 1);
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT @first_id + i - 1, 1, 0, 0, @now, @visible,
    CASE WHEN @ttl_ms > 0 THEN DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @visible)) END, body,
    headers FROM @in;
  COMMIT TRANSACTION;
  SET @c = @n;
  WHILE @c > 0 BEGIN SET @used = NEXT VALUE FOR {n_pushed}; SET @c -= 1; END;
  SELECT STRING_AGG(CAST(@first_id + i - 1 AS nvarchar(max)), N',') WITHIN GROUP (ORDER BY i) AS o_ids FROM @in;
END
--;;
CREATE OR ALTER PROCEDURE {fn_extend} @id bigint, @lease bigint, @visibility_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @rc int, @lease_ms bigint = CASE WHEN @visibility_ms > 1 THEN @visibility_ms ELSE 1 END;
  DECLARE @until datetime2(3) = DATEADD(millisecond, @lease_ms % 1000, DATEADD(second, @lease_ms / 1000, SYSUTCDATETIME()));
  UPDATE {ring} WITH (ROWLOCK) SET visible_at = @until
  WHERE slot = {slot_of:@id} AND msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
  SET @rc = @@ROWCOUNT;
  IF @rc = 0 BEGIN
    UPDATE {spill} WITH (ROWLOCK) SET visible_at = @until
    WHERE msg_id = @id AND state = 2 AND lease = @lease AND visible_at > SYSUTCDATETIME();
    SET @rc = @@ROWCOUNT;
  END;
  SELECT CASE WHEN @rc = 1 THEN 1 ELSE 0 END AS o_ok;
END
--;;
CREATE OR ALTER PROCEDURE {fn_redrive} @ids nvarchar(max), @max int
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- Dead letters back to delivery (the given ids, or the oldest @max when none are given):
  -- headers as pushed (without dbq's dead-letter keys).
  DECLARE @moved TABLE (msg_id bigint, pushed_at datetime2(3), body varbinary(max), headers nvarchar(max));
  DECLARE @c bigint, @n bigint;
  BEGIN TRANSACTION;
  DELETE d OUTPUT deleted.msg_id, deleted.pushed_at, deleted.body, deleted.headers INTO @moved
  FROM {dead} d WITH (ROWLOCK, READPAST)
  WHERE d.source = {dead_source} AND d.msg_id IN (SELECT TOP (@max) x.msg_id FROM {dead} x WITH (READPAST)
    WHERE x.source = {dead_source}
      AND (@ids = N'' OR x.msg_id IN (SELECT CAST(value AS bigint) FROM OPENJSON(N'[' + @ids + N']')))
    ORDER BY x.msg_id);
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT m.msg_id, 1, 0, 0, m.pushed_at, SYSUTCDATETIME(), NULL, m.body,
    NULLIF(JSON_MODIFY(JSON_MODIFY(m.headers, N'$."dbq-error"', NULL), N'$."dbq-attempts"', NULL), N'{}')
  FROM @moved m
  WHERE NOT EXISTS (SELECT 1 FROM {spill} s WHERE s.msg_id = m.msg_id);
  COMMIT TRANSACTION;
  SELECT @c = COUNT(*) FROM @moved;
  SELECT @c AS o_moved;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_redriven}; SET @c -= 1; END;
END
--;;
CREATE OR ALTER PROCEDURE {fn_purge_dead} @ids nvarchar(max), @max int
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @c bigint, @n bigint;
  DELETE d FROM {dead} d WITH (ROWLOCK, READPAST)
  WHERE d.source = {dead_source} AND d.msg_id IN (SELECT TOP (@max) x.msg_id FROM {dead} x WITH (READPAST)
    WHERE x.source = {dead_source}
      AND (@ids = N'' OR x.msg_id IN (SELECT CAST(value AS bigint) FROM OPENJSON(N'[' + @ids + N']')))
    ORDER BY x.msg_id);
  SET @c = @@ROWCOUNT;
  SELECT @c AS o_purged;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_purged}; SET @c -= 1; END;
END
--;;
CREATE OR ALTER PROCEDURE {fn_scavenge} @retention_ms bigint, @max int
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- Archived messages older than the retention, the oldest @max of them: one bounded batch (see
  -- the PostgreSQL routine).
  DECLARE @c bigint, @n bigint;
  DELETE a FROM (SELECT TOP (@max) * FROM {archive} WITH (ROWLOCK, READPAST)
    WHERE acked_at < DATEADD(second, -CAST(@retention_ms / 1000 AS int), SYSUTCDATETIME()) ORDER BY acked_at) a;
  SET @c = @@ROWCOUNT;
  SELECT @c AS o_scavenged;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_scavenged}; SET @c -= 1; END;
END
--;;
-- The row contract (see the PostgreSQL routines): answers as rows, refusals as errors. Headers
-- are JSON text; send_batch takes its bodies end to end with their lengths, as push_many does
-- (T-SQL has no arrays a driver binds). read takes message by message through next.
CREATE OR ALTER PROCEDURE {fn_read} @qty int, @visibility_ms bigint, @wait_ms bigint = 0
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @rows TABLE (i int IDENTITY PRIMARY KEY, msg_id bigint, lease bigint, attempts int,
    enqueued_at datetime2(3), visible_at datetime2(3), headers nvarchar(max), body varbinary(max));
  DECLARE @status int, @id bigint, @body varbinary(max), @lease bigint, @attempts int, @headers nvarchar(max),
    @pushed_at datetime2(3), @visible datetime2(3), @since datetime2(3), @until datetime2(3), @got int = 0,
    @grace bigint;
  IF @qty IS NULL OR @qty < 1
    THROW 50002, N'dbq: read from queue {queue}: qty must be at least 1', 1;
  IF @visibility_ms IS NULL OR @visibility_ms < 0
    THROW 50002, N'dbq: read from queue {queue}: visibility_ms must be 0 (at most once) or a lease in milliseconds', 1;
  IF @wait_ms IS NULL OR @wait_ms < 0
    THROW 50002, N'dbq: read from queue {queue}: wait_ms must be 0 or more', 1;
  -- A position whose push has not committed yet is waited for, up to {hole_grace_ms} ms in all
  -- (a quarter of a shorter lease), then given up as release does.
  SET @grace = CASE WHEN @visibility_ms > 0 AND @visibility_ms / 4 < {hole_grace_ms}
                    THEN @visibility_ms / 4 ELSE {hole_grace_ms} END;
  SET @until = DATEADD(millisecond, @wait_ms % 1000, DATEADD(second, @wait_ms / 1000, SYSUTCDATETIME()));
  WHILE 1 = 1 BEGIN
    SET @since = SYSUTCDATETIME();
    WHILE @got < @qty BEGIN
      EXEC {fn_next} @visibility_ms, 1, @status OUTPUT, @id OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
        @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
      WHILE @status = 2 AND DATEDIFF(millisecond, @since, SYSUTCDATETIME()) < @grace BEGIN
        WAITFOR DELAY '00:00:00.001';
        EXEC {fn_claim} @id, @visibility_ms, 1, @status OUTPUT, @body OUTPUT, @lease OUTPUT, @attempts OUTPUT,
          @headers OUTPUT, @pushed_at OUTPUT, @visible OUTPUT;
      END;
      IF @status = 2
        INSERT INTO {gap} (pos, reason) SELECT @id, 'skipped' WHERE NOT EXISTS (SELECT 1 FROM {gap} WHERE pos = @id);
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
--;;
CREATE OR ALTER PROCEDURE {fn_send} @body varbinary(max), @headers nvarchar(max) = NULL, @delay_ms bigint = 0,
  @ttl_ms bigint = 0
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @one TABLE (o_id bigint);
  DECLARE @deferred TABLE (o_ids nvarchar(max));
  DECLARE @id bigint = -1, @try int = 0, @length nvarchar(20) = CAST(DATALENGTH(@body) AS nvarchar(20)),
    @wrapped nvarchar(max) = N'[' + @headers + N']', @full nvarchar(400);
  IF @body IS NULL
    THROW 50006, N'dbq: send to queue {queue}: a body must not be NULL (send an empty varbinary instead)', 1;
  IF @delay_ms IS NULL OR @delay_ms < 0 OR @ttl_ms IS NULL OR @ttl_ms < 0
    THROW 50002, N'dbq: send to queue {queue}: delay_ms and ttl_ms must be 0 or more', 1;
  IF @delay_ms > 0 BEGIN
    INSERT INTO @deferred EXEC {fn_defer} @body, @length, @ttl_ms, @delay_ms, @wrapped;
    SELECT CAST(o_ids AS bigint) AS msg_id FROM @deferred;
    RETURN;
  END;
  -- push draws a position only while the ring has room; a position it had to give up (a slot an
  -- earlier lap still held) is void, and it is tried again.
  WHILE @try < 5 AND @id < 0 BEGIN
    SET @try += 1;
    DELETE FROM @one;
    INSERT INTO @one EXEC {fn_push} @body, @ttl_ms, @headers;
    SET @id = (SELECT o_id FROM @one);
    IF @id < 0 AND {room} <= 0 BREAK;
  END;
  IF @id < 0 BEGIN
    SET @full = CONCAT(N'dbq: queue {queue} is full: its ring holds ', {newest_size}, N' messages (spec.ring.size)');
    THROW 50007, @full, 1;
  END;
  SELECT @id AS msg_id;
END
--;;
CREATE OR ALTER PROCEDURE {fn_send_batch} @bodies varbinary(max), @lengths nvarchar(max),
  @headers nvarchar(max) = NULL, @delay_ms bigint = 0, @ttl_ms bigint = 0
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  DECLARE @answer TABLE (o_ids nvarchar(max));
  DECLARE @ids nvarchar(max), @full nvarchar(400);
  IF @delay_ms IS NULL OR @delay_ms < 0 OR @ttl_ms IS NULL OR @ttl_ms < 0
    THROW 50002, N'dbq: send_batch to queue {queue}: delay_ms and ttl_ms must be 0 or more', 1;
  IF @delay_ms > 0
    INSERT INTO @answer EXEC {fn_defer} @bodies, @lengths, @ttl_ms, @delay_ms, @headers;
  ELSE
    INSERT INTO @answer EXEC {fn_push_many} @bodies, @lengths, @ttl_ms, @headers;
  SET @ids = (SELECT o_ids FROM @answer);
  -- What the ring took stays sent; a body it did not take answers NULL, to be sent again.
  -- Refused outright only when none was taken.
  IF @ids <> N'' AND NOT EXISTS (SELECT 1 FROM OPENJSON(N'[' + @ids + N']') WHERE CAST(value AS bigint) > 0) BEGIN
    SET @full = CONCAT(N'dbq: queue {queue} is full: its ring holds ', {newest_size},
      N' messages (spec.ring.size); none of the batch was sent');
    THROW 50007, @full, 1;
  END;
  SELECT CASE WHEN CAST(j.value AS bigint) > 0 THEN CAST(j.value AS bigint) END AS msg_id
  FROM OPENJSON(N'[' + ISNULL(@ids, N'') + N']') j ORDER BY CAST(j.[key] AS int);
END
--;;
-- By id, with no lease asked (version 22 on), the ids comma-separated as ack_many takes them: a
-- message is found by its slot (from its generation) or the spill table's key, ready, delayed or leased
-- alike; a lease held on it is lost. An id not there is left out of the answer.
CREATE OR ALTER PROCEDURE {fn_delete} @ids nvarchar(max)
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
  FROM {ring} r JOIN (SELECT DISTINCT id FROM @a) a ON r.slot = {slot_of:a.id} AND r.msg_id = a.id AND r.state IN (1, 2);
  DELETE s OUTPUT deleted.msg_id, deleted.state, deleted.attempts, deleted.pushed_at, deleted.body, deleted.headers INTO @gone
  FROM {spill} s JOIN (SELECT DISTINCT id FROM @a) a ON s.msg_id = a.id
  WHERE NOT EXISTS (SELECT 1 FROM @gone g WHERE g.msg_id = a.id);
  -- if archive
  INSERT INTO {archive} (msg_id, attempts, pushed_at, acked_at, body, headers)
  SELECT g.msg_id, g.attempts, g.pushed_at, SYSUTCDATETIME(), ISNULL(g.body, c.body), g.headers FROM @gone g
  LEFT JOIN {content} c ON g.body IS NULL AND c.bucket = g.msg_id % {buckets} AND c.msg_id = g.msg_id;
  -- end if
  DELETE c FROM {content} c WITH (ROWLOCK) JOIN @gone g ON g.body IS NULL AND c.bucket = g.msg_id % {buckets}
    AND c.msg_id = g.msg_id;
  COMMIT TRANSACTION;
  SELECT @c = COUNT(*) FROM @gone;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_popped}; SET @c -= 1; END;
  -- if archive
  SELECT @c = COUNT(*) FROM @gone;
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_archived}; SET @c -= 1; END;
  -- end if
  SELECT @c = COUNT(*) FROM @gone WHERE state = 2;  -- their leases ended
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_settled}; SET @c -= 1; END;
  SELECT g.msg_id FROM @gone g JOIN (SELECT id, MIN(i) AS i FROM @a GROUP BY id) a ON a.id = g.msg_id ORDER BY a.i;
END
--;;
CREATE OR ALTER PROCEDURE {fn_archive} @ids nvarchar(max)
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON;
  -- delete, for a queue that keeps an archive; refused for one that does not, where nothing would
  -- ever remove the copies.
  -- if archive
  EXEC {fn_delete} @ids;
  -- else
  THROW 50008, N'dbq: queue {queue} keeps no archive: nothing archived; set spec.archive.enabled: true on the Queue (and a retention), or delete the messages instead', 1;
  -- end if
END
--;;
CREATE OR ALTER PROCEDURE {fn_set_vt} @ids nvarchar(max), @visibility_ms bigint
WITH EXECUTE AS OWNER
AS BEGIN
  SET NOCOUNT ON; SET XACT_ABORT ON;
  -- Each message visible again @visibility_ms from now, and not before; its attempts stay. One
  -- that must wait leaves ring order for the spill table, as a nacked one does (a ready one asked
  -- for 0 ms stays where it is). Answers the messages as read does, with no lease.
  IF @visibility_ms IS NULL OR @visibility_ms < 0
    THROW 50002, N'dbq: set_vt on queue {queue}: visibility_ms must be 0 or more', 1;
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
  FROM {ring} r JOIN (SELECT DISTINCT id FROM @a) a ON r.slot = {slot_of:a.id} AND r.msg_id = a.id
  WHERE r.state = 2 OR (r.state = 1 AND @visibility_ms > 0);
  INSERT INTO {spill} (msg_id, state, lease, attempts, pushed_at, visible_at, expires_at, body, headers)
  SELECT msg_id, 1, 0, attempts, pushed_at, @visible, expires_at, body, headers FROM @moved;
  UPDATE s WITH (ROWLOCK) SET state = 1, lease = 0, visible_at = @visible
  OUTPUT deleted.msg_id, deleted.state INTO @kept
  FROM {spill} s JOIN (SELECT DISTINCT id FROM @a) a ON s.msg_id = a.id
  WHERE NOT EXISTS (SELECT 1 FROM @moved m WHERE m.msg_id = a.id);
  COMMIT TRANSACTION;
  SELECT @c = (SELECT COUNT(*) FROM @moved WHERE state = 2) + (SELECT COUNT(*) FROM @kept WHERE state = 2);
  WHILE @c > 0 BEGIN SET @n = NEXT VALUE FOR {n_settled}; SET @c -= 1; END;  -- their leases ended
  SELECT x.msg_id, CAST(NULL AS bigint) AS lease, x.attempts, x.pushed_at AS enqueued_at, x.visible_at, x.headers,
    ISNULL(x.body, c.body) AS body
  FROM (SELECT s.msg_id, s.attempts, s.pushed_at, s.visible_at, s.headers, s.body FROM {spill} s
        WHERE s.msg_id IN (SELECT msg_id FROM @moved UNION SELECT msg_id FROM @kept)
        UNION ALL
        SELECT r.msg_id, r.attempts, r.pushed_at, @visible, r.headers, r.body FROM {ring} r
        JOIN (SELECT DISTINCT id FROM @a) d ON r.slot = {slot_of:d.id} AND r.msg_id = d.id
        WHERE r.state = 1 AND @visibility_ms = 0) x
  LEFT JOIN {content} c ON x.body IS NULL AND c.bucket = x.msg_id % {buckets} AND c.msg_id = x.msg_id
  JOIN (SELECT id, MIN(i) AS i FROM @a GROUP BY id) a ON a.id = x.msg_id ORDER BY a.i;
END
