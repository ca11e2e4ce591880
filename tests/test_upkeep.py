"""Statistics and cleanup on schedule (controller/upkeep.py) against real PostgreSQL and Cassandra.

The operator's timer calls `run_upkeep` every few seconds; these tests call it the same way, on a
clock they drive, so every figure can be checked exactly. test_operator.py checks the published
status and Events through the real API server."""

from __future__ import annotations

import secrets
import threading
import time
from datetime import datetime
from typing import Any

import pytest

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.base import Earlier, Sample
from dbq.client import PipesQueue, Queue, connect
from dbq.client import pipes as pipes_module
from dbq.connection import from_url
from dbq.controller import upkeep

# --- pure decisions ------------------------------------------------------------------------------


def sample(pushed: int = 0, popped: int = 0, acquired: int = 0, depth: int = 0, age: float = 0.0) -> Sample:
    return Sample(depth, 0, pushed, popped, acquired, 0, age)


def test_rates_come_from_the_sample_a_window_ago():
    assert upkeep.rates(sample(100), None) is None
    assert upkeep.rates(sample(100), Earlier(0.5, 0, 0)) is None  # too recent to divide by
    assert upkeep.rates(sample(1000, 300, 100), Earlier(20.0, 200, 0)) == (40.0, 20.0)
    assert upkeep.rates(sample(10), Earlier(10.0, 50, 0)) == (0.0, 0.0)  # totals never run back


def test_status_is_written_only_when_a_figure_changed_or_the_heartbeat_is_due():
    old = upkeep.stats_status(sample(10, 5, depth=5, age=100.0), (1.0, 0.5), datetime(2026, 1, 1))
    same = dict(old, measuredAt="2026-01-01T00:00:15Z", oldestMessageAgeSeconds=105.0)
    assert not upkeep.worth_writing(old, same, last_write=1000.0, now=1015.0)
    assert upkeep.worth_writing(old, same, last_write=1000.0, now=1000.0 + upkeep.STATS_HEARTBEAT_S)
    assert upkeep.worth_writing(old, dict(same, depth=6), last_write=1000.0, now=1015.0)
    assert upkeep.worth_writing(old, dict(same, oldestMessageAgeSeconds=150.0), last_write=1000.0, now=1015.0)
    assert upkeep.worth_writing(None, same, last_write=0.0, now=1.0)


def test_tasks_run_when_their_interval_is_due():
    assert upkeep.due(0.0, 15, 3.0)  # never ran (or the operator restarted)
    assert not upkeep.due(100.0, 15, 110.0)
    assert upkeep.due(100.0, 15, 115.0)


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
    host, port = stack.cassandra.contact
    return "cassandra", f"cassandra://{host}:{port}", f"upkeep_{secrets.token_hex(3)}"


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
            done = upkeep.run_upkeep("ns", name, spec, {}, backend, memory, now=time.monotonic())
            if "stats" in done.status:
                published.append({**done.status["stats"], "t": time.monotonic() - t0})
            time.sleep(0.5)
        for t in threads:
            t.join()
        memory.stats_at = 0.0  # due now: the final figures
        final = upkeep.run_upkeep("ns", name, spec, {}, backend, memory).status["stats"]
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
    q.push_many([b"orphan", b"leased", b"plain"])
    with q._cursor() as cur:  # a popper drew the first position and died
        cur.execute(f"SELECT nextval('upkeep.{q.names.pop_seq}')").fetchval()
    held = q.acquire(visibility=1)  # ...and a consumer takes "leased" and never acks
    assert held is not None and held.body == b"leased"
    time.sleep(1.2)
    memory = upkeep.Memory()
    first = upkeep.run_upkeep("ns", name, spec, {}, backend, memory, now=1.0)
    assert first.status["cleanup"]["lastResult"]["expiredLeases"] == 1
    assert first.status["cleanup"]["lastResult"]["orphans"] == 0  # not stalled for 10 s yet
    assert [e.reason for e in first.events] == ["Repaired"]
    time.sleep(10)
    second = upkeep.run_upkeep("ns", name, spec, first.status, backend, memory, now=20.0)
    assert second.status["cleanup"]["lastResult"]["orphans"] == 1
    assert second.status["cleanup"]["repairedTotal"] == 2 and "orphans 1" in second.events[0].message
    third = upkeep.run_upkeep("ns", name, spec, second.status, backend, memory, now=40.0)
    assert not third.events  # nothing left to repair: no Event
    got = sorted(m.body for m in q.pop_many(10, timeout=0.5))
    assert got == [b"leased", b"orphan", b"plain"]  # each exactly once
    q.close()
    backend.teardown()
    backend.close()


def test_pipes_cleanup_rolls_back_leases_and_finishes_stalled_pipes(cassandra, stack, monkeypatch):
    monkeypatch.setattr(pipes_module, "FINISH_GRACE_S", 1.0)
    monkeypatch.setattr(pipes_module, "PIPE_LEASE_S", 1.5)
    host, port = stack.cassandra.contact
    url, keyspace, name = f"cassandra://{host}:{port}", f"upkeep_{secrets.token_hex(3)}", "stalled"
    spec = spec_for("cassandra", keyspace, pipes={"maxPushTime": "1s"})
    backend = open_backend(spec, name, from_url(url))
    backend.apply()
    stalled = connect(url, name, schema=keyspace)
    consumer = connect(url, name, schema=keyspace)
    assert isinstance(stalled, PipesQueue) and isinstance(consumer, PipesQueue)
    stalled.push_many([b"a", b"b", b"c"])  # its pusher then vanishes without finishing the pipe
    held = consumer.acquire(visibility=1)
    assert held is not None
    consumer._set_lease(None)  # the consumer vanishes too, lease and all
    time.sleep(3.0)
    memory = upkeep.Memory()
    done = upkeep.run_upkeep("ns", name, spec, {}, backend, memory, now=1.0)
    result = done.status["cleanup"]["lastResult"]
    assert (result["finishedPipes"], result["rolledBack"]) == (1, 1), result
    assert done.events and done.events[0].reason == "Repaired"
    got: list[bytes] = []
    while batch := consumer.pop_many(10, timeout=1):  # a pipe at a time: "a" came back in another
        got += [m.body for m in batch]
    assert sorted(got) == [b"a", b"b", b"c"]
    consumer.close_pushers()
    time.sleep(2.5)
    later = upkeep.run_upkeep("ns", name, spec, done.status, backend, memory, now=20.0)
    assert later.status["cleanup"]["lastResult"]["retiredPipes"] >= 1
    assert consumer.stats().depth == 0 and consumer.stats().in_flight == 0
    backend.teardown()
    backend.close()
