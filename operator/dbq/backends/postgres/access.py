"""Logins and role memberships on PostgreSQL, through the role helper a DBA installs
(`access_helper.sql`): the operator never holds CREATEROLE.

Passwords reach the server only as SCRAM-SHA-256 verifiers (RFC 7677), computed here: the
statement text a server may log cannot log anyone in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pyodbc

from dbq.backends.ring_sql import load_template, render_template
from dbq.errors import AccessHelperMissing
from dbq.names import check_role

SCRAM_ITERATIONS = 4096  # PostgreSQL's own default (scram_iterations)
# The helper is there, and the caller may use it.
# Integers, not booleans: psqlODBC hands booleans over as '0'/'1' text, and '0' is true in Python.
HELPER_READY = (
    "SELECT coalesce(to_regprocedure('dbq_access.drop_login(text)') IS NOT NULL"
    " AND has_function_privilege(to_regprocedure('dbq_access.drop_login(text)'), 'EXECUTE'), false)::int"
)
IS_SUPERUSER = "SELECT rolsuper::int FROM pg_roles WHERE rolname = current_user"
# The dbq group roles a login is a member of (parameter: the login).
MEMBERSHIPS = (
    "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
    " JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = ? AND g.rolname LIKE 'dbq\\_r\\_%'"
)
LOGIN_EXISTS = "SELECT count(*) FROM pg_roles WHERE rolname = ? AND rolcanlogin"


def quote_role(name: str) -> str:
    """Any role name (the operator's login is not one dbq derives), double-quoted."""
    if not name or len(name.encode()) > 63 or "\x00" in name:
        raise ValueError(f"{name!r} is not a PostgreSQL role name (1 to 63 bytes)")
    return '"' + name.replace('"', '""') + '"'


def helper_statements(operator: str) -> list[str]:
    """The helper's installation, for the operator's login `operator` (a DBA runs it)."""
    template = load_template(__package__ or "dbq.backends.postgres", "access_helper.sql")
    return render_template(template, {"operator": quote_role(operator)})


def ensure_helper(cur: pyodbc.Cursor, database: str, username: str) -> None:
    """The helper is ready for this login; a superuser installs it itself (an operator that ran
    as one before keeps working), any other login gets an error saying what a DBA runs."""
    if int(cur.execute(HELPER_READY).fetchval()):
        return
    if not int(cur.execute(IS_SUPERUSER).fetchval() or 0):
        raise AccessHelperMissing(
            f"database {database}: dbq's role helper is not installed for {username!r}: a DBA runs, as a"
            f" superuser, `dbq access install-sql --operator {username} | psql -d {database}` (once per database)"
        )
    for statement in helper_statements(username):
        cur.execute(statement)


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (rolpassword)."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


class PgLogins:
    """A QueueUser's login on one database, over an operator's connection."""

    def __init__(self, cur: pyodbc.Cursor) -> None:
        self.cur = cur

    def set_login(self, login: str, password: str | None, connection_limit: int) -> None:
        """Create the login, or set its password (None: keep it) and connection limit."""
        verifier = None if password is None else scram_verifier(password)
        self.cur.execute(
            "SELECT dbq_access.set_login(?, ?, ?)", check_role(login), verifier, connection_limit
        ).fetchall()

    def exists(self, login: str) -> bool:
        return bool(self.cur.execute(LOGIN_EXISTS, check_role(login)).fetchval())

    def groups(self, login: str) -> set[str]:
        return {r[0] for r in self.cur.execute(MEMBERSHIPS, check_role(login)).fetchall()}

    def grant(self, login: str, group: str) -> None:
        self.cur.execute(
            "SELECT dbq_access.grant_group(?, ?)", check_role(login), check_role(group)
        ).fetchall()

    def revoke(self, login: str, group: str) -> None:
        self.cur.execute(
            "SELECT dbq_access.revoke_group(?, ?)", check_role(login), check_role(group)
        ).fetchall()

    def drop(self, login: str) -> int:
        """Drop the login, its open sessions ended first: how many were."""
        return int(self.cur.execute("SELECT dbq_access.drop_login(?)", check_role(login)).fetchval() or 0)
