"""Consumers woken by PostgreSQL's LISTEN/NOTIFY instead of polling an empty queue.

A ring's push routines send a notification on the queue's channel only when the push lands on
an empty queue (nothing between the pop and push positions), so a busy queue pays nothing. A
client listens on one connection of its own (psycopg: ODBC drivers do not deliver
notifications) from its first wait on. A waiting caller marks the count of notifications before
it tries to take, and after an empty take waits until that count moves or `FALLBACK_S` passes
(the poll that covers a notification lost with a connection), so a push between its take and
its wait is never missed.
"""

from __future__ import annotations

import contextlib
import threading

import psycopg

from dbq.connection import ConnectionSettings
from dbq.contract.ring import notify_channel
from dbq.errors import DatabaseUnreachable
from dbq.names import QueueNames

FALLBACK_S = 1.0  # an idle consumer still tries once a second


class Notifications:
    def __init__(self, settings: ConnectionSettings, names: QueueNames) -> None:
        self.settings = settings
        self.channel = notify_channel(names)
        self._cond = threading.Condition()
        self._count = 0
        self._conn: psycopg.Connection | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def mark(self) -> int:
        """The count of notifications so far (listening from now on)."""
        self._listen()
        with self._cond:
            return self._count

    def wait(self, mark: int, seconds: float) -> None:
        """Until a notification came after `mark`, or `seconds` passed."""
        with self._cond:
            self._cond.wait_for(lambda: self._count != mark or self._closed, timeout=max(seconds, 0.0))

    def _listen(self) -> None:
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            s = self.settings
            try:
                conn = psycopg.connect(host=s.host, port=s.port, dbname=s.database, user=s.username,
                                       password=s.password, autocommit=True, connect_timeout=5)  # fmt: skip
            except psycopg.Error as e:
                raise DatabaseUnreachable(
                    f"{s.endpoint}: cannot listen for notifications ({type(e).__name__})"
                ) from None
            conn.execute(f'LISTEN "{self.channel}"')  # a validated hex name
            self._conn = conn
            self._thread = threading.Thread(target=self._run, args=(conn,), name="dbq-notify", daemon=True)
            self._thread.start()

    def _run(self, conn: psycopg.Connection) -> None:
        try:
            while not self._closed:
                for _ in conn.notifies(timeout=1.0):
                    with self._cond:
                        self._count += 1
                        self._cond.notify_all()
        except psycopg.Error:
            pass  # the connection broke: waiters fall back to polling; the next mark listens anew
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=3)
