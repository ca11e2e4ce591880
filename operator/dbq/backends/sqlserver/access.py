"""A QueueUser's login on SQL Server: a contained database user with a password (the database's
containment is PARTIAL), a member of the database roles of its rights (`MsRing.create_roles`).

The operator's user needs ALTER ANY USER and ALTER ANY ROLE in the database, and ALTER ANY
CONNECTION on the server to end a dropped user's sessions. SQL Server has no per-user
connection limit: spec.connectionLimit is PostgreSQL's only. Not run here (no SQL Server on the
machine dbq is built on): pinned by golden T-SQL and the grammar check; run live where
DBQ_MSSQL_DSN names a server.
"""

from __future__ import annotations

import pyodbc

from dbq.names import check_role, ms_quote

# The user, made or given a new password (parameters: the user, the password or NULL to keep it).
# The password is bound, never in the statement text; QUOTENAME makes it a literal of the DDL.
SET_USER = """SET NOCOUNT ON;
DECLARE @u sysname = ?, @p nvarchar(128) = ?, @sql nvarchar(max);
IF DATABASE_PRINCIPAL_ID(@u) IS NULL
  SET @sql = N'CREATE USER ' + QUOTENAME(@u) + N' WITH PASSWORD = ' + QUOTENAME(@p, N'''');
ELSE IF @p IS NOT NULL
  SET @sql = N'ALTER USER ' + QUOTENAME(@u) + N' WITH PASSWORD = ' + QUOTENAME(@p, N'''');
IF @sql IS NOT NULL EXEC sys.sp_executesql @sql;"""
USER_EXISTS = "SELECT COUNT(*) FROM sys.database_principals WHERE name = ? AND type = 'S'"
# The dbq group roles a user is a member of (parameter: the user).
MEMBERSHIPS = (
    "SELECT r.name FROM sys.database_role_members m"
    " JOIN sys.database_principals r ON r.principal_id = m.role_principal_id"
    " JOIN sys.database_principals u ON u.principal_id = m.member_principal_id"
    " WHERE u.name = ? AND r.name LIKE 'dbq[_]r[_]%'"
)
# Its sessions ended, then the user dropped (parameter: the user); answers how many ended.
DROP_USER = """SET NOCOUNT ON;
DECLARE @u sysname = ?, @kill nvarchar(max) = N'', @ended int = 0, @drop nvarchar(max);
SELECT @kill = @kill + N'KILL ' + CAST(session_id AS nvarchar(10)) + N'; ', @ended = @ended + 1
FROM sys.dm_exec_sessions WHERE original_login_name = @u AND database_id = DB_ID();
EXEC sys.sp_executesql @kill;
IF DATABASE_PRINCIPAL_ID(@u) IS NOT NULL SET @drop = N'DROP USER ' + QUOTENAME(@u);
IF @drop IS NOT NULL EXEC sys.sp_executesql @drop;
SELECT @ended;"""


def grant_statement(login: str, group: str) -> str:
    return (
        f"IF IS_ROLEMEMBER(N'{check_role(group)}', N'{check_role(login)}') = 0"
        f" ALTER ROLE {ms_quote(group)} ADD MEMBER {ms_quote(login)}"
    )


def revoke_statement(login: str, group: str) -> str:
    return (
        f"IF IS_ROLEMEMBER(N'{check_role(group)}', N'{check_role(login)}') = 1"
        f" ALTER ROLE {ms_quote(group)} DROP MEMBER {ms_quote(login)}"
    )


class MsLogins:
    """A QueueUser's contained user in one database, over an operator's connection."""

    def __init__(self, cur: pyodbc.Cursor) -> None:
        self.cur = cur

    def set_login(self, login: str, password: str | None, connection_limit: int) -> None:
        """Create the user, or set its password (None: keep it); no connection limit here."""
        self.cur.execute(SET_USER, check_role(login), password)

    def exists(self, login: str) -> bool:
        return bool(self.cur.execute(USER_EXISTS, check_role(login)).fetchval())

    def groups(self, login: str) -> set[str]:
        return {r[0] for r in self.cur.execute(MEMBERSHIPS, check_role(login)).fetchall()}

    def grant(self, login: str, group: str) -> None:
        self.cur.execute(grant_statement(login, group))

    def revoke(self, login: str, group: str) -> None:
        self.cur.execute(revoke_statement(login, group))

    def drop(self, login: str) -> int:
        return int(self.cur.execute(DROP_USER, check_role(login)).fetchval() or 0)
