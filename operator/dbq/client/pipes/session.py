"""How the pipes client talks to Cassandra: prepared statements (once per session), single
statements, lightweight transactions, batches and concurrent fan-outs, each with driver errors
translated into `dbq.errors`."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cassandra.cluster import ResponseFuture, Session
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from dbq.client.pipes import tuning
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import translate
from dbq.contract.pipes import PipesStatements
from dbq.errors import QueueError
from dbq.names import QueueNames

# Statements prepared on a session, by text: every client on the session (the operator's, Spark
# tasks') prepares a statement once.
_PREPARED: weakref.WeakKeyDictionary[Session, dict[str, PreparedStatement]] = weakref.WeakKeyDictionary()

Part = tuple[str, tuple[Any, ...]]  # a statement's text and its parameters, as a batch holds them


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
        return translate(e, self.settings)

    def rows(self, text: str, *params: Any) -> list[Any]:
        """Run one statement; its rows."""
        try:
            return list(self.session.execute(self.statement(text), params))
        except Exception as e:
            raise self.error(e) from None

    def cas(self, text: str, *params: Any) -> bool:
        """Run a lightweight transaction; whether it applied."""
        try:
            return bool(self.session.execute(self.statement(text), params).was_applied)
        except Exception as e:
            raise self.error(e) from None

    def batch(self, parts: Iterable[Part], logged: bool = False, conditional: bool = False) -> bool:
        """Run statements as one batch; whether it applied. That is always so without
        conditions. A conditional batch (a lightweight transaction on one partition of one table,
        logged) applies whole when every condition holds, else not at all."""
        logged = logged or conditional
        batch = BatchStatement(batch_type=BatchType.LOGGED if logged else BatchType.UNLOGGED)
        for text, params in parts:
            batch.add(self.statement(text), params)
        try:
            result = self.session.execute(batch)
        except Exception as e:
            raise self.error(e) from None
        return bool(result.was_applied) if conditional else True

    def many(self, text: str, params: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
        """Run one statement for many parameter tuples concurrently; rows per tuple, in order."""
        statement = self.statement(text)
        try:
            futures: list[ResponseFuture] = [self.session.execute_async(statement, p) for p in params]
            return [list(f.result()) for f in futures]
        except Exception as e:
            raise self.error(e) from None

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
