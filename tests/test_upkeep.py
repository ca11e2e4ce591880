"""Statistics and cleanup on schedule (controller/upkeep.py) against real PostgreSQL and Cassandra.

The operator's timer calls `run_upkeep` every few seconds; these tests call it the same way, on a
clock they drive, so every figure can be checked exactly. test_operator.py checks the published
status and Events through the real API server."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pyodbc
import pytest

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.base import Earlier
from dbq.client import PipesQueue, Queue, QueueStats, connect
from dbq.client.pipes import tuning as pipes_tuning
from dbq.connection import from_url
from dbq.controller import schedule, upkeep
from dbq.errors import DbqError

# --- pure decisions ------------------------------------------------------------------------------


def sample(
    pushed: int = 0, popped: int = 0, acquired: int = 0, depth: int = 0, age: float = 0.0
) -> QueueStats:
    return QueueStats(depth, 0, pushed, popped, acquired, 0, age)


def test_rates_come_from_the_sample_a_window_ago():
    assert upkeep.rates(sample(100), None) is None
    assert upkeep.rates(sample(100), Earlier(0.5, 0, 0)) is None  # too recent to divide by
    assert upkeep.rates(sample(1000, 300, 100), Earlier(20.0, 200, 0)) == (40.0, 20.0)
    assert upkeep.rates(sample(10), Earlier(10.0, 50, 0)) == (0.0, 0.0)  # totals never run back


def test_rates_come_from_memory_once_it_holds_every_sample_of_the_window():
    memory = upkeep.Memory()
    assert not memory.remembers(20.0, 100.0)
    memory.remember_sample(sample(10), 100.0, 20.0)
    assert not memory.remembers(20.0, 115.0)  # the table may hold a sample from before 100
    memory.remember_sample(sample(20), 115.0, 20.0)
    assert memory.remembers(20.0, 120.0)
    assert memory.sample_since(20.0, 120.0) == Earlier(20.0, 10, 0)
    memory.remember_sample(sample(30), 130.0, 20.0)  # the one of 100 is let go
    assert list(memory.samples) == [(115.0, 20, 0), (130.0, 30, 0)]
    assert memory.sample_since(20.0, 131.0) == Earlier(16.0, 20, 0)
    assert not memory.remembers(60.0, 131.0)  # a wider window (a longer interval) asks the table


def test_status_is_written_only_when_a_figure_changed_or_the_heartbeat_is_due():
    old = upkeep.stats_status(sample(10, 5, depth=5, age=100.0), (1.0, 0.5), datetime(2026, 1, 1))
    same = dict(old, measuredAt="2026-01-01T00:00:15Z", oldestMessageAgeSeconds=105.0)
    assert not upkeep.worth_writing(old, same, last_write=1000.0, now=1015.0)
    assert upkeep.worth_writing(old, same, last_write=1000.0, now=1000.0 + upkeep.STATS_HEARTBEAT_S)
    assert upkeep.worth_writing(old, dict(same, depth=6), last_write=1000.0, now=1015.0)
    assert upkeep.worth_writing(old, dict(same, oldestMessageAgeSeconds=150.0), last_write=1000.0, now=1015.0)
    assert upkeep.worth_writing(None, same, last_write=0.0, now=1.0)


def test_maintenance_plans_per_dialect_and_the_bloat_estimate():
    from dbq.backends.maintenance import IndexFigures, TableFigures, plan_maintenance

    tables = [TableFigures("t", live_rows=700, dead_rows=300), TableFigures("u", 990, 10)]
    tight = IndexFigures("t_pkey", "t", pages=200, rows=10_000)  # 10,000 entries fill ~28 pages
    assert 85 < tight.bloat_percent < 87 and IndexFigures("s", "t", pages=8, rows=0).bloat_percent == 0.0
    pg = plan_maintenance(tables, [tight], dead_percent=20, fragmentation_percent=30, dialect="postgres")
    assert [(s.action, s.target) for s in pg] == [("vacuum", "t"), ("reindex", "t_pkey")]
    ms = [
        IndexFigures("a", "t", 100, 0, 12.0),
        IndexFigures("b", "t", 100, 0, 45.0),
        IndexFigures("c", "t", 100, 0, 2.0),
    ]
    plan = plan_maintenance([], ms, dead_percent=20, fragmentation_percent=30, dialect="sqlserver")
    assert [(s.action, s.target) for s in plan] == [("reorganize", "a"), ("rebuild", "b")]


def test_statistics_reach_the_prometheus_gauges():
    from prometheus_client import REGISTRY

    from dbq.controller import metrics

    metrics.set_stats("ns1", "q1", sample(120, 20, 10, depth=90, age=4.5), (12.5, 3.0))
    metrics.count_cleanup("ns1", "q1", {"orphans": 2, "holes": 0})
    labels = {"namespace": "ns1", "queue": "q1"}
    assert REGISTRY.get_sample_value("dbq_queue_depth", labels) == 90
    assert REGISTRY.get_sample_value("dbq_queue_push_rate", labels) == 12.5
    assert REGISTRY.get_sample_value("dbq_queue_oldest_message_age_seconds", labels) == 4.5
    assert REGISTRY.get_sample_value("dbq_queue_cleanup_total", {**labels, "kind": "orphans"}) == 2
    metrics.forget("ns1", "q1")
    assert REGISTRY.get_sample_value("dbq_queue_depth", labels) is None


def test_cleanup_status_is_refreshed_by_its_own_heartbeat():
    quiet = {"expiredLeases": 0, "orphans": 0}
    assert upkeep.cleanup_worth_writing(quiet, last_write=0.0, now=5.0)  # nothing written yet
    assert not upkeep.cleanup_worth_writing(quiet, last_write=100.0, now=160.0)
    assert upkeep.cleanup_worth_writing(quiet, last_write=100.0, now=100.0 + upkeep.STATS_HEARTBEAT_S)
    assert upkeep.cleanup_worth_writing({"orphans": 1}, last_write=100.0, now=101.0)
    # A queue created empty at 100 is quiet until its first repair or the heartbeat.
    memory = upkeep.Memory()
    memory.created(100.0)
    assert not upkeep.cleanup_worth_writing(quiet, memory.cleanup_written_at, now=160.0)


def test_tasks_run_when_their_interval_is_due():
    assert upkeep.due(0.0, 15, 3.0)  # never ran (or the operator restarted)
    assert not upkeep.due(100.0, 15, 110.0)
    assert upkeep.due(100.0, 15, 115.0)


def test_a_tick_with_nothing_due_opens_neither_the_secret_nor_the_database():
    spec = spec_for("postgres", "s")
    wall = datetime(2026, 6, 1, 12, 0, tzinfo=upkeep.UTC)
    memory = upkeep.Memory(
        stats_at=100.0,
        cleanup_at=100.0,
        stats_written_at=100.0,
        database=upkeep.DatabaseMemory(checked_at=100.0),
    )
    window = upkeep.stamp(upkeep.next_window(spec.reindex.schedule, wall))
    status = {"maintenance": {"nextRun": window, "cron": spec.reindex.schedule}}

    def never() -> Any:
        raise AssertionError("the backend was opened on a tick with nothing due")

    due = upkeep.what_is_due(spec, status, memory, now=101.0, wall=wall)
    assert (due.stats, due.cleanup, due.maintenance, due.touches_database) == (False, False, "wait", False)
    done = upkeep.run_upkeep("ns", "q", spec, status, never, memory, now=101.0, wall=wall)
    assert set(done.status) == {"schedule"} and not done.events  # the schedule in words, once
    later = upkeep.run_upkeep("ns", "q", spec, {**status, **done.status}, never, memory, now=102.0, wall=wall)
    assert later.status == {} and later.events == []
    assert upkeep.what_is_due(spec, status, memory, now=100.0 + 5.0, wall=wall).touches_database
    # With longer intervals, the database is still asked every HEALTH_INTERVAL_S whether it answers.
    slow = spec_for("postgres", "s", stats={"interval": "1m"}, cleanup={"interval": "1m"})
    check = upkeep.what_is_due(slow, status, memory, now=100.0 + upkeep.HEALTH_INTERVAL_S, wall=wall)
    assert (check.stats, check.cleanup, check.health) == (False, False, True)


def test_one_health_check_serves_every_queue_of_a_database_until_one_fails():
    spec = spec_for("postgres", "s", stats={"interval": "1m"}, cleanup={"interval": "1m"})
    wall = datetime(2026, 6, 1, 12, 0, tzinfo=upkeep.UTC)
    status = {"maintenance": {"nextRun": upkeep.stamp(upkeep.next_window(spec.reindex.schedule, wall)),
                              "cron": spec.reindex.schedule}}  # fmt: skip
    database = upkeep.DatabaseMemory()
    first, second = (upkeep.Memory(stats_at=100.0, cleanup_at=100.0, database=database) for _ in range(2))
    now = 100.0 + upkeep.HEALTH_INTERVAL_S
    assert upkeep.what_is_due(spec, status, first, now, wall).health  # nobody asked yet
    database.checked_at = now  # the first queue's tick asked it
    assert not upkeep.what_is_due(spec, status, second, now + 1, wall).health  # that serves the second
    database.failed_at = now + 2  # a queue's tick failed: every queue asks for itself again
    assert upkeep.what_is_due(spec, status, second, now + 3, wall).health


def test_an_idle_tick_is_known_without_the_database_or_a_thread():
    raw = {
        "backend": "postgres",
        "design": "ring",
        "connection": {"secretRef": {"name": "db"}, "schema": "s"},
    }
    memory = upkeep.Memory()
    now, wall = time.monotonic(), datetime.now(upkeep.UTC)
    spec = memory.spec(1, raw)
    assert not upkeep.nothing_due(spec, {}, memory, now, wall)  # statistics never measured: due
    window = upkeep.stamp(upkeep.next_window(spec.reindex.schedule, wall))
    status = {"maintenance": {"nextRun": window, "cron": spec.reindex.schedule}}
    memory.stats_at = memory.cleanup_at = memory.database.checked_at = now
    assert upkeep.nothing_due(spec, status, memory, now, wall)
    assert memory.spec(1, {}) is spec  # the same generation is not parsed again


class Calls:
    """A real backend whose method calls are recorded: their names, in order, and keywords."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.names, self.keywords = backend, [], {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.backend, name)

        def call(*args: Any, **keywords: Any) -> Any:
            self.names.append(name)
            self.keywords[name] = keywords
            return method(*args, **keywords)

        return call


