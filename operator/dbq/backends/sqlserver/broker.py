"""Service Broker queues on SQL Server: observe, plan, apply, check, measure, clean up, maintain
and tear down (the controller's protocol, like `OdbcRing` for rings).

`broker_sql.BrokerSql` supplies every statement and `broker_plan` every decision; this class only
runs them. SQL Server cannot run on this machine: the live tests (`tests/test_service_broker.py`)
run this code whenever DBQ_MSSQL_DSN names a server.
"""

from __future__ import annotations

import time
from typing import Any

import pyodbc

from dbq.backends.base import ApplyResult, Depth, Finding, Resized
from dbq.backends.broker_plan import (
    DATABASE_ACTIONS,
    BrokerObserved,
    BrokerStep,
    BrokerTarget,
    DatabaseState,
    MonitorState,
    QueueFigures,
    QueueState,
    Transmission,
    broker_checks,
    dba_statement,
    is_new,
    plan_broker,
    plan_queue_maintenance,
)
from dbq.backends.dialects import RingSql, relations
from dbq.backends.maintenance import MaintenanceResult
from dbq.backends.odbc import OdbcBackend
from dbq.backends.sqlserver.broker_sql import BrokerSql
from dbq.client import QueueStats
from dbq.connection import ConnectionSettings
from dbq.connection.odbc import connect, translate
from dbq.contract.broker import BROKER_SCHEMA_VERSION, stalled_after
from dbq.errors import DatabaseError

# Conversations cleanup ends per kind and run: a backlog is worked off over several runs.
CLEANUP_BATCH = 500


def _sets(cur: pyodbc.Cursor, count: int) -> list[list[Any]]:
    """The rows of `count` result sets of one batch, in order."""
    out = [cur.fetchall()]
    while len(out) < count:
        if not cur.nextset():
            raise DatabaseError(f"the observation answered {len(out)} result sets, not {count}")
        out.append(cur.fetchall())
    return out


def observation(rows: list[list[Any]], target: BrokerTarget) -> BrokerObserved:
    """The observation from the ten result sets of `BrokerSql.observe` (pure: tests feed it rows)."""
    db, types, contract, queues, services, objects, version, endpoints, transmission, monitor = rows
    enabled, guid, shared, trustworthy, major, schema, level, procedure = db[0]
    queue_states = {
        r[0]: QueueState(
            name=r[0],
            receive_enabled=bool(r[1]),
            enqueue_enabled=bool(r[2]),
            activation_enabled=bool(r[3]),
            activation_procedure=r[4],
            procedure_exists=bool(r[5]),
            max_readers=int(r[6]),
            execute_as=r[7],
            poison_handling=bool(r[8]),
            internal_table=r[9],
            rows=int(r[10] or 0),
        )
        for r in queues
    }
    visible = not monitor or bool(monitor[0][3])
    found_monitor = (
        MonitorState(str(monitor[0][0]), float(monitor[0][1] or 0), int(monitor[0][2] or 0))
        if monitor and visible
        else None
    )
    return BrokerObserved(
        database=DatabaseState(
            bool(enabled),
            str(guid),
            bool(shared),
            bool(trustworthy),
            int(major),
            bool(schema),
            int(level),
            bool(procedure),
        ),
        message_types=frozenset(r[0] for r in types),
        contract_messages=frozenset(r[1] for r in contract if r[1]) if contract else None,
        queues=queue_states,
        services={r[0]: (r[1], bool(r[2])) for r in services},
        sequences=frozenset(r[0] for r in objects if r[0] not in (target.names.meta, target.names.history)),
        tables=frozenset(r[0] for r in objects if r[0] in (target.names.meta, target.names.history)),
        recorded_version=int(version[0][0]) if version and version[0][0] is not None else None,
        endpoints={str(r[0]).strip(): int(r[1]) for r in endpoints},
        transmission=tuple(
            Transmission(str(r[0] or ""), str(r[1] or ""), float(r[2] or 0)) for r in transmission
        ),
        transmission_total=int(transmission[0][3]) if transmission else 0,
        monitor=found_monitor,
        monitor_visible=visible,
    )


