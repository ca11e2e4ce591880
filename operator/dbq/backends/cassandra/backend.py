"""Pipes queues on Cassandra: observe, plan, apply, depth, teardown (the controller's protocol)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from cassandra.cluster import Cluster, Session

from dbq.backends.base import ApplyResult, Depth, Earlier, Finding, Resized
from dbq.backends.cassandra import cql
from dbq.backends.cassandra.access import CassandraLogins, groups_of
from dbq.backends.cassandra.plan import (
    PipesAction,
    PipesObserved,
    PipesStep,
    PipesTarget,
    RecordedPipes,
    TableOptions,
    is_new,
    plan_pipes,
)
from dbq.backends.maintenance import MaintenanceResult
from dbq.client import PipesQueue, QueueStats
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import SCHEMA_CHANGE_TIMEOUT_S, open_session, translate
from dbq.contract.pipes import PIPES_SCHEMA_VERSION
from dbq.errors import DbqError
from dbq.names import QueueNames

# Provisioning and teardown of one keyspace, one at a time in this process: queues share the
# keyspace and its metadata and history tables, and the last one to go drops the keyspace.
# (Cassandra has no lock to take across processes; every step is idempotent DDL, so a second
# operator process racing this one converges on the next reconcile.)
_KEYSPACE_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_KEYSPACE_LOCKS_GUARD = threading.Lock()


def keyspace_lock(settings: ConnectionSettings, keyspace: str) -> threading.Lock:
    with _KEYSPACE_LOCKS_GUARD:
        return _KEYSPACE_LOCKS.setdefault((settings.endpoint, keyspace), threading.Lock())


class CassandraSession:
    """A backend's session to the cluster, opened at first use, and its statements."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
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
        """Run one statement; with values it is prepared (values are never written into CQL).
        One without values is DDL, or reads the schema: it may wait for the schema's agreement."""
        try:
            if params:
                return list(self.session.execute(self.session.prepare(statement), params))
            return list(self.session.execute(statement, timeout=SCHEMA_CHANGE_TIMEOUT_S))
        except DbqError:
            raise
        except Exception as e:
            self.close()
            raise translate(e, self.settings) from None


