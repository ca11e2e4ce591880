SET NOCOUNT ON;
DECLARE @u sysname = ?, @p nvarchar(128) = ?, @sql nvarchar(max);
IF DATABASE_PRINCIPAL_ID(@u) IS NULL
  SET @sql = N'CREATE USER ' + QUOTENAME(@u) + N' WITH PASSWORD = ' + QUOTENAME(@p, N'''');
ELSE IF @p IS NOT NULL
  SET @sql = N'ALTER USER ' + QUOTENAME(@u) + N' WITH PASSWORD = ' + QUOTENAME(@p, N'''');
IF @sql IS NOT NULL EXEC sys.sp_executesql @sql;

SELECT COUNT(*) FROM sys.database_principals WHERE name = ? AND type = 'S'

SELECT r.name FROM sys.database_role_members m JOIN sys.database_principals r ON r.principal_id = m.role_principal_id JOIN sys.database_principals u ON u.principal_id = m.member_principal_id WHERE u.name = ? AND r.name LIKE 'dbq[_]r[_]%'

IF IS_ROLEMEMBER(N'dbq_r_orders_16adecff_send', N'dbq_u_app_8c39bd63') = 0 ALTER ROLE [dbq_r_orders_16adecff_send] ADD MEMBER [dbq_u_app_8c39bd63]

IF IS_ROLEMEMBER(N'dbq_r_orders_16adecff_send', N'dbq_u_app_8c39bd63') = 1 ALTER ROLE [dbq_r_orders_16adecff_send] DROP MEMBER [dbq_u_app_8c39bd63]

SET NOCOUNT ON;
DECLARE @u sysname = ?, @kill nvarchar(max) = N'', @ended int = 0, @drop nvarchar(max);
SELECT @kill = @kill + N'KILL ' + CAST(session_id AS nvarchar(10)) + N'; ', @ended = @ended + 1
FROM sys.dm_exec_sessions WHERE original_login_name = @u AND database_id = DB_ID();
EXEC sys.sp_executesql @kill;
IF DATABASE_PRINCIPAL_ID(@u) IS NOT NULL SET @drop = N'DROP USER ' + QUOTENAME(@u);
IF @drop IS NOT NULL EXEC sys.sp_executesql @drop;
SELECT @ended;
