"""Consumers woken by PostgreSQL's LISTEN/NOTIFY instead of polling an empty queue.

A consumer that found the queue empty for `POLL_FIRST_S` says that it waits: it renews the queue's wait mark (one row, `Q_waiters`: pushes
notify until `WAIT_MARK_S` from now), marks the count of notifications it has seen, tries once
more, and waits until that count moves or `FALLBACK_S` passes (the poll that covers a
notification lost with a connection). A ring's push routines notify the queue's channel only
while the mark holds, so a queue nobody waits on pays nothing, and a push between a consumer's
last try and its wait is never missed. A client listens on one connection of its own (its
calls share others, `dbq.connection.postgres`) from its first wait on.
"""

from __future__ import annotations

import contextlib
import threading

import psycopg

from dbq.connection import ConnectionSettings, postgres
from dbq.contract.ring import notify_channel
from dbq.errors import DatabaseUnreachable
from dbq.names import QueueNames

FALLBACK_S = 1.0  # an idle consumer still tries once a second
WAIT_MARK_S = 2  # pushes notify for this long after a consumer last said it waits (> FALLBACK_S)
# A consumer polls for this long before it announces a wait: under load the queue refills
# sooner, so busy consumers never make pushes notify (NOTIFY serialises the commits that send it).
POLL_FIRST_S = 0.1


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
                conn = postgres.connect(s)
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