class CassandraPipes(CassandraSession):
    def __init__(self, settings: ConnectionSettings, target: PipesTarget) -> None:
        super().__init__(settings)
        self.names = target.names
        self.target = target
        self.cql = cql.PipesCql(target.names, target.dead_letter_keeper)
        self._queue: PipesQueue | None = None  # a data-plane client on this session, for stats and repair

    def close(self) -> None:
        if self._queue is not None and self._session is not None:
            self._queue.close()  # gives back leases; the session is ours to shut down
        self._queue = None
        super().close()

    # --- observe / plan / apply -----------------------------------------------------------
    def observe(self) -> PipesObserved:
        ks = self.names.schema
        rows = self._run(cql.OBSERVE_KEYSPACE, ks)
        if not rows:
            return PipesObserved(keeper_version=self._keeper_version())
        tables = {
            name: TableOptions(int(grace), dict(compaction or {}))
            for name, grace, compaction in self._run(cql.OBSERVE_TABLES, ks)
        }
        recorded = None
        columns: frozenset[str] = frozenset()
        if self.names.meta in tables:
            columns = frozenset(r[0] for r in self._run(cql.OBSERVE_COLUMNS, ks, self.names.meta))
            recorded = self._recorded(self.cql, self.names)
        dead_columns = frozenset(r[0] for r in self._run(cql.OBSERVE_COLUMNS, ks, self.names.dead))
        headerless = frozenset(
            t for t in self.names.message_tables
            if t in tables and "headers" not in {r[0] for r in self._run(cql.OBSERVE_COLUMNS, ks, t)}
        )  # fmt: skip
        return PipesObserved(
            keyspace_exists=True, replication=dict(rows[0][0]), tables=tables, recorded=recorded,
            meta_columns=columns, dead_columns=dead_columns, keeper_version=self._keeper_version(),
            headerless=headerless,
        )  # fmt: skip

    def _recorded(self, statements: cql.PipesCql, names: QueueNames) -> RecordedPipes | None:
        """The metadata row of queue `names` (its keyspace's metadata table exists)."""
        found = self._run(statements.recorded, names.queue)  # as JSON: older rows lack columns
        values = json.loads(found[0][0]) if found else {}
        if values.get("schema_version") is None:
            return None

        def number(key: str) -> int:
            return int(values.get(key) or 0)

        return RecordedPipes(
            number("schema_version"), number("max_pushes_per_pipe"), number("max_push_time_ms"),
            number("max_attempts"), number("archive_ttl_s"), str(values.get("dead_letter_queue") or ""),
            number("header_bytes"), number("max_headers"), number("max_body_bytes"),
        )  # fmt: skip

    def _keeper_version(self) -> int | None:
        """The schema version of the queue that keeps this one's dead letters (when another does):
        None when its dead table or metadata row does not exist."""
        keeper = self.target.dead_letter_keeper
        if keeper is None:
            return None
        tables = {r[0] for r in self._run(cql.OBSERVE_TABLES, keeper.schema)}
        if keeper.meta not in tables or keeper.dead not in tables:
            return None
        recorded = self._recorded(cql.PipesCql(keeper), keeper)
        return recorded.schema_version if recorded is not None else None

    def _source_dead_letters(self) -> None:
        """Dead letters written before version 3 name no source: they are this queue's."""
        for msg_id, source in self._run(self.cql.unsourced_dead):
            if source is None:
                self._run(self.cql.set_dead_source, self.names.qualified, msg_id)

    def plan(self, observed: PipesObserved) -> list[PipesStep]:
        return plan_pipes(self.target, observed)

    def render(self, step: PipesStep) -> tuple[str, tuple[Any, ...]]:
        """The statement of one planning step, with its values."""
        t, c = self.target, self.cql
        statements: dict[PipesAction, Callable[[], str]] = {
            PipesAction.CREATE_KEYSPACE: lambda: c.create_keyspace(t.replication),
            PipesAction.ALTER_KEYSPACE: lambda: c.alter_keyspace(t.replication),
            PipesAction.CREATE_TABLE: lambda: c.create_table(step.table),
            PipesAction.TUNE_TABLE: lambda: c.tune_table(step.table),
            PipesAction.ADD_META_COLUMNS: lambda: c.add_meta_columns,
            PipesAction.ADD_DEAD_SOURCE: lambda: c.add_dead_source,
            PipesAction.ADD_HEADERS: lambda: c.add_headers(step.table),
            PipesAction.RECORD_SETTINGS: lambda: c.record,
        }
        values: tuple[Any, ...] = ()
        if step.action is PipesAction.RECORD_SETTINGS:
            values = (
                PIPES_SCHEMA_VERSION, t.max_pushes_per_pipe, t.max_push_time_ms, t.max_attempts, t.archive_ttl_s,
                t.dead_letter_queue, t.header_bytes, t.max_headers, t.max_body_bytes, self.names.queue,
            )  # fmt: skip
        return statements[step.action](), values

    def apply(self) -> ApplyResult:
        with keyspace_lock(self.settings, self.names.schema):
            observed = self.observe()
            steps = self.plan(observed)
            for step in steps:
                if step.action is PipesAction.SOURCE_DEAD_LETTERS:  # row by row, not one statement
                    self._source_dead_letters()
                    continue
                statement, values = self.render(step)
                self._run(statement, *values)
        return ApplyResult(
            steps=steps, schema_version=PIPES_SCHEMA_VERSION, created=is_new(self.target, observed)
        )

    # --- state ----------------------------------------------------------------------------
    def _client(self) -> PipesQueue:
        """One client per backend object, on its session (prepared statements are reused)."""
        if self._queue is None:
            self._queue = PipesQueue.over(self.session, self.settings, self.names)
        return self._queue

    def ping(self) -> None:
        """Whether the cluster answers at the queue's consistency (a read of the queue's row)."""
        self._run(self.cql.recorded, self.names.queue)

    def checks(self) -> list[Finding]:
        """No health checks beyond the observation's drift: this design has none."""
        return []

    def depth(self) -> Depth:
        stats = self._client().stats()
        return Depth(depth=stats.depth, in_flight=stats.in_flight)

    def measure(self) -> QueueStats:
        return self._client().stats()

    def resize(self, size: int | None = None) -> Resized | None:
        """Pipes have no ring to resize."""
        return None

    def cleanup(self, stalled_after_s: float) -> dict[str, int]:
        """The pipes reaper: vanished pushers' pipes finished, expired leases rolled back,
        drained pipes retired. (Its timings come from the pipes settings and leases.)"""
        q = self._client()
        try:
            r = q.repair()
        finally:
            q.close_pushers()  # a rollback pushed through this client's own pipe
        return {"finishedPipes": r.finished_pipes, "rolledBack": r.rolled_back,
                "drainedPipes": r.drained_pipes, "retiredPipes": r.retired_pipes,
                "deadLettered": r.dead_lettered, "delayedDue": r.delayed_due}  # fmt: skip

    def maintain(self, dead_percent: float, fragmentation_percent: float, online: bool) -> MaintenanceResult:
        return MaintenanceResult(
            "NotNeeded",
            "Cassandra compacts on its own: queue tables use LeveledCompactionStrategy with tombstone"
            " compaction, and drained pipes leave as whole partitions",
        )

    def record_sample(self, stats: QueueStats, retention_s: float, purge: bool = True) -> None:
        """The retention is the sample's TTL: nothing to purge."""
        s = stats
        self._run(self.cql.record_sample, self.names.queue, int(time.time() * 1000), s.depth, s.in_flight,
                  s.pushed, s.popped, s.acquired, s.expired, float(s.oldest_age_seconds), max(int(retention_s), 1))  # fmt: skip

    def sample_since(self, window_s: float) -> Earlier | None:
        now = int(time.time() * 1000)
        rows = self._run(self.cql.sample_since, self.names.queue, now - int(window_s * 1000))
        if not rows:
            return None
        at, pushed, popped, acquired = rows[0]
        return Earlier((now - int(at)) / 1000, int(pushed), int(popped) + int(acquired))

    def teardown(self) -> bool:
        """True: what was left of it is not looked at first."""
        with keyspace_lock(self.settings, self.names.schema):
            self._teardown()
        return True

    def _teardown(self) -> None:
        observed = self.observe()
        if not observed.keyspace_exists:
            return
        kept_by = observed.recorded.dead_letter_queue if observed.recorded else ""
        if kept_by:  # its dead letters kept by another queue go with it
            keeper = QueueNames.of_qualified(kept_by)
            if keeper.dead in {r[0] for r in self._run(cql.OBSERVE_TABLES, keeper.schema)}:
                statements = cql.PipesCql(self.names, keeper)
                ids = [r[0] for r in self._run(statements.dead_letters, self.names.qualified, 1_000_000)]
                for at in range(0, len(ids), 100):
                    self._run(statements.forget_dead_letters, ids[at : at + 100])
        for table in self.names.pipes_tables:
            self._run(self.cql.drop_table(table))
        CassandraLogins(self.session, self.settings).drop_groups(
            groups_of(self.settings.database, self.names)
        )
        if self.names.meta in observed.tables:
            self._run(self.cql.forget, self.names.queue)
            if self.names.history in observed.tables:
                self._run(self.cql.forget_history, self.names.queue)
            others = self._run(self.cql.queues_in_keyspace)
            leftover = set(observed.tables) - {self.names.meta, self.names.history, *self.names.pipes_tables}
            if not others and not leftover:
                self._run(self.cql.drop_keyspace())
