"""Pipes queues on Cassandra: observe, plan, apply, depth, teardown (the controller's protocol)."""

from __future__ import annotations

import time
from typing import Any

from cassandra.cluster import Cluster, Session

from dbq.backends.base import ApplyResult, BackendError, Depth, Earlier, Sample, Step
from dbq.backends.cassandra import cql
from dbq.backends.cassandra.plan import (
    PipesObserved,
    PipesTarget,
    RecordedPipes,
    TableOptions,
    plan_pipes,
)
from dbq.backends.cassandra.session import open_session, translate
from dbq.backends.maintenance import MaintenanceResult
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
        self._queue: Any = None  # a data-plane client on this session, for stats and repair

    def endpoint(self) -> str:
        return self.settings.endpoint

    @property
    def session(self) -> Session:
        if self._session is None:
            self._cluster, self._session = open_session(self.settings)
        return self._session

    def close(self) -> None:
        if self._queue is not None and self._session is not None:
            self._queue.close()  # gives back leases; the session is ours to shut down
        self._queue = None
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
    def _client(self) -> Any:
        """One client per backend object, on its session (prepared statements are reused)."""
        if self._queue is None:
            from dbq.client.pipes import PipesQueue

            try:
                self._queue = PipesQueue.over(self.session, self.settings, self.names)
            except Exception as e:
                raise BackendError(f"{self.settings.endpoint}: {e}") from None
        return self._queue

    def depth(self) -> Depth:
        stats = self._client().stats()
        return Depth(depth=stats.depth, in_flight=stats.in_flight)

    def measure(self) -> Sample:
        return Sample.of(self._client().stats())

    def cleanup(self, stalled_after_s: float) -> dict[str, int]:
        """The pipes reaper: vanished pushers' pipes finished, expired leases rolled back,
        drained pipes retired. (Its timings come from the pipes settings and leases.)"""
        q = self._client()
        try:
            r = q.repair()
        finally:
            q.close_pushers()  # a rollback pushed through this client's own pipe
        return {"finishedPipes": r.finished_pipes, "rolledBack": r.rolled_back,
                "drainedPipes": r.drained_pipes, "retiredPipes": r.retired_pipes}  # fmt: skip

    def maintain(self, dead_percent: float, fragmentation_percent: float, online: bool) -> MaintenanceResult:
        return MaintenanceResult(
            "NotNeeded",
            "Cassandra compacts on its own: queue tables use LeveledCompactionStrategy with tombstone"
            " compaction, and drained pipes leave as whole partitions",
        )

    def record_sample(self, sample: Sample, retention_s: float) -> None:
        s = sample
        self._run(self.cql.record_sample, self.names.queue, int(time.time() * 1000), s.depth, s.in_flight,
                  s.pushed, s.popped, s.acquired, s.expired, float(s.oldest_age_s), max(int(retention_s), 1))  # fmt: skip

    def sample_since(self, window_s: float) -> Earlier | None:
        now = int(time.time() * 1000)
        rows = self._run(self.cql.sample_since, self.names.queue, now - int(window_s * 1000))
        if not rows:
            return None
        at, pushed, popped, acquired = rows[0]
        return Earlier((now - int(at)) / 1000, int(pushed), int(popped) + int(acquired))

    def teardown(self) -> None:
        observed = self.observe()
        if not observed.keyspace_exists:
            return
        for table in self.cql.queue_tables:
            self._run(self.cql.drop_table(table))
        if self.names.meta in observed.tables:
            self._run(self.cql.forget, self.names.queue)
            if self.names.history in observed.tables:
                self._run(self.cql.forget_history, self.names.queue)
            others = self._run(self.cql.queues_in_keyspace)
            leftover = set(observed.tables) - {self.names.meta, self.names.history, *self.cql.queue_tables}
            if not others and not leftover:
                self._run(self.cql.drop_keyspace())