def test_a_queue_created_empty_is_measured_at_once_and_cleaned_up_one_interval_later(postgres):
    """Nothing to repair and no sample in the history table yet: its first upkeep (run with
    provisioning) measures it and records a sample, and reads or purges nothing else."""
    name = f"n_{secrets.token_hex(3)}"
    spec = spec_for("postgres", "upkeep")
    backend = open_backend(spec, name, from_url(postgres.url))
    assert backend.apply().created and not backend.apply().created  # the second finds it all
    memory, calls = upkeep.Memory(), Calls(backend)
    memory.created(100.0)
    first = upkeep.run_upkeep("ns", name, spec, {}, lambda: calls, memory, now=100.0, health_check=False)
    assert calls.names == ["measure", "record_sample", "checks"], calls.names
    assert calls.keywords["record_sample"] == {"purge": False}
    assert first.status["stats"]["depth"] == 0 and "cleanup" not in first.status
    with connect(postgres.url, name, schema="upkeep") as q:
        q.push(b"x")
    calls.names.clear()
    later = upkeep.run_upkeep("ns", name, spec, {**first.status}, lambda: calls, memory, now=105.0)
    assert "sample_since" not in calls.names and later.status["stats"]["pushRate"] == 0.2  # 1 in 5 s
    assert "cleanup" in calls.names  # due one interval (5 s) later; nothing repaired, nothing written
    assert "cleanup" not in later.status and not later.events
    backend.teardown()
    backend.close()


