"""Smart batching's coordination (dbq.client.coalescing), on plain functions: who waits, who
leads, and who gets which answer. The queues' own tests run it against the databases."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dbq.client.coalescing import Coalescer


def test_a_lone_caller_goes_at_once_and_gets_its_own_answer():
    trips: list[list[int]] = []
    double = Coalescer(lambda items: trips.append(items) or [2 * i for i in items], limit=10)
    assert [double(i) for i in range(3)] == [0, 2, 4]
    assert trips == [[0], [1], [2]]  # one thread: nothing to wait for, nothing batched


def test_calls_made_during_a_round_trip_share_the_next_and_each_gets_its_answer():
    gate = threading.Event()
    trips: list[list[int]] = []

    def run(items: list[int]) -> list[int | BaseException]:
        if not trips:
            gate.wait(5)  # the first round trip stays in flight while the others arrive
        trips.append(items)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    square = Coalescer(run, limit=4, in_flight=1)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(square, 0)
        time.sleep(0.1)
        rest = {i: pool.submit(square, i) for i in range(1, 9)}
        time.sleep(0.2)
        gate.set()
        assert first.result() == 0
        for i, f in rest.items():
            if i % 2:
                with pytest.raises(ValueError, match=f"odd {i}"):
                    f.result()
            else:
                assert f.result() == i * 10
    assert trips[0] == [0]
    assert sorted(i for t in trips[1:] for i in t) == list(range(1, 9))
    assert [len(t) for t in trips[1:]] == [4, 4]  # at most `limit` a round trip


def test_a_failed_round_trip_fails_each_of_its_calls_and_the_next_goes_on():
    calls = iter([RuntimeError("connection lost"), None])

    def run(items: list[str]) -> list[str]:
        error = next(calls)
        if error:
            raise error
        return [s.upper() for s in items]

    upper = Coalescer(run, limit=5)
    with pytest.raises(RuntimeError, match="connection lost"):
        upper("a")
    assert upper("b") == "B"


def test_up_to_in_flight_round_trips_run_at_once():
    running, most, lock = [0], [0], threading.Lock()

    def run(items: list[int]) -> list[int]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return items

    echo = Coalescer(run, limit=100, in_flight=3)
    with ThreadPoolExecutor(30) as pool:
        assert list(pool.map(echo, range(300))) == list(range(300))
    assert most[0] == 3
    assert echo.round_trips < 300 / 2  # the calls that waited shared round trips
