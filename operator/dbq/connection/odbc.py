"""ODBC connections (PostgreSQL through psqlODBC, SQL Server through its driver), and driver
errors, of pyodbc and of psycopg (`postgres.py`), translated into `dbq.errors` with the password
masked. The twin of `cassandra.py`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import pyodbc

from dbq.connection import DEFAULT_DRIVERS, SQLSERVER_DRIVERS, ConnectionSettings
from dbq.connection.tls import refusal
from dbq.errors import (
    AuthenticationFailed,
    DatabaseError,
    DatabaseUnreachable,
    MessageTooLarge,
    PermissionDenied,
    QueueNotFound,
)

CONNECT_TIMEOUT_S = 5
# Deadlock, serialization failure: the statement was rolled back whole and may be run again.
RETRY_STATES = frozenset({"40P01", "40001"})
RETRIES = 5  # how many times a call rolled back so is made again
# The object named does not exist: PostgreSQL (undefined table, schema), SQL Server (invalid
# object name).
UNDEFINED_OBJECT_STATES = frozenset({"42P01", "3F000", "42S02"})
UNDEFINED_FUNCTION = "42883"
# Insufficient privilege: PostgreSQL; SQL Server's permission errors (229, 230) come as 42000,
# told by their text.
PERMISSION_STATES = frozenset({"42501"})
# A body over spec.messages.maxBytes, refused by the routine (PostgreSQL raises 22001).
TOO_LARGE_STATE = "22001"


# What a call to PostgreSQL or SQL Server raises, through either driver.
DRIVER_ERRORS: tuple[type[Exception], ...] = (pyodbc.Error, psycopg.Error)

T = TypeVar("T")


def rolled_back(e: Exception) -> bool:
    """Whether the database rolled the statement back whole (a deadlock, a serialization
    failure): it changed nothing and may be run again."""
    return sql_state(e) in RETRY_STATES


def sql_state(e: Exception) -> str:
    """The SQLSTATE of a driver error ('' when it has none)."""
    if isinstance(e, psycopg.Error):
        return e.sqlstate or ""
    return str(e.args[0]) if e.args else ""


def retried(call: Callable[[], T]) -> T:
    """`call()`, made again after 1, 2, 4... ms while the database rolls it back, at most RETRIES
    times; the error of the last try, or any other error at once, propagates."""
    for attempt in range(RETRIES):
        try:
            return call()
        except DRIVER_ERRORS as e:
            if not rolled_back(e):
                raise
        time.sleep(0.001 * 2**attempt)
    return call()


def connect(settings: ConnectionSettings) -> pyodbc.Connection:
    """A connection in autocommit mode: each routine call is one transaction, the only round
    trip of the call; DDL plans and maintenance open their own transactions."""
    try:
        return pyodbc.connect(with_driver(settings).odbc(), autocommit=True, timeout=CONNECT_TIMEOUT_S)
    except pyodbc.Error as e:
        raise translate(e, settings) from None


def with_driver(settings: ConnectionSettings) -> ConnectionSettings:
    """SQL Server without a driver named: the first of SQLSERVER_DRIVERS installed here."""
    if settings.driver or settings.backend != "sqlserver":
        return settings
    installed = set(pyodbc.drivers())
    found = next((d for d in SQLSERVER_DRIVERS if d in installed), "")
    return dataclasses.replace(settings, driver=found) if found else settings


def driver_error(e: Exception, settings: ConnectionSettings) -> tuple[str, str]:
    """(SQLSTATE, message) of a driver error, the password masked out of the message."""
    state = sql_state(e)
    text = str(e.args[1] if len(e.args) > 1 and not isinstance(e, psycopg.Error) else e)
    if settings.password:
        text = text.replace(settings.password, "***")
    return state, text.strip()


def translate(
    e: Exception, settings: ConnectionSettings, queue: str = "", right: str = ""
) -> DatabaseError | MessageTooLarge | PermissionDenied | QueueNotFound:
    """The error of the family that says what happened; the message keeps no credentials. A
    client names the queue (schema.queue) and the right its call needed: a refusal then says
    which right is missing, and a missing object that the queue is not there."""
    state, text = driver_error(e, settings)
    if queue and (
        state in PERMISSION_STATES or "permission denied" in text or "permission was denied" in text
    ):
        return PermissionDenied.lacking(settings.endpoint, settings.username, queue, right)
    if queue and state in UNDEFINED_OBJECT_STATES | {UNDEFINED_FUNCTION}:
        return QueueNotFound(f"{settings.endpoint}: {queue} is not provisioned ({text[:200]})")
    if "Can't open lib" in text:
        wanted = settings.driver or DEFAULT_DRIVERS.get(settings.backend, "")
        return DatabaseError(
            f"{settings.endpoint}: the ODBC driver {wanted!r} is not installed where dbq runs: install it"
            f" (for SQL Server msodbcsql18, or Debian's tdsodbc as 'FreeTDS'), or name an installed one with"
            f" ?driver=... in the url or `driver` in the Secret (installed: {', '.join(pyodbc.drivers()) or 'none'})"
        )
    if state == TOO_LARGE_STATE or "larger than spec.messages.maxBytes" in text:
        return MessageTooLarge(text[:300])
    if "password authentication failed" in text or state in ("28000", "28P01"):
        return AuthenticationFailed(
            f"{settings.endpoint}: authentication failed for user {settings.username!r}"
        )
    if (tls := refusal(text)) is not None:
        return DatabaseUnreachable(f"{settings.endpoint}: {tls}")
    if (
        state in ("08001", "08006", "08S01", "HYT00")
        or "could not connect" in text
        or "connection failed" in text  # psycopg's
        or "Connection refused" in text
    ):
        return DatabaseUnreachable(f"{settings.endpoint}: cannot connect ({text[:200]})")
    return DatabaseError(f"{settings.endpoint}: {text[:400]}")
