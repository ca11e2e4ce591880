"""The operator's connections, shared by every queue of one database: at most `limit` open to
each database, whatever the number of queues, and none opened per tick.

Off until `enable()` (the operator turns it on at start-up): a client, a test or `dbq apply`
connects on its own, so nothing of theirs stays open behind them.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from dataclasses import dataclass, field

import pyodbc

from dbq.connection import ConnectionSettings
from dbq.connection.odbc import connect
from dbq.errors import QueueUnavailable

WAIT_S = 60.0  # how long a borrower waits for a busy database's connection
# A connection is closed on its return once this old (as pgbouncer's server_lifetime): a server
# session that has touched the catalog of a thousand queues keeps all of it cached, and every
# DDL elsewhere then costs it invalidation work.
MAX_AGE_S = 60.0


@dataclass
class _Database:
    """One database's connections. Each open one sits on a seat, 0 to limit - 1."""

    slots: threading.BoundedSemaphore  # one per connection that may be lent at once
    idle: dict[int, pyodbc.Connection] = field(default_factory=dict)  # by seat
    seats: set[int] = field(default_factory=set)  # the seats of the open ones, idle or lent


class OdbcPool:
    def __init__(self, limit: int, wait_s: float = WAIT_S, max_age_s: float = MAX_AGE_S) -> None:
        if limit < 1:
            raise ValueError(f"a pool holds at least one connection per database, not {limit}")
        self.limit = limit
        self.wait_s = wait_s
        self.max_age_s = max_age_s
        self._born: dict[int, tuple[float, int, int]] = {}  # id of an open connection: when, epoch, seat
        self._epoch = 0  # drop_all() starts a new one
        self._lock = threading.Lock()
        self._databases: dict[str, _Database] = {}  # by connection string

    def _database(self, settings: ConnectionSettings) -> _Database:
        key = settings.odbc()
        with self._lock:
            found = self._databases.get(key)
            if found is None:
                found = self._databases[key] = _Database(threading.BoundedSemaphore(self.limit))
            return found

    def take(self, settings: ConnectionSettings, affinity: str | None = None) -> pyodbc.Connection:
        """A connection in autocommit mode, idle or new; `give` it back when done.

        `affinity` (a queue's name) asks for the same seat every time, when that one is free:
        so each server session serves a share of the queues, not all of them, and caches the
        plans and catalog entries of that share only. (Each DDL anywhere, a queue created, say,
        costs every session a walk over all of its cached plans.)"""
        db = self._database(settings)
        if not db.slots.acquire(timeout=self.wait_s):
            raise QueueUnavailable(
                f"{settings.endpoint}: the operator's {self.limit} connections to this database stayed busy"
                f" for {self.wait_s:g}s: raise DBQ_DB_CONNECTIONS, or the database's own limit"
            )
        try:
            while True:
                seat, conn = self._choose(db, affinity)
                if conn is None:
                    break
                try:  # one that broke while idle (a server restart) is dropped, not handed out
                    conn.cursor().execute("SELECT 1").fetchall()
                    return conn
                except pyodbc.Error:
                    self._close(db, conn)
            try:
                conn = connect(settings)
            except BaseException:
                with self._lock:
                    db.seats.discard(seat)
                raise
            self._born[id(conn)] = (time.monotonic(), self._epoch, seat)
            return conn
        except BaseException:
            db.slots.release()
            raise

    def _choose(self, db: _Database, affinity: str | None) -> tuple[int, pyodbc.Connection | None]:
        """The seat to lend: the affinity's own when it is idle or not open yet, else the idle
        one given back last, else a new one; with its idle connection, or None: open one there."""
        wanted = None if affinity is None else zlib.crc32(affinity.encode()) % self.limit
        with self._lock:
            if wanted is not None and wanted in db.idle:
                return wanted, db.idle.pop(wanted)
            if wanted is not None and wanted not in db.seats:
                db.seats.add(wanted)
                return wanted, None
            if db.idle:
                return db.idle.popitem()
            # None idle: the open ones are all lent, and this borrower holds a slot: a seat is free.
            seat = min(set(range(self.limit)) - db.seats)
            db.seats.add(seat)
            return seat, None

    def give(self, settings: ConnectionSettings, conn: pyodbc.Connection, broken: bool = False) -> None:
        """Back to the idle ones, or closed when `broken` (or found unusable)."""
        db = self._database(settings)
        try:
            born, epoch, seat = self._born.get(id(conn), (0.0, -1, -1))
            if broken or epoch != self._epoch or time.monotonic() - born > self.max_age_s:
                self._close(db, conn)
            else:
                if not conn.autocommit:
                    conn.rollback()
                    conn.autocommit = True
                with self._lock:
                    db.idle[seat] = conn
        except pyodbc.Error:  # closed already, or broken: dropped
            self._close(db, conn)
        finally:
            db.slots.release()

    def _close(self, db: _Database, conn: pyodbc.Connection) -> None:
        seat = self._born.pop(id(conn), (0.0, -1, -1))[2]
        with self._lock:
            db.seats.discard(seat)
        with contextlib.suppress(pyodbc.Error):  # a broken one may refuse even that
            conn.close()

    def drop_all(self) -> None:
        """Close the idle connections, and those lent now when they come back."""
        with self._lock:
            self._epoch += 1
            closing = [(db, conn) for db in self._databases.values() for conn in db.idle.values()]
            for db in self._databases.values():
                db.idle.clear()
        for db, conn in closing:
            self._close(db, conn)

    def idle(self, settings: ConnectionSettings) -> int:
        return len(self._database(settings).idle)


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
