"""What the backends reached through ODBC (rings, Service Broker) share: the connection the
operator's pool lends, driver errors translated at this edge, one transaction under the
schema's advisory lock, the statistics history, and the health check on a new connection."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import pyodbc

from dbq.backends.base import Earlier
from dbq.client import QueueStats
from dbq.connection import ConnectionSettings, pool
from dbq.connection.odbc import connect, translate
from dbq.errors import DatabaseError
from dbq.names import QueueNames

if TYPE_CHECKING:
    from dbq.backends.dialects import RingSql


T = TypeVar("T")


@contextmanager
def transaction(conn: pyodbc.Connection) -> Iterator[None]:
    """One transaction on a connection that is otherwise in autocommit: committed when the block
    ends, rolled back when it raises."""
    conn.autocommit = False
    try:
        yield
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = True


class OdbcBackend:
    def __init__(self, settings: ConnectionSettings, names: QueueNames) -> None:
        self.settings = settings
        self.names = names
        self._conn: pyodbc.Connection | None = None

    def endpoint(self) -> str:
        return self.settings.endpoint

    @property
    def conn(self) -> pyodbc.Connection:
        """The backend's connection: the operator's pool lends it (`dbq.connection.pool`)."""
        if self._conn is None:
            lender = pool.shared()
            self._conn = (
                connect(self.settings)
                if lender is None
                else lender.take(self.settings, affinity=f"{self.names.schema}.{self.names.queue}")
            )
        return self._conn

    def close(self, broken: bool = False) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            lender = pool.shared()
            if lender is None:
                conn.close()
            else:
                lender.give(self.settings, conn, broken)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except pyodbc.Error as e:
            self.close(broken=True)  # the connection may be broken; the next call reconnects
            raise translate(e, self.settings) from None

    def advisory_lock(self) -> str:
        """The statement that takes the schema's lock (parameter: its name), raising when it is
        not granted; held until the transaction ends, or until `advisory_unlock` when that is a
        statement."""
        raise NotImplementedError

    def advisory_unlock(self) -> str | None:
        """The statement that releases a session-owned schema lock (parameter: its name), or None
        when the lock ends with the transaction."""
        return None

    def history_sql(self) -> RingSql:
        """The dialect whose statements keep the schema's statistics history."""
        raise NotImplementedError

    def record_sample(self, stats: QueueStats, retention_s: float, purge: bool = True) -> None:
        with self._errors():
            cur = self.conn.cursor()
            values = (stats.depth, stats.in_flight, stats.pushed, stats.popped, stats.acquired,
                      stats.expired, float(stats.oldest_age_seconds))  # fmt: skip
            cur.execute(self.history_sql().record_sample(), *values)
            if purge:
                cur.execute(self.history_sql().purge_history(), int(retention_s))

    def sample_since(self, window_s: float) -> Earlier | None:
        with self._errors():
            row = self.conn.cursor().execute(self.history_sql().sample_since(), int(window_s)).fetchone()
        return Earlier(float(row[0]), int(row[1]), int(row[2])) if row else None

    @contextmanager
    def _locked_transaction(self) -> Iterator[pyodbc.Cursor]:
        """One transaction holding the schema's advisory lock: a crash leaves nothing half-made,
        and two operators (or two handlers of one) never change one schema at once. The lock is
        the schema's, not the queue's: queues share the schema, its metadata and history tables,
        and the last one to go drops the schema."""
        lock, unlock = f"dbq:{self.names.schema}", self.advisory_unlock()
        with self._errors():
            conn = self.conn
            try:
                with transaction(conn):
                    cur = conn.cursor()
                    cur.execute(self.advisory_lock(), lock)
                    yield cur
            finally:
                if unlock is not None:
                    self._release(conn, unlock, lock)

    @staticmethod
    def _first_look(look: Callable[[], T]) -> T | None:
        """What `look` finds without the schema's lock, or None when the schema refused it.
        PostgreSQL makes a commit visible a moment before it tells other sessions to refresh the
        role memberships they cached: a schema another handler has just made, and given to its
        owner role, can be seen and refused in that moment. The look under the lock is never in
        it (a transaction's locks are released after the refresh is sent), so a refused first
        look goes there."""
        try:
            return look()
        except DatabaseError as e:
            if "permission denied for schema" in str(e):
                return None
            raise

    def _release(self, conn: pyodbc.Connection, unlock: str, lock: str) -> None:
        """A session-owned lock outlives the transaction: release it; if that fails, end the
        session (which releases it) rather than hide the error the transaction raised."""
        try:
            conn.cursor().execute(unlock, lock)
        except pyodbc.Error:
            self.close(broken=True)

    def ping(self) -> None:
        """Whether the database answers a new connection (raises DatabaseUnreachable,
        AuthenticationFailed...): a pooled session would hide a revoked password."""
        connect(self.settings).close()