def test_operator_settings_come_from_the_environment_and_bad_ones_are_named():
    from dbq.errors import InvalidSpec
    from dbq.settings import OperatorSettings

    s = OperatorSettings.from_env(
        {"DBQ_UPKEEP_TICK": "2", "DBQ_TIMEZONE": "Europe/Paris", "DBQ_DB_CONNECTIONS": "4"}
    )
    assert (s.upkeep_tick_s, s.drift_interval_s, s.workers, s.zone().key) == (2.0, 60.0, 8, "Europe/Paris")
    assert (OperatorSettings().db_connections, s.db_connections) == (10, 4)
    with pytest.raises(InvalidSpec, match="DBQ_WORKERS and DBQ_DB_CONNECTIONS whole numbers"):
        OperatorSettings.from_env({"DBQ_WORKERS": "many"})
    with pytest.raises(InvalidSpec, match="DBQ_TIMEZONE 'Mars/Olympus' is not a time zone"):
        OperatorSettings.from_env({"DBQ_TIMEZONE": "Mars/Olympus"})


# --- against the databases ----------------------------------------------------------------------


def spec_for(backend: str, schema: str, **extra: Any) -> QueueSpec:
    doc: dict[str, Any] = {
        "backend": backend,
        "design": "ring" if backend == "postgres" else "pipes",
        "connection": {"secretRef": {"name": "s"}, "schema": schema},
        "stats": {"interval": "5s"},
        "cleanup": {"interval": "5s"},
        **extra,
    }
    return QueueSpec.model_validate(doc)


def provisioned(
    postgres: Any, prefix: str, names: tuple[str, ...], waiting: str | None = None
) -> tuple[str, list[Any]]:
    """Ring queues `names` made in a new schema named from `prefix` (their backends closed), and
    a message pushed to the one named `waiting`."""
    schema = f"{prefix}_{secrets.token_hex(3)}"
    rings = [open_backend(spec_for("postgres", schema), name, from_url(postgres.url)) for name in names]
    for ring in rings:
        ring.apply()
        ring.close()
    if waiting is not None:
        with connect(postgres.url, waiting, schema=schema) as q:
            q.push(b"waits")
    return schema, rings


