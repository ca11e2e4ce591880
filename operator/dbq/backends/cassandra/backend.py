"""Pipes queues on Cassandra: observe, plan, apply, depth, teardown (the controller's protocol)."""

from __future__ import annotations

from typing import Any

from cassandra.cluster import Cluster, Session

from dbq.backends.base import ApplyResult, BackendError, Depth, Step
from dbq.backends.cassandra import cql
from dbq.backends.cassandra.plan import (
    PipesObserved,
    PipesTarget,
    RecordedPipes,
    TableOptions,
    plan_pipes,
)
from dbq.backends.cassandra.session import open_session, translate
from dbq.backends.names import QueueNames
from dbq.connection import ConnectionSettings


class CassandraPipes:
    def __init__(self, settings: ConnectionSettings, names: QueueNames, target: PipesTarget) -> None:
        self.settings = settings
        self.names = names
        self.target = target
        self.cql = cql.PipesCql(names)
        self._cluster: Cluster | None = None
        self._session: Session | None = None

    def endpoint(self) -> str:
        return self.settings.endpoint

    @property
    def session(self) -> Session:
        if self._session is None:
            self._cluster, self._session = open_session(self.settings)
        return self._session

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None

    def _run(self, statement: str, *params: Any) -> list[Any]:
        """Run one statement; with values it is prepared (values are never written into CQL)."""
        try:
            if params:
                return list(self.session.execute(self.session.prepare(statement), params))
            return list(self.session.execute(statement))
        except BackendError:
            raise
        except Exception as e:
            self.close()
            raise translate(e, self.settings) from None

    # --- observe / plan / apply -----------------------------------------------------------
    def observe(self) -> PipesObserved:
        ks = self.names.schema
        rows = self._run(cql.OBSERVE_KEYSPACE, ks)
        if not rows:
            return PipesObserved()
        tables = {
            name: TableOptions(int(grace), dict(compaction or {}))
            for name, grace, compaction in self._run(cql.OBSERVE_TABLES, ks)
        }
        recorded = None
        if self.names.meta in tables:
            found = self._run(self.cql.recorded, self.names.queue)
            if found and found[0][0] is not None:
                recorded = RecordedPipes(*(int(v or 0) for v in found[0]))
        return PipesObserved(
            keyspace_exists=True, replication=dict(rows[0][0]), tables=tables, recorded=recorded
        )

    def plan(self, observed: PipesObserved) -> list[Step]:
        return plan_pipes(self.target, observed)

    def step_cql(self, action: str) -> list[tuple[str, tuple[Any, ...]]]:
        kind, _, table = action.partition(":")
        t, c = self.target, self.cql
        if kind == "record_settings":
            values = (cql.PIPES_SCHEMA_VERSION, t.max_pushes_per_pipe, t.max_push_time_ms, self.names.queue)
            return [(c.record, values)]
        ddl = {
            "create_keyspace": lambda: c.create_keyspace(t.replication),
            "alter_keyspace": lambda: c.alter_keyspace(t.replication),
            "create_table": lambda: c.create_table(table),
            "tune_table": lambda: c.tune_table(table),
        }
        return [(ddl[kind](), ())]

    def apply(self) -> ApplyResult:
        steps = self.plan(self.observe())
        for step in steps:
            for statement, params in self.step_cql(step.action):
                self._run(statement, *params)
        return ApplyResult(steps=steps, schema_version=cql.PIPES_SCHEMA_VERSION)

    # --- state ----------------------------------------------------------------------------
    def depth(self) -> Depth:
        from dbq.client.pipes import PipesQueue

        stats = PipesQueue.over(self.session, self.settings, self.names).stats()
        return Depth(depth=stats.depth, in_flight=stats.in_flight)

    def teardown(self) -> None:
        observed = self.observe()
        if not observed.keyspace_exists:
            return
        for table in self.cql.queue_tables:
            self._run(self.cql.drop_table(table))
        if self.names.meta in observed.tables:
            self._run(self.cql.forget, self.names.queue)
            others = self._run(self.cql.queues_in_keyspace)
            leftover = set(observed.tables) - {self.names.meta, *self.cql.queue_tables}
            if not others and not leftover:
                self._run(self.cql.drop_keyspace())
