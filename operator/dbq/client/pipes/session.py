"""How the pipes client talks to Cassandra: prepared statements (once per session), single
statements, lightweight transactions, batches and concurrent fan-outs, each with driver errors
translated into `dbq.errors`."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cassandra.cluster import ResponseFuture, ResultSet, Session
from cassandra.connection import ConnectionBusy
from cassandra.query import BatchStatement, BatchType, PreparedStatement, Statement

from dbq.client.pipes import tuning
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import only_failed_with, translate
from dbq.contract.pipes import PipesStatements
from dbq.errors import QueueError
from dbq.names import QueueNames

# Statements prepared on a session, by text: every client on the session (the operator's, Spark
# tasks') prepares a statement once.
_PREPARED: weakref.WeakKeyDictionary[Session, dict[str, PreparedStatement]] = weakref.WeakKeyDictionary()

Part = tuple[str, tuple[Any, ...]]  # a statement's text and its parameters, as a batch holds them
BUSY_RETRIES = 12  # a request refused unsent is tried again this often, for about 0.6 s in all


def busy(e: Exception) -> bool:
    """Whether the driver refused a request before sending it, every connection's socket full
    (large bodies in flight on them): safe to send again, whatever the statement."""
    return only_failed_with(e, ConnectionBusy)


class PipesSession:
    def __init__(self, session: Session, settings: ConnectionSettings, names: QueueNames) -> None:
        self.session = session
        self.settings = settings
        self.names = names
        self.cql = PipesStatements(names)
        self._prepared = _PREPARED.setdefault(session, {})  # shared by the clients of a session

    def statement(self, text: str) -> PreparedStatement:
        prepared = self._prepared.get(text)
        if prepared is None:
            try:
                prepared = self._prepared[text] = self.session.prepare(text)
            except Exception as e:  # e.g. a table dropped behind our back
                raise self.error(e) from None
        return prepared

    def error(self, e: Exception) -> QueueError:
        return translate(e, self.settings, client=True)

    def _execute(self, statement: Statement | PreparedStatement, params: Any = None) -> ResultSet:
        """Run a statement, again while the driver refuses it unsent (`busy`)."""
        for attempt in range(BUSY_RETRIES + 1):
            try:
                return self.session.execute(statement, params)
            except Exception as e:
                if not busy(e) or attempt == BUSY_RETRIES:
                    raise self.error(e) from None
                time.sleep(min(0.002 * 2**attempt, 0.1))
        raise AssertionError("unreachable")

    def rows(self, text: str, *params: Any) -> list[Any]:
        """Run one statement; its rows."""
        return list(self._execute(self.statement(text), params))

    def cas(self, text: str, *params: Any) -> bool:
        """Run a lightweight transaction; whether it applied."""
        return bool(self._execute(self.statement(text), params).was_applied)

    def batch(self, parts: Iterable[Part], logged: bool = False, conditional: bool = False) -> bool:
        """Run statements as one batch; whether it applied. That is always so without
        conditions. A conditional batch (a lightweight transaction on one partition of one table,
        logged) applies whole when every condition holds, else not at all."""
        logged = logged or conditional
        batch = BatchStatement(batch_type=BatchType.LOGGED if logged else BatchType.UNLOGGED)
        for text, params in parts:
            batch.add(self.statement(text), params)
        result = self._execute(batch)
        return bool(result.was_applied) if conditional else True

    def many(self, text: str, params: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
        """Run one statement for many parameter tuples concurrently; rows per tuple, in order."""
        statement = self.statement(text)
        futures: list[ResponseFuture] = [self.session.execute_async(statement, p) for p in params]
        out: list[list[Any]] = []
        for future, p in zip(futures, params, strict=True):
            try:
                out.append(list(future.result()))
            except Exception as e:
                if not busy(e):
                    raise self.error(e) from None
                out.append(list(self._execute(statement, p)))  # it was never sent: once more
        return out

    def meta(self) -> list[Any] | None:
        """The queue's metadata row, or None when there is none."""
        rows = self.rows(self.cql.read_meta, self.names.queue)
        return list(rows[0]) if rows and rows[0][0] is not None else None

    def claimed(
        self, claim: str, rows: list[Any], key: Callable[[Any], tuple[Any, ...]], at: int
    ) -> list[Any]:
        """The rows of one partition this client claimed with `claim` (moving_until set to
        RETAKE_AFTER_S from now, if it was before `at`): all in one conditional batch, or, when
        another client claimed one meanwhile, each on its own."""
        until = tuning.retake_at()
        if not rows or self.batch(((claim, (until, *key(r), at)) for r in rows), conditional=True):
            return rows
        return [r for r in rows if self.cas(claim, until, *key(r), at)]
