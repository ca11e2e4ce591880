"""The operator's connections, shared by every queue of one database: at most `limit` open to
each database, whatever the number of queues, and none opened per tick.

Off until `enable()` (the operator turns it on at start-up): a client, a test or `dbq apply`
connects on its own, so nothing of theirs stays open behind them.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pyodbc

from dbq.connection import ConnectionSettings
from dbq.connection.odbc import connect
from dbq.errors import QueueUnavailable

WAIT_S = 60.0  # how long a borrower waits for a busy database's connection
# A connection is closed on its return once this old (as pgbouncer's server_lifetime): a server
# session that has touched the catalog of a thousand queues keeps all of it cached, and every
# DDL elsewhere then costs it invalidation work.
MAX_AGE_S = 60.0


class OdbcPool:
    def __init__(self, limit: int, wait_s: float = WAIT_S, max_age_s: float = MAX_AGE_S) -> None:
        if limit < 1:
            raise ValueError(f"a pool holds at least one connection per database, not {limit}")
        self.limit = limit
        self.wait_s = wait_s
        self.max_age_s = max_age_s
        self._born: dict[int, tuple[float, int]] = {}  # id of an open connection: when, in which epoch
        self._epoch = 0  # drop_all() starts a new one
        self._lock = threading.Lock()
        # Per database (its connection string): the free slots and the idle connections.
        self._databases: dict[str, tuple[threading.BoundedSemaphore, list[pyodbc.Connection]]] = {}

    def _database(
        self, settings: ConnectionSettings
    ) -> tuple[threading.BoundedSemaphore, list[pyodbc.Connection]]:
        key = settings.odbc()
        with self._lock:
            found = self._databases.get(key)
            if found is None:
                found = self._databases[key] = (threading.BoundedSemaphore(self.limit), [])
            return found

    def take(self, settings: ConnectionSettings) -> pyodbc.Connection:
        """A connection in autocommit mode, idle or new; `give` it back when done."""
        slots, idle = self._database(settings)
        if not slots.acquire(timeout=self.wait_s):
            raise QueueUnavailable(
                f"{settings.endpoint}: the operator's {self.limit} connections to this database stayed busy"
                f" for {self.wait_s:g}s: raise DBQ_DB_CONNECTIONS, or the database's own limit"
            )
        try:
            while (conn := _pop(idle)) is not None:
                try:  # one that broke while idle (a server restart) is dropped, not handed out
                    conn.cursor().execute("SELECT 1").fetchall()
                    return conn
                except pyodbc.Error:
                    self._close(conn)
            conn = connect(settings)
            self._born[id(conn)] = (time.monotonic(), self._epoch)
            return conn
        except BaseException:
            slots.release()
            raise

    def give(self, settings: ConnectionSettings, conn: pyodbc.Connection, broken: bool = False) -> None:
        """Back to the idle ones, or closed when `broken` (or found unusable)."""
        slots, idle = self._database(settings)
        try:
            born, epoch = self._born.get(id(conn), (0.0, -1))
            if broken or epoch != self._epoch or time.monotonic() - born > self.max_age_s:
                self._close(conn)
            else:
                if not conn.autocommit:
                    conn.rollback()
                    conn.autocommit = True
                idle.append(conn)
        except pyodbc.Error:  # closed already, or broken: dropped
            self._born.pop(id(conn), None)
        finally:
            slots.release()

    def _close(self, conn: pyodbc.Connection) -> None:
        self._born.pop(id(conn), None)
        with contextlib.suppress(pyodbc.Error):  # a broken one may refuse even that
            conn.close()

    def drop_all(self) -> None:
        """Close the idle connections, and those lent now when they come back."""
        with self._lock:
            self._epoch += 1
            databases = list(self._databases.values())
        for _, idle in databases:
            while (conn := _pop(idle)) is not None:
                self._close(conn)

    def idle(self, settings: ConnectionSettings) -> int:
        return len(self._database(settings)[1])


def _pop(idle: list[pyodbc.Connection]) -> pyodbc.Connection | None:
    """An idle connection, or None; list.pop is atomic, so no lock is needed."""
    try:
        return idle.pop()
    except IndexError:
        return None


_pool: OdbcPool | None = None


def enable(limit: int) -> None:
    global _pool
    if _pool is None or _pool.limit != limit:
        _pool = OdbcPool(limit)


def disable() -> None:
    """Back to a connection of its own per backend (the idle pooled ones are left to close)."""
    global _pool
    _pool = None


def shared() -> OdbcPool | None:
    """The operator's pool, or None when each backend connects on its own."""
    return _pool