def paced(count: int, per_second: float, action: Any, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        for i in range(count):
            if stop.is_set():
                return
            time.sleep(max(0.0, started + i / per_second - time.monotonic()))
            action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture(params=["postgres", "cassandra"])
def target(request, postgres, cassandra, stack) -> tuple[str, str, str]:
    if request.param == "postgres":
        return "postgres", postgres.url, "upkeep"
    return "cassandra", stack.cassandra.url(), f"upkeep_{secrets.token_hex(3)}"


def test_published_totals_are_exact_and_rates_match_the_workload(target):
    kind, url, schema = target
    name = f"u_{secrets.token_hex(3)}"
    spec = spec_for(kind, schema)
    backend = open_backend(spec, name, from_url(url))
    backend.apply()
    memory = upkeep.Memory()
    pusher, popper = connect(url, name, schema=schema), connect(url, name, schema=schema)
    stop = threading.Event()
    push_rate, pop_rate, seconds = 40.0, 20.0, 30
    try:
        t0 = time.monotonic()
        threads = [
            paced(int(push_rate * seconds), push_rate, lambda: pusher.push(b"x"), stop),
            paced(int(pop_rate * seconds), pop_rate, lambda: popper.pop(timeout=1), stop),
        ]
        published: list[dict[str, Any]] = []
        while any(t.is_alive() for t in threads):
            done = upkeep.run_upkeep("ns", name, spec, {}, lambda: backend, memory, now=time.monotonic())
            if "stats" in done.status:
                published.append({**done.status["stats"], "t": time.monotonic() - t0})
            time.sleep(0.5)
        for t in threads:
            t.join()
        memory.stats_at = 0.0  # due now: the final figures
        final = upkeep.run_upkeep("ns", name, spec, {}, lambda: backend, memory).status["stats"]
        # The samples the operator remembers answer as its history table does (a window that
        # ends between two samples, half an interval off both).
        window = upkeep.rate_window_s(spec) - 2.5  # half the 5 s interval
        remembered, recorded = memory.sample_since(window, time.monotonic()), backend.sample_since(window)
        assert memory.remembers(window, time.monotonic()) and remembered and recorded
        assert (remembered.pushed, remembered.taken) == (recorded.pushed, recorded.taken)
        assert abs(remembered.age_s - recorded.age_s) < 1.0, (remembered, recorded)
    finally:
        stop.set()
        pusher.close()
        popper.close()
    pushed, popped = int(push_rate * seconds), int(pop_rate * seconds)
    assert (final["pushed"], final["popped"] + final["acquired"], final["depth"]) == (
        pushed,
        popped,
        pushed - popped,
    )
    # Rates over the window (4 intervals = 20 s) once the window lies inside the workload.
    inside = [p for p in published if upkeep.rate_window_s(spec) + 2 < p["t"] < seconds - 1]
    assert inside, published
    for p in inside:
        assert abs(p["pushRate"] - push_rate) <= 0.1 * push_rate, p
        assert abs(p["popRate"] - pop_rate) <= 0.1 * pop_rate, p
    print(f"{kind}: published {len(published)} samples; rates inside the workload:",
          [(p["pushRate"], p["popRate"]) for p in inside])  # fmt: skip
    backend.teardown()
    backend.close()


def test_ring_cleanup_repairs_orphans_and_expired_leases_once(postgres):
    name = f"c_{secrets.token_hex(3)}"
    spec = spec_for("postgres", "upkeep", timeouts={"stalledAfter": "10s", "visibility": "1s"})
    backend = open_backend(spec, name, from_url(postgres.url))
    backend.apply()
    q = connect(postgres.url, name, schema="upkeep", pop_timeout=0.1)
    assert isinstance(q, Queue)
    q.push_many([b"orphan", b"leased"])
    with q._cursor() as cur:
        cur.execute(f"SELECT nextval('upkeep.{q.names.push_seq}')").fetchval()  # a pusher drew 3 and died
        cur.execute(f"SELECT nextval('upkeep.{q.names.pop_seq}')").fetchval()  # a popper drew 1 and died
    q.push(b"plain")
    held = q.acquire(visibility=1)  # ...and a consumer takes "leased" and never acks
    assert held is not None and held.body == b"leased"
    time.sleep(1.2)
    memory = upkeep.Memory()
    first = upkeep.run_upkeep("ns", name, spec, {}, lambda: backend, memory, now=1.0)
    assert first.status["cleanup"]["lastResult"]["expiredLeases"] == 1
    assert first.status["cleanup"]["lastResult"]["orphans"] == 0  # not stalled for 10 s yet
    assert [e.reason for e in first.events] == ["Repaired"]
    time.sleep(10)
    second = upkeep.run_upkeep("ns", name, spec, first.status, lambda: backend, memory, now=20.0)
    assert (
        second.status["cleanup"]["lastResult"]["orphans"],
        second.status["cleanup"]["lastResult"]["holes"],
    ) == (1, 1)
    assert second.status["cleanup"]["repairedTotal"] == 3 and "orphans 1, holes 1" in second.events[0].message
    third = upkeep.run_upkeep("ns", name, spec, second.status, lambda: backend, memory, now=40.0)
    assert not third.events  # nothing left to repair: no Event
    started = time.monotonic()
    got = sorted(m.body for m in q.pop_many(10, timeout=0.5) + q.pop_many(10, timeout=0.5))
    assert got == [b"leased", b"orphan", b"plain"]  # each exactly once
    assert time.monotonic() - started < q.hole_grace  # the voided hole did not make a popper wait
    q.close()
    backend.teardown()
    backend.close()


def test_pipes_cleanup_rolls_back_leases_and_finishes_stalled_pipes(cassandra, stack, monkeypatch):
    monkeypatch.setattr(pipes_tuning, "FINISH_GRACE_S", 1.0)
    monkeypatch.setattr(pipes_tuning, "PIPE_LEASE_S", 1.5)
    url, keyspace, name = stack.cassandra.url(), f"upkeep_{secrets.token_hex(3)}", "stalled"
    spec = spec_for("cassandra", keyspace, pipes={"maxPushTime": "1s"})
    backend = open_backend(spec, name, from_url(url))
    backend.apply()
    stalled = connect(url, name, schema=keyspace)
    consumer = connect(url, name, schema=keyspace)
    assert isinstance(stalled, PipesQueue) and isinstance(consumer, PipesQueue)
    stalled.push_many([b"a", b"b", b"c"])  # its pusher then vanishes without finishing the pipe
    held = consumer.acquire(visibility=1)
    assert held is not None
    consumer.leases.set_current(None)  # the consumer vanishes too, lease and all
    time.sleep(3.0)
    memory = upkeep.Memory()
    done = upkeep.run_upkeep("ns", name, spec, {}, lambda: backend, memory, now=1.0)
    result = done.status["cleanup"]["lastResult"]
    assert (result["finishedPipes"], result["rolledBack"]) == (1, 1), result
    assert done.events and done.events[0].reason == "Repaired"
    got: list[bytes] = []
    while batch := consumer.pop_many(10, timeout=1):  # a pipe at a time: "a" came back in another
        got += [m.body for m in batch]
    assert sorted(got) == [b"a", b"b", b"c"]
    consumer.close_pushers()
    time.sleep(2.5)
    later = upkeep.run_upkeep("ns", name, spec, done.status, lambda: backend, memory, now=20.0)
    assert later.status["cleanup"]["lastResult"]["retiredPipes"] >= 1
    assert consumer.stats().depth == 0 and consumer.stats().in_flight == 0
    backend.teardown()
    backend.close()


# --- maintenance windows ------------------------------------------------------------------------


def test_cron_schedules_in_words_and_windows_in_the_operator_time_zone(monkeypatch):
    assert schedule.describe_cron("0 3 * * *") == "at 03:00 every day"
    assert schedule.describe_cron("30 2 * * 0") == "at 02:30 every Sunday"
    assert schedule.describe_cron("*/15 * * * *") == "every 15 minutes"
    assert schedule.describe_cron("0 3 1 * *") == "on the cron schedule '0 3 1 * *'"
    monkeypatch.setenv("DBQ_TIMEZONE", "Europe/Paris")
    spec = spec_for("postgres", "s")  # default window 0 3 * * *
    wall = datetime(2026, 6, 1, 12, 0, tzinfo=upkeep.UTC)
    action, first = upkeep.maintenance_due(spec, {}, wall)
    assert action == "plan" and upkeep.stamp(first) == "2026-06-02T01:00:00Z"  # 03:00 in Paris (summer time)
    planned = {"maintenance": {"nextRun": upkeep.stamp(first), "cron": "0 3 * * *"}}
    assert upkeep.maintenance_due(spec, planned, first)[0] == "run"
    assert upkeep.maintenance_due(spec, planned, wall)[0] == "wait"
    changed = spec_for("postgres", "s", reindex={"schedule": "30 4 * * *"})
    action, replanned = upkeep.maintenance_due(changed, planned, first)
    assert action == "plan" and upkeep.stamp(replanned) == "2026-06-02T02:30:00Z"
    words = schedule.describe(spec, first)
    assert (
        "at 03:00 every day (Europe/Paris" in words.maintenance and "dead rows pass 20%" in words.maintenance
    )
    assert words.cleanup.startswith("every 5s")


def ring_with_dead_rows(postgres, size: int = 2000) -> tuple[str, QueueSpec, Any]:
    """A ring whose table is full of dead rows: autovacuum off, cycles run while a REPEATABLE
    READ transaction held the old versions, then released."""
    import pyodbc

    name = f"m_{secrets.token_hex(3)}"
    spec = spec_for(
        "postgres", "upkeep", ring={"size": size}, reindex={"threshold": {"deadTuplePercent": 20}}
    )
    backend = open_backend(spec, name, from_url(postgres.url))
    backend.apply()
    admin = pyodbc.connect(postgres.odbc, autocommit=True)
    admin.execute(f"ALTER TABLE upkeep.{name}_ring SET (autovacuum_enabled = false)")
    holder = pyodbc.connect(postgres.odbc, autocommit=False)
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    holder.execute(f"SELECT count(*) FROM upkeep.{name}_ring").fetchval()  # the snapshot is taken
    with connect(postgres.url, name, schema="upkeep") as q:
        for _ in range(size // 100):
            q.push_many([b"x" * 50] * 100)
            assert len(q.pop_many(100)) == 100
    holder.rollback()  # released: the dead rows are now vacuumable, but nobody vacuums
    holder.close()
    # And a bloated index: 40,000 side-table rows come and go (as a burst of redeliveries would);
    # the rows are vacuumed away, the index pages stay.
    admin.execute(
        f"INSERT INTO upkeep.{name}_spill (msg_id, state, pushed_at, visible_at, body)"
        " SELECT g, 1, now(), now(), '\\x00' FROM generate_series(1000000, 1039999) g"
    )
    admin.execute(f"DELETE FROM upkeep.{name}_spill")
    admin.execute(f"VACUUM upkeep.{name}_spill")
    admin.close()
    time.sleep(1.5)  # statistics reach pg_stat_user_tables at most once a second
    return name, spec, backend


def test_bloat_past_the_threshold_is_vacuumed_in_the_window_with_before_and_after(postgres):
    name, spec, backend = ring_with_dead_rows(postgres)
    wall = datetime(2026, 6, 1, 12, 0, tzinfo=upkeep.UTC)
    # Only the maintenance window here: a stats pass reads every page of the ring, and PostgreSQL
    # prunes dead row versions on the pages it reads, which would clear the bloat by itself.
    memory = upkeep.Memory(stats_at=1.0, cleanup_at=1.0)
    planned = upkeep.run_upkeep("ns", name, spec, {}, lambda: backend, memory, now=1.0, wall=wall)
    assert "lastRun" not in planned.status["maintenance"]  # nothing runs before the window
    window = upkeep.parse_stamp(planned.status["maintenance"]["nextRun"])
    done = upkeep.run_upkeep("ns", name, spec, planned.status, lambda: backend, memory, now=2.0, wall=window)
    m = done.status["maintenance"]
    ring = f"{name}_ring dead %"
    assert m["result"] == "Succeeded", m
    assert f"vacuum {name}_ring" in m["actions"] and f"reindex {name}_spill_pkey" in m["actions"]
    assert m["before"][ring] >= 20 > m["after"][ring], m
    index = f"{name}_spill_pkey bloat %"
    assert m["before"][index] >= 30 > m["after"][index], m
    assert m["nextRun"] > m["lastRun"] and any(e.reason == "Maintained" for e in done.events)
    print(f"ring dead rows {m['before'][ring]:.1f}% -> {m['after'][ring]:.1f}%, spill index bloat"
          f" {m['before'][index]:.1f}% -> {m['after'][index]:.1f}% in {m['durationSeconds']} s")  # fmt: skip
    again = upkeep.run_upkeep("ns", name, spec, done.status, lambda: backend, memory, now=3.0, wall=window)
    assert "maintenance" not in again.status  # the next window is tomorrow: not in a loop
    backend.teardown()
    backend.close()


def test_a_long_maintenance_runs_in_the_background_while_statistics_go_on(postgres):
    """The operator hands a due maintenance to its background pool: the VACUUM waits here on a
    lock the test holds, and the queue's statistics are measured meanwhile. The tick after the
    run ends writes its status and Event."""
    import pyodbc

    name, spec, backend = ring_with_dead_rows(postgres)
    wall = datetime(2026, 6, 1, 12, 0, tzinfo=upkeep.UTC)
    memory = upkeep.Memory(stats_at=1.0, cleanup_at=1.0)
    planned = upkeep.run_upkeep("ns", name, spec, {}, lambda: backend, memory, now=1.0, wall=wall)
    window = upkeep.parse_stamp(planned.status["maintenance"]["nextRun"])
    status = dict(planned.status)
    blocker = pyodbc.connect(postgres.odbc, autocommit=False)
    blocker.execute(f"LOCK TABLE upkeep.{name}_ring IN SHARE UPDATE EXCLUSIVE MODE")  # VACUUM waits
    with ThreadPoolExecutor(1) as background:
        started = upkeep.run_upkeep("ns", name, spec, status, lambda: backend, memory, now=2.0, wall=window,
                                    background=background)  # fmt: skip
        assert "lastRun" not in started.status.get("maintenance", {}) and memory.maintenance is not None
        status.update(started.status)
        measured = upkeep.run_upkeep("ns", name, spec, status, lambda: backend, memory, now=1000.0,
                                     wall=window, background=background)  # fmt: skip
        assert measured.status["stats"]["depth"] == 0 and not memory.maintenance.done()
        status.update(measured.status)
        blocker.rollback()
        blocker.close()
        memory.maintenance.result(timeout=120)
        done = upkeep.run_upkeep("ns", name, spec, status, lambda: backend, memory, now=1001.0, wall=window,
                                 background=background)  # fmt: skip
    m = done.status["maintenance"]
    assert m["result"] == "Succeeded" and f"vacuum {name}_ring" in m["actions"], m
    assert any(e.reason == "Maintained" for e in done.events) and memory.maintenance is None
    backend.teardown()
    backend.close()


def test_a_run_left_behind_by_a_killed_operator_blocks_a_second_one(postgres, tmp_path):
    """The operator died while its VACUUM went on in the server: the server session still holds
    the queue's maintenance lock, so the restarted operator skips the window instead of running
    a second maintenance beside it."""
    import signal
    import subprocess
    import sys

    name = f"k_{secrets.token_hex(3)}"
    spec = spec_for("postgres", "upkeep")
    backend = open_backend(spec, name, from_url(postgres.url))
    backend.apply()
    lock = f"dbq-maintenance:upkeep.{name}"
    script = (
        "import pyodbc, sys; c = pyodbc.connect(sys.argv[1], autocommit=True);"
        "assert c.execute('SELECT pg_try_advisory_lock(hashtext(?))', sys.argv[2]).fetchval();"
        "print('locked', flush=True); c.execute('SELECT pg_sleep(60)')"
    )
    old = subprocess.Popen(
        [sys.executable, "-c", script, postgres.odbc, lock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == "locked"
        # Killed only once its statement runs in the server: a client killed between statements
        # closes its idle session, and the server lets the lock go at once.
        watcher = pyodbc.connect(postgres.odbc, autocommit=True)
        deadline = time.monotonic() + 15
        running = (
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()"
            " AND query LIKE '%pg_sleep(60)%'"
        )
        while not watcher.execute(running).fetchval():
            assert time.monotonic() < deadline, "the stand-in operator's statement never started"
            time.sleep(0.02)
        watcher.close()
        old.send_signal(signal.SIGKILL)  # the operator is gone; its statement runs on in the server
        old.wait()
        wall = datetime(2026, 6, 1, 3, 0, tzinfo=upkeep.UTC)
        status = {"maintenance": {"nextRun": upkeep.stamp(wall), "cron": spec.reindex.schedule}}
        done = upkeep.run_upkeep(
            "ns", name, spec, status, lambda: backend, upkeep.Memory(), now=1.0, wall=wall
        )
        assert done.status["maintenance"]["result"] == "Skipped"
        assert [e.reason for e in done.events] == ["MaintenanceSkipped"]
        assert done.status["maintenance"]["nextRun"] > upkeep.stamp(
            datetime.now(upkeep.UTC)
        )  # the next window
    finally:
        admin = pyodbc.connect(postgres.odbc, autocommit=True)
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(60)%'"
        )
        admin.close()
    time.sleep(0.5)
    freed = upkeep.run_upkeep("ns", name, spec, status, lambda: backend, upkeep.Memory(), now=1.0, wall=wall)
    assert freed.status["maintenance"]["result"] in ("NotNeeded", "Succeeded")
    backend.teardown()
    backend.close()


def test_an_empty_queue_whose_positions_did_not_move_keeps_its_statistics_unmeasured(postgres):
    """Its stats routine is renamed away once it was measured empty: it is not called again while
    nothing moves, and is called (and fails) once the refresh is due or a push moves a position.
    A queue holding messages is measured every time."""
    from dbq.backends import odbc_ring
    from dbq.contract.ring import quiet_sequences

    schema, rings = provisioned(postgres, "quiet", ("idle", "busy"), waiting="busy")
    memories = [upkeep.Memory(), upkeep.Memory()]

    def measure(at: float) -> list[QueueStats | Exception]:
        try:
            return list(upkeep.measure_together(rings, memories, at))
        finally:
            for ring in rings:
                ring.close()

    first = measure(1.0)
    for memory, stats in zip(memories, first, strict=True):
        memory.saw_stats(stats, 1.0)  # type: ignore[arg-type]
    assert [s.depth for s in first] == [0, 1]  # type: ignore[union-attr]
    assert memories[0].quiet is not None and memories[1].quiet is None
    assert len(memories[0].quiet[0]) == len(quiet_sequences(rings[0].names))
    with pyodbc.connect(postgres.admin_odbc, autocommit=True) as db:
        db.execute(f"ALTER FUNCTION {schema}.{rings[0].names.routine('stats')}() RENAME TO idle_stats_gone")
    again = measure(2.0)
    assert again[0] is first[0] and again[1].depth == 1  # type: ignore[union-attr]
    assert isinstance(measure(1.0 + upkeep.QUIET_REFRESH_S)[0], DbqError)  # measured in full again
    with connect(postgres.url, "idle", schema=schema) as q:
        q.push(b"arrives")
    assert isinstance(measure(3.0)[0], DbqError)  # the push moved it: measured, and its routine is gone
    assert memories[0].quiet is not None  # an error forgets nothing: the next good measure decides
    read = odbc_ring.positions_of(rings)[0]
    assert read is not None and read.values != memories[0].quiet[0]
    rings[0].close()


def test_positions_are_read_by_the_sequences_oids_once_known_and_by_name_again_after_a_failed_read(postgres):
    from dbq.backends import odbc_ring
    from dbq.contract.ring import quiet_sequences

    schema, rings = provisioned(postgres, "oids", ("a", "b"), waiting="b")
    memories = [upkeep.Memory(), upkeep.Memory()]
    try:
        upkeep.measure_together(rings, memories, 1.0)  # type: ignore[arg-type]
        with contextlib.closing(postgres.admin()) as db:
            oids = [
                tuple(
                    db.execute("SELECT ?::regclass::oid", f"{schema}.{seq}").fetchval()
                    for seq in quiet_sequences(r.names)
                )
                for r in rings
            ]
            db.execute(f"CREATE SEQUENCE {schema}.gone")
            gone = db.execute(f"SELECT '{schema}.gone'::regclass::oid").fetchval()
            db.execute(f"DROP SEQUENCE {schema}.gone")
        assert [m.sequences for m in memories] == oids
        by_name, by_oid = odbc_ring.positions_of(rings), odbc_ring.positions_of(rings, oids)  # type: ignore[arg-type]
        assert [p.values for p in by_oid] == [p.values for p in by_name] and by_name[1].values[0] == 1  # type: ignore[union-attr]
        memories[0].sequences = (gone, *oids[0][1:])  # a sequence made anew under another oid, say
        assert odbc_ring.positions_of(rings, [memories[0].sequences, None]) == [None, None]  # type: ignore[arg-type]
        stats = upkeep.measure_together(rings, memories, 2.0)  # type: ignore[arg-type]
        assert [s.depth for s in stats] == [0, 1] and memories[0].sequences is None  # type: ignore[union-attr]
        upkeep.measure_together(rings, memories, 3.0)  # type: ignore[arg-type]
        assert [m.sequences for m in memories] == oids
    finally:
        for ring in rings:
            ring.teardown()
            ring.close()


def test_a_queue_s_catalog_digest_changes_with_its_own_objects_not_with_a_neighbour_made_or_dropped(postgres):
    from dbq.backends.odbc_ring import catalog_digests

    schema = f"digest_{secrets.token_hex(3)}"
    spec = spec_for("postgres", schema)
    a, b, c = (open_backend(spec, name, from_url(postgres.url)) for name in ("a", "b", "a_b"))

    def digests() -> dict[str, str | None]:
        try:
            found = catalog_digests(a)  # type: ignore[arg-type]
            assert found is not None
            return {queue: found.of(queue) for queue in found.own}
        finally:
            a.close()

    for ring in (a, b):
        ring.apply()
        ring.close()
    before = digests()
    assert set(before) == {"a", "b"}
    c.apply()  # a neighbour named like a's objects: its own objects are its own
    c.close()
    made = digests()
    assert (made["a"], made["b"]) == (before["a"], before["b"]) and "a_b" in made
    with pyodbc.connect(postgres.admin_odbc, autocommit=True) as db:
        db.execute(
            f"GRANT EXECUTE ON FUNCTION {schema}.b_peek(integer) TO PUBLIC"
        )  # behind the operator's back
    changed = digests()
    assert changed["a"] == made["a"] and changed["b"] != made["b"]
    c.teardown()
    c.close()
    dropped = digests()
    assert (dropped["a"], dropped["b"]) == (changed["a"], changed["b"]) and "a_b" not in dropped
    with pyodbc.connect(postgres.admin_odbc, autocommit=True) as db:
        db.execute(f"CREATE TABLE {schema}.stray (x int)")  # of no queue: no drift check reads it
        assert digests() == dropped
        history = f"{schema}.dbq_stats_history"
        owner = db.execute(
            f"SELECT relowner::regrole::text FROM pg_class WHERE oid = '{history}'::regclass"
        ).fetchval()
        db.execute(
            f"ALTER TABLE {history} OWNER TO CURRENT_USER"
        )  # schema-wide: every queue's check reads it
        assert all(digests()[q] != dropped[q] for q in ("a", "b"))
        db.execute(f"ALTER TABLE {history} OWNER TO {owner}")
        db.execute(f"DROP TABLE {schema}.stray")  # so the last queue's teardown drops the schema
    for ring in (a, b):
        ring.teardown()
        ring.close()


def test_catalog_digests_are_kept_while_the_catalog_change_counters_stay_and_read_again_after_a_change(
    postgres,
):
    from dbq.backends.odbc_ring import catalog_digests

    schema, (a, b) = provisioned(postgres, "counters", ("a", "b"))
    try:
        kept = catalog_digests(a)  # type: ignore[arg-type]
        assert kept is not None
        same = catalog_digests(a, kept)  # type: ignore[arg-type]
        assert same is not None and same.changes == kept.changes and same.own is kept.own  # not read again
        with contextlib.closing(postgres.admin()) as db:  # closed: its counts reach the statistics
            db.execute(
                f"GRANT EXECUTE ON FUNCTION {schema}.b_peek(integer) TO PUBLIC"
            )  # behind the operator's back
        deadline = time.monotonic() + 30
        while (again := catalog_digests(a, kept)) is not None and again.changes == kept.changes:  # type: ignore[arg-type]
            assert time.monotonic() < deadline, "the catalog change counters did not move"
            time.sleep(0.5)
        assert again is not None and again.own is not kept.own
        assert again.of("a") == kept.of("a") and again.of("b") != kept.of("b")
    finally:
        for ring in (a, b):
            ring.teardown()
            ring.close()


def test_the_queues_of_a_schema_are_measured_and_sampled_together_and_one_broken_queue_errs_alone(postgres):
    from dbq.backends import odbc_ring
    from dbq.errors import DbqError

    schema = f"many_{secrets.token_hex(3)}"
    spec = spec_for("postgres", schema)
    names = [f"m{i}" for i in range(5)]
    rings = [open_backend(spec, name, from_url(postgres.url)) for name in names]
    for ring in rings:
        ring.apply()
        ring.close()
    for i, name in enumerate(names):
        with connect(postgres.url, name, schema=schema) as q:
            q.push_many([b"x"] * (i + 1))
            if i:
                q.pop_many(i)
    alone = [ring.measure() for ring in rings]
    for ring in rings:
        ring.close()
    odbc_ring._max_locks[rings[0].settings.odbc()] = 2 * odbc_ring.STATS_RELATIONS  # two queues a statement
    try:
        together = odbc_ring.measure_many(rings)
        assert [upkeep.counters(s) for s in together] == [upkeep.counters(s) for s in alone]  # type: ignore[arg-type]
        assert all(0 < s.oldest_age_seconds < 60 for s in together)  # type: ignore[union-attr]
        assert [s.depth for s in alone] == [1, 1, 1, 1, 1] and [s.pushed for s in alone] == [1, 2, 3, 4, 5]
        odbc_ring.record_samples(rings, alone, purge=[(rings[0], 3600.0), (rings[1], 7200.0)])
        rings[0].close()
        with pyodbc.connect(from_url(postgres.url).odbc(), autocommit=True) as db:
            rows = db.execute(
                f"SELECT queue, depth, pushed FROM {schema}.dbq_stats_history ORDER BY queue"
            ).fetchall()
            assert [tuple(r) for r in rows] == [(n, 1, i + 1) for i, n in enumerate(names)]
            db.execute(f"DROP FUNCTION {schema}.{rings[2].names.routine('stats')}")
        measured = odbc_ring.measure_many(rings)
        rings[0].close()
        assert isinstance(measured[2], DbqError)
        assert (
            [upkeep.counters(s) for s in measured[:2] + measured[3:]]
            == [  # type: ignore[arg-type]
                upkeep.counters(s) for s in alone[:2] + alone[3:]
            ]
        )
    finally:
        odbc_ring._max_locks.clear()
