"""PostgreSQL through psycopg: the clients' connections (the ring's data plane, notifications).

psycopg speaks PostgreSQL's binary protocol: a 1 MiB body travels as its bytes, where psqlODBC
spends about 16 ms of client CPU a MiB decoding its text form (`bench/message_size.py`). The
operator's own statements (DDL plans, maintenance) stay on ODBC (`dbq.connection.odbc`).

`Connection.cursor()` takes the ODBC calling convention (`?` placeholders, parameters as
arguments, `fetchval`), so the statements and code the ring client shares with SQL Server
(pyodbc) are written once. Its errors are `psycopg.Error`s: `dbq.connection.odbc.translate` turns
them (and pyodbc's) into `dbq.errors`.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import set_json_loads

from dbq.connection import ConnectionSettings
from dbq.connection.tls import libpq_tls

CONNECT_TIMEOUT_S = 5


# What dbq's client calls its sessions (unless the url names another): the operator counts those
# logged in with its own login, which applications should not hold (Queue status).
CLIENT_APPLICATION = "dbq-client"


def connect(settings: ConnectionSettings) -> psycopg.Connection[Any]:
    """A psycopg connection in autocommit mode (each routine call its own transaction). The url's
    options that libpq knows (`sslmode`, `sslrootcert`, `application_name`...) are passed on;
    those only psqlODBC reads are left to it. A Secret's `ca` verifies the server (`tls`). Raises psycopg.Error."""
    conninfo = make_conninfo(
        host=settings.host,
        port=settings.port,
        dbname=settings.database,
        user=settings.username,
        password=settings.password,
        connect_timeout=CONNECT_TIMEOUT_S,
        **(
            {"application_name": CLIENT_APPLICATION}
            | libpq_options(settings.options)
            | libpq_tls(settings.ca, settings.options)
        ),
    )
    conn = psycopg.connect(conninfo, autocommit=True, cursor_factory=psycopg.RawCursor)
    set_json_loads(_json_text, conn)  # JSON columns (headers) come back as their text, as over ODBC
    return conn


def libpq_options(options: dict[str, str]) -> dict[str, str]:
    """The url options (any case, as ODBC takes them) that are libpq connection parameters."""
    known = _libpq_keywords()
    return {key.lower(): value for key, value in options.items() if key.lower() in known}


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    taken_here = {"host", "port", "dbname", "user", "password", "connect_timeout"}
    return frozenset(o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()) - taken_here


def _json_text(data: str | bytes) -> str:
    return data if isinstance(data, str) else bytes(data).decode()


class Connection:
    """A psycopg connection whose cursors take `?` placeholders and return results in binary."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn  # its cursor_factory is psycopg.RawCursor (`connect`)

    @classmethod
    def open(cls, settings: ConnectionSettings) -> Connection:
        return cls(connect(settings))

    def cursor(self) -> Cursor:
        return Cursor(cast("psycopg.RawCursor[Any]", self.raw.cursor(binary=True)))

    @property
    def autocommit(self) -> bool:
        return self.raw.autocommit

    @autocommit.setter
    def autocommit(self, on: bool) -> None:
        self.raw.autocommit = on

    def commit(self) -> None:
        self.raw.commit()

    def rollback(self) -> None:
        self.raw.rollback()

    def close(self) -> None:
        self.raw.close()


class Cursor:
    """`execute(statement, *params)` with `?` placeholders, as a pyodbc cursor."""

    def __init__(self, cur: psycopg.RawCursor[Any]) -> None:
        self.raw = cur

    def execute(self, statement: str, *params: Any) -> Cursor:
        self.raw.execute(placeholders(statement) if params else statement, params or None)
        return self

    @property
    def description(self) -> Any:
        return self.raw.description

    def fetchone(self) -> Any:
        return self.raw.fetchone()

    def fetchall(self) -> list[Any]:
        return self.raw.fetchall()

    def fetchval(self) -> Any:
        row = self.raw.fetchone()
        return None if row is None else row[0]


@functools.lru_cache(maxsize=1024)
def placeholders(statement: str) -> str:
    """`statement` with PostgreSQL's own placeholders: the n-th `?` outside quotes becomes `$n`
    (psycopg's raw cursors pass the text through as it is). A ring statement never uses the
    jsonb `?` operator: SQL Server's side of the same text takes `?` for a placeholder too."""
    out: list[str] = []
    quote = ""
    count = 0
    for ch in statement:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "?":
            count += 1
            out.append(f"${count}")
            continue
        out.append(ch)
    return "".join(out)