class ServiceBrokerQueue(OdbcBackend):
    def __init__(self, settings: ConnectionSettings, target: BrokerTarget) -> None:
        super().__init__(settings, target.names)
        self.target = target
        self.sql = BrokerSql(target)

    def advisory_lock(self) -> str:
        return self.sql.shared.advisory_lock()

    def advisory_unlock(self) -> str | None:
        return self.sql.shared.advisory_unlock()

    def history_sql(self) -> RingSql:
        return self.sql.shared  # the schema's history table is the rings' own

    def _one(self, statement: str, *params: Any) -> Any:
        with self._errors():
            return self.conn.cursor().execute(statement, *params).fetchone()

    # --- observe / plan / apply -----------------------------------------------------------------
    def observe(self) -> BrokerObserved:
        with self._errors():
            cur = self.conn.cursor().execute(self.sql.observe())
            return observation(_sets(cur, 10), self.target)

    def plan(self, observed: BrokerObserved) -> list[BrokerStep]:
        return plan_broker(self.target, observed)

    def checks(self, observed: BrokerObserved | None = None) -> list[Finding]:
        """The health checks (`broker_plan.broker_checks`) on one observation."""
        return broker_checks(self.target, observed or self.observe())

    def apply(self) -> ApplyResult:
        """Database-wide steps first, each on its own (ALTER DATABASE refuses to run in a
        transaction); then the queue's objects in one transaction under the schema's lock,
        planned again there. The checks run on an observation after the changes."""
        observed = self.observe()
        done: list[BrokerStep] = []
        for step in self.plan(observed):
            if step.action in DATABASE_ACTIONS:
                self._database_step(step)
                done.append(step)
        with self._locked_transaction() as cur:
            steps = [s for s in self.plan(self.observe()) if s.action not in DATABASE_ACTIONS]
            for step in steps:
                for statement in self.sql.render(step):
                    cur.execute(statement)
        done += steps
        after = self.observe() if done else observed
        return ApplyResult(
            steps=done,
            schema_version=BROKER_SCHEMA_VERSION,
            findings=self.checks(after),
            created=is_new(self.target, observed),
        )

    def _database_step(self, step: BrokerStep) -> None:
        try:
            for statement in self.sql.render(step):
                self.conn.cursor().execute(statement)
        except pyodbc.Error as e:
            self.close(broken=True)
            error = translate(e, self.settings)
            raise type(error)(
                f"{error} (the plan found that {step.why}; {step.action} needs exclusive access to the database:"
                f" a DBA runs `{dba_statement(step.action, self.target.database)}` in a quiet moment)"
            ) from None

    # --- state ----------------------------------------------------------------------------------
    def measure(self) -> QueueStats:
        return QueueStats.of_row(self._one(self.sql.stats()))

    def depth(self) -> Depth:
        stats = self.measure()
        observed = self.observe()
        return Depth(depth=stats.depth, in_flight=stats.in_flight, conversations=observed.open_conversations)

    def resize(self, size: int | None = None) -> Resized | None:
        """A Service Broker queue has no ring to resize."""
        return None

    def cleanup(self, stalled_after_s: float) -> dict[str, int]:
        replies, senders, cleaned = self._one(
            self.sql.cleanup(), stalled_after(stalled_after_s), CLEANUP_BATCH
        )
        return {"senderReplies": int(replies), "stalledConversations": int(senders),
                "cleanedConversations": int(cleaned)}  # fmt: skip

    # --- maintenance ----------------------------------------------------------------------------
    def maintain(self, dead_percent: float, fragmentation_percent: float, online: bool) -> MaintenanceResult:
        """Measure the queue's internal table; REBUILD or REORGANIZE it past its thresholds
        (offline operations: the schedule is the window), under the same session lock as a
        ring's maintenance."""
        started = time.monotonic()
        lock = f"dbq-maintenance:{self.names.schema}.{self.names.queue}"
        conn = connect(self.settings)
        try:
            cur = conn.cursor()
            if not cur.execute(self.sql.shared.try_maintenance_lock(), lock).fetchval():
                return MaintenanceResult("Skipped", "another maintenance run of this queue is still going")
            try:
                row = cur.execute(self.sql.queue_figures()).fetchone()
                if row is None:
                    return MaintenanceResult("NotNeeded", "the queue has no internal table yet")
                figures = QueueFigures.of_row(row)
                steps = plan_queue_maintenance(figures, fragmentation_percent)
                before = figures.as_figures()
                took = time.monotonic() - started
                if not steps:
                    why = "every figure is under its threshold"
                    return MaintenanceResult("NotNeeded", why, [], before, before, took)
                for step in steps:
                    cur.execute(self.sql.maintenance_action(step.action))
                row = cur.execute(self.sql.queue_figures()).fetchone()
                after = QueueFigures.of_row(row).as_figures() if row else {}
                done = "; ".join(f"{s.action} queue ({s.why})" for s in steps)
                return MaintenanceResult("Succeeded", done, steps, before, after, time.monotonic() - started)
            finally:
                cur.execute(self.sql.shared.maintenance_unlock(), lock).fetchall()
        except pyodbc.Error as e:
            raise translate(e, self.settings) from None
        finally:
            conn.close()

    # --- teardown -------------------------------------------------------------------------------
    def teardown(self) -> bool:
        """Every conversation ended WITH CLEANUP, then services, queues, contract, message types,
        sequences and the queue's rows in the shared tables, in that order; the schema goes with
        its last queue. (Whether messages may be dropped is decided before: `reconcile.delete`.)
        True: what was left of it is not looked at first."""
        with self._locked_transaction() as cur:
            if cur.execute(self.sql.shared.OBSERVE_SCHEMA, self.names.schema).fetchval():
                cur.execute(self.sql.end_all_conversations()).fetchall()
                for statement in self.sql.drop():
                    cur.execute(statement)
                if self.names.meta in relations(cur, self.sql.shared, self.names.schema, [self.names.meta]):
                    for statement in self.sql.shared.drop_schema_if_unused():
                        cur.execute(statement)
        return True
