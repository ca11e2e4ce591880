"""The worker loop (`Queue.consume`, `dbq consume`) on a real PostgreSQL ring: the credit is a hard
bound, failures are retried with backoff and dead-lettered, every message ends acked once or
dead-lettered (also on Cassandra pipes), a consumer stopped (SIGTERM) or killed (SIGKILL)
loses nothing, a grace bounds the wait for running handlers, and an at-most-once consumer
handles every message it popped."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.client import PipesQueue, Queue, connect
from dbq.client.consume import backoff_s
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames
from tests.operator_harness import wait_for

SCHEMA = f"consume_{secrets.token_hex(3)}"


@pytest.fixture
def ring(postgres) -> Iterator[tuple[Queue, str]]:
    """A ring queue dead-lettering at the third failed delivery, and its url."""
    name = f"q_{secrets.token_hex(4)}"
    backend = OdbcRing(
        from_url(postgres.url), RingTarget(QueueNames(SCHEMA, name), 4096, 100, max_attempts=3)
    )
    backend.apply()
    q = connect(postgres.url, name, schema=SCHEMA, pop_timeout=0.1, smart_batching=False)
    assert isinstance(q, Queue)
    yield q, postgres.url
    q.close()
    backend.teardown()
    backend.close()


def test_backoff_doubles_up_to_its_cap_with_jitter():
    for attempts, low, high in ((1, 0.5, 1.0), (2, 1.0, 2.0), (3, 2.0, 4.0), (10, 5.0, 10.0)):
        delays = [backoff_s(attempts, 1.0, 10.0) for _ in range(200)]
        assert all(low <= d < high for d in delays)
        assert len(set(delays)) > 100  # jittered


def test_the_credit_is_a_hard_bound_on_messages_held(ring):
    q, url = ring
    q.push_many([b"m%d" % i for i in range(300)])
    seen_in_flight: list[int] = []
    done = threading.Event()

    def sample() -> None:  # what the database says is leased, while the loop runs
        with connect(url, q.names.queue, schema=SCHEMA) as watcher:
            while not done.is_set():
                seen_in_flight.append(watcher.stats().in_flight)
                time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    handled: list[bytes] = []
    stats = q.consume(lambda m: (time.sleep(0.003), handled.append(m.body)), concurrency=4, credit=6,
                      max_messages=300)  # fmt: skip
    done.set()
    sampler.join()
    assert stats.handled == 300 and sorted(handled) == sorted(b"m%d" % i for i in range(300))
    assert 1 <= stats.most_in_hand <= 6
    assert max(seen_in_flight) <= 6 and len(seen_in_flight) > 10
    assert q.stats().in_flight == 0


@pytest.fixture
def pipes(cassandra, stack) -> Iterator[tuple[PipesQueue, str]]:
    """A pipes queue dead-lettering at the third failed delivery, and its url."""
    url, name = stack.cassandra.url(), f"q_{secrets.token_hex(4)}"
    spec = QueueSpec.model_validate(
        {"backend": "cassandra", "design": "pipes", "deadLetter": {"maxAttempts": 3},
         "connection": {"secretRef": {"name": "unused"}, "schema": SCHEMA}}
    )  # fmt: skip
    backend = open_backend(spec, name, from_url(url))
    backend.apply()
    q = connect(url, name, schema=SCHEMA, pop_timeout=0.1)
    assert isinstance(q, PipesQueue)
    yield q, url
    q.close()
    backend.teardown()
    backend.close()


@pytest.mark.parametrize("design", ["ring", "pipes"])
def test_a_handler_that_raises_is_retried_with_backoff_then_dead_lettered(request, design):
    q, _ = request.getfixturevalue(design)
    msg_id = q.push(b"poison")
    calls: list[float] = []

    def handler(m):
        calls.append(time.monotonic())
        raise ValueError("cannot parse it")

    # Pipes too, with no repair running: the consumer pushes its deferred message again when due.
    stats = q.consume(handler, backoff=0.4, max_backoff=2, max_messages=3)
    assert (stats.failed, stats.dead_lettered, stats.handled) == (3, 1, 0)
    assert calls[1] - calls[0] >= 0.2 and calls[2] - calls[1] >= 0.4  # 0.4 x [0.5, 1), then doubled
    # Each retry comes once its backoff is over (pipes: up to SKEW_S + OWN_ROLLBACK_S later).
    assert calls[2] - calls[0] < 8, calls
    [dead] = q.dead_letters()
    assert (dead.id, dead.attempts) == (msg_id, 3)
    assert dead.error == "ValueError: cannot parse it"


@pytest.mark.parametrize("design", ["ring", "pipes"])
def test_every_message_ends_acked_once_or_dead_lettered_with_four_producers_and_failing_handlers(
    request, design
):
    q, url = request.getfixturevalue(design)
    total, producers = 2000, 4
    bodies = [b"c%d" % i for i in range(total)]
    acked: Counter[bytes] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def produce(part: list[bytes]) -> None:
        with connect(url, q.names.queue, schema=SCHEMA) as p:
            for start in range(0, len(part), 50):
                p.push_many(part[start : start + 50])

    def handler(m) -> None:
        if random.random() < 0.1:
            raise RuntimeError("10% of deliveries fail")
        with lock:
            acked[m.body] += 1

    pushers = [threading.Thread(target=produce, args=(bodies[i::producers],)) for i in range(producers)]
    for t in pushers:
        t.start()
    result: list = []
    options = {"concurrency": 4, "credit": 8, "backoff": 0.01, "max_backoff": 0.05, "stop": stop}
    worker = threading.Thread(target=lambda: result.append(q.consume(handler, **options)))
    worker.start()
    for t in pushers:
        t.join()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        s = q.stats()
        if s.pushed == total and s.depth == 0 and s.in_flight == 0 and s.delayed == 0:
            break
        time.sleep(0.2)
    stop.set()
    worker.join(timeout=60)
    dead = Counter(d.body for d in q.dead_letters(limit=total))
    assert set(acked) | set(dead) == set(bodies)  # none lost
    assert not set(acked) & set(dead)  # none in both
    assert max(acked.values()) == 1 and (not dead or max(dead.values()) == 1)  # none twice
    assert result[0].handled == sum(acked.values())
    assert result[0].most_in_hand <= 8
    assert q.stats().dead == len(dead)


def consumer(url: str, q: Queue, *extra: str) -> subprocess.Popen[bytes]:
    """`dbq consume` as a separate process: each message takes its command 0.5 s."""
    return subprocess.Popen(
        [sys.executable, "-m", "dbq.cli", "consume", q.names.queue, "--url", url, "--schema", SCHEMA,
         "--concurrency", "2", "--credit", "4", *extra, "--", "sh", "-c", "sleep 0.5; cat > /dev/null"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_a_consumer_stopped_with_sigterm_loses_nothing_and_leaves_nothing_leased(ring):
    q, url = ring
    q.push_many([b"t%d" % i for i in range(20)])
    proc = consumer(url, q)
    # Stopped mid-batch: once one message is handled and others are in hand (a handler started
    # before the signal finishes and acks; the ones not started go back).
    wait_for(lambda: (s := q.stats()).popped >= 1 and s.in_flight > 0, 30, "a message handled, more in hand")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    stats = q.stats()
    assert stats.in_flight == 0  # nothing left leased: no visibility timeout to wait for
    handled = int(dict(part.rsplit(" ", 1) for part in out.decode().strip().split(", "))["handled"])
    assert 0 < handled < 20 and stats.popped == handled and stats.depth == 20 - handled
    rest = q.pop_many(20)
    assert len(rest) == 20 - handled and max(m.attempts for m in rest) <= 1  # returns are not attempts


def test_a_consumer_killed_with_sigkill_has_its_messages_back_after_the_visibility_timeout(ring):
    q, url = ring
    q.push_many([b"k%d" % i for i in range(20)])
    proc = consumer(url, q, "--visibility", "2")
    deadline = time.monotonic() + 30
    while q.stats().in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    held = q.stats().in_flight
    assert held > 0
    assert q.repair(orphan_grace=60).expired_leases == 0  # still leased until the visibility passes
    time.sleep(2.2)
    assert q.repair(orphan_grace=60).expired_leases == held
    stats = q.stats()
    assert stats.in_flight == 0 and stats.depth + stats.popped == 20


def test_grace_bounds_the_wait_for_a_running_handler_whose_message_comes_back(ring):
    q, _ = ring
    q.push_many([b"g0", b"g1"])
    started, release = threading.Event(), threading.Event()
    stop = threading.Event()
    result: list = []

    def slow(message) -> None:
        started.set()
        release.wait(30)

    worker = threading.Thread(
        target=lambda: result.append(q.consume(slow, credit=1, visibility=2, stop=stop, grace=0.5))
    )
    worker.start()
    assert started.wait(10)
    stop.set()
    stopped = time.monotonic()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - stopped < 0.5 + 1.0  # grace, and a poll
    assert result[0].abandoned == 1 and result[0].handled == 0
    time.sleep(2.2)  # its lease is no longer extended: it lapses with the visibility
    assert q.repair(orphan_grace=60).expired_leases == 1
    release.set()  # the abandoned handler ends late: its ack finds the lease lost
    wait_for(lambda: result[0].lost_leases == 1, 10, "the late ack refused")
    assert sorted(m.body for m in q.pop_many(10)) == [b"g0", b"g1"]


def test_at_most_once_stops_popping_first_and_handles_every_message_it_popped(ring):
    q, _ = ring
    q.push_many([b"a%d" % i for i in range(200)])
    handled: list[bytes] = []
    stop = threading.Event()

    def handler(message) -> None:
        handled.append(message.body)
        if len(handled) == 20:
            stop.set()
        time.sleep(0.02)

    result = q.consume(handler, concurrency=4, stop=stop, at_most_once=True)
    stats = q.stats()
    assert result.handled == len(handled) == stats.popped  # every message popped was handled
    assert len(set(handled)) == len(handled) and 20 <= len(handled) < 200
    assert stats.depth == 200 - len(handled) and stats.in_flight == 0
    with pytest.raises(ValueError, match="credit 8 is above concurrency 2"):
        q.consume(handler, concurrency=2, credit=8, at_most_once=True)


def test_an_at_most_once_consumer_stopped_with_sigterm_handles_what_it_popped(ring):
    q, url = ring
    q.push_many([b"p%d" % i for i in range(20)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "dbq.cli", "consume", q.names.queue, "--url", url, "--schema", SCHEMA,
         "--concurrency", "2", "--at-most-once", "--grace", "20", "--", "sh", "-c", "sleep 0.5; cat > /dev/null"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_for(lambda: q.stats().popped >= 3, 30, "messages popped")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    summary = dict(part.rsplit(" ", 1) for part in out.decode().strip().split(", "))
    stats = q.stats()
    assert int(summary["handled"]) == stats.popped and int(summary["abandoned"]) == 0
    assert stats.depth == 20 - stats.popped and stats.in_flight == 0


@pytest.mark.parametrize("at_most_once", [False, True], ids=["leased", "at-most-once"])
def test_until_empty_handles_what_is_there_and_returns(ring, at_most_once):
    """A Job's consumer: every message there is handled once, then the loop ends by itself."""
    q, _ = ring
    q.push_many([b"j%d" % i for i in range(40)])
    handled: list[bytes] = []
    started = time.monotonic()
    stats = q.consume(lambda m: (time.sleep(0.01), handled.append(m.body)), concurrency=4,
                      until_empty=True, at_most_once=at_most_once)  # fmt: skip
    assert sorted(handled) == sorted(b"j%d" % i for i in range(40)) and stats.handled == 40
    assert time.monotonic() - started < 10
    assert (q.stats().depth, q.stats().in_flight) == (0, 0)
