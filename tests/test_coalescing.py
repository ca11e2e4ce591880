"""Smart batching's coordination (dbq.client.coalescing), on plain functions: who waits, who
leads, and who gets which answer. The queues' own tests run it against the databases."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from dbq.client import coalescing
from dbq.client.coalescing import ByOptions, Coalescer, ack_coalescer, take_coalescer
from dbq.errors import LeaseLost


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

    square = Coalescer(run, limit=4, parallel=1)
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


def test_the_callers_of_a_round_trip_return_while_the_next_is_in_flight():
    """Answered callers are woken as their round trip ends, not held until the next one ends:
    here the third round trip waits for a caller of the second to have returned."""
    gates = [threading.Event() for _ in range(3)]
    returned = threading.Event()
    trips: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        trips.append(items)
        if len(trips) < 3:
            gates[len(trips)].wait(5)  # in flight while the next callers arrive
        else:
            assert returned.wait(5), "the second round trip's callers were not woken"
        return items

    echo = Coalescer(run, limit=2, parallel=1)

    def call_then_tell(i: int) -> int:
        got = echo(i)
        returned.set()
        return got

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(echo, 0)
        time.sleep(0.1)
        second = pool.submit(echo, 1), pool.submit(call_then_tell, 2)  # share the second round trip
        time.sleep(0.1)
        gates[1].set()
        time.sleep(0.1)
        third = pool.submit(echo, 3)  # arrives while the second is in flight
        time.sleep(0.1)
        gates[2].set()
        assert (first.result(5), second[0].result(5), second[1].result(5), third.result(5)) == (0, 1, 2, 3)
    assert trips == [[0], [1, 2], [3]]


def in_thread(call: Callable[[], int]) -> Future[int]:
    """`call` in a daemon thread: should it never return, the test fails by timeout, not hangs."""
    done: Future[int] = Future()
    threading.Thread(target=lambda: done.set_result(call()), daemon=True).start()
    return done


def gated_echo() -> tuple[Coalescer[int, int], list[threading.Event], list[list[int]]]:
    """A smart batcher whose n-th round trip (from 1) stays in flight until gates[n] is set; the
    items of its round trips."""
    gates = [threading.Event() for _ in range(3)]
    trips: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        trips.append(items)
        gates[len(trips)].wait(5)
        return items

    return Coalescer(run, limit=10, parallel=1), gates, trips


class Interrupted(Exception):
    pass


@pytest.fixture
def interruptible() -> Iterator[Callable[[float], None]]:
    """`interrupt(after)`: raise Interrupted in this (the main) thread `after` seconds from now,
    by a signal, as KeyboardInterrupt comes: a lock being waited for is left with it."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    main = threading.get_ident()
    assert main == threading.main_thread().ident
    previous = signal.signal(signal.SIGUSR1, handler)
    yield lambda after: threading.Timer(after, signal.pthread_kill, (main, signal.SIGUSR1)).start()
    signal.signal(signal.SIGUSR1, previous)


def test_a_caller_interrupted_in_a_round_trip_in_flight_is_skipped_by_the_others_waking(
    interruptible: Callable[[float], None],
) -> None:
    """The answered callers of a round trip wake one another in turn: one interrupted while its
    round trip is in flight must not leave the callers after it waiting for its turn."""
    echo, gates, trips = gated_echo()
    first = in_thread(lambda: echo(0))
    time.sleep(0.1)
    heir = in_thread(lambda: echo(1))  # waits first: leads the second round trip
    time.sleep(0.1)
    late = in_thread(lambda: time.sleep(0.1) or echo(3))  # after this caller, in its round trip
    threading.Timer(0.2, gates[1].set).start()
    interruptible(0.3)  # the second round trip is in flight by then
    with pytest.raises(Interrupted):
        echo(2)
    gates[2].set()
    assert (first.result(5), heir.result(5), late.result(5)) == (0, 1, 3)
    assert trips == [[0], [1, 2, 3]]


def test_a_caller_interrupted_while_waiting_for_a_round_trip_drops_out(
    interruptible: Callable[[float], None],
) -> None:
    gate = threading.Event()
    trips: list[list[int]] = []
    echo = Coalescer(lambda items: trips.append(items) or (gate.wait(5) and items), limit=10, parallel=1)
    leader = in_thread(lambda: echo(4))
    time.sleep(0.05)
    interruptible(0.05)
    with pytest.raises(Interrupted):
        echo(5)  # waits for the next round trip, first in line to lead it
    after = in_thread(lambda: echo(6))
    time.sleep(0.05)
    gate.set()
    assert (leader.result(5), after.result(5)) == (4, 6)
    assert trips == [[4], [6]]


@pytest.mark.parametrize("victim_leads", [True, False])
def test_a_caller_interrupted_as_it_is_woken_does_what_it_was_woken_for(
    monkeypatch: pytest.MonkeyPatch, victim_leads: bool
) -> None:
    """Woken to lead the next round trip, the interrupted caller hands it to the next caller in
    it; woken with its answer, it wakes the next answered caller."""
    victim: list[int] = []
    wait = coalescing._Call.wait

    def wait_then_interrupted(call: coalescing._Call[int, int]) -> None:
        wait(call)
        if threading.get_ident() in victim:
            raise Interrupted

    monkeypatch.setattr(coalescing._Call, "wait", wait_then_interrupted)

    def interrupted(i: int) -> int:
        victim.append(threading.get_ident())
        with pytest.raises(Interrupted):
            echo(i)
        return -1

    echo, gates, trips = gated_echo()
    first = in_thread(lambda: echo(0))
    time.sleep(0.1)
    callers = [in_thread(lambda: interrupted(1))] if victim_leads else [in_thread(lambda: echo(1))]
    time.sleep(0.1)
    callers.append(in_thread(lambda: echo(2)) if victim_leads else in_thread(lambda: interrupted(2)))
    time.sleep(0.1)
    callers.append(in_thread(lambda: echo(3)))
    time.sleep(0.1)
    for gate in gates:
        gate.set()
    got = [first.result(5)] + [c.result(5) for c in callers]
    if victim_leads:  # its round trip went to caller 2
        assert got == [0, -1, 2, 3] and trips == [[0], [2, 3]]
    else:  # caller 2 had its answer, and woke caller 3
        assert got == [0, 1, -1, 3] and trips == [[0], [1, 2, 3]]


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


class Trips:
    """A round trip that takes `seconds`, and what ran beside each: how many were under way as
    each began, and the calls each carried."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = 0
        self.beside: list[int] = []
        self.carried: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, items: list[int]) -> list[int]:
        with self.lock:
            self.running += 1
            self.beside.append(self.running)
            self.carried.append(len(items))
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return items


def test_calls_with_a_free_connection_go_at_once_each_in_its_own_round_trip():
    """As many threads as the pool has connections never wait for one another: smart batching
    changes nothing for them."""
    trips = Trips(0.2)
    echo = Coalescer(trips, limit=100, parallel=4)
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(echo, range(4))) == list(range(4))
    assert trips.carried == [1, 1, 1, 1] and max(trips.beside) == 4


def test_a_crowd_merges_round_trips_down_to_one_until_none_waits():
    """Past the pool, calls wait together and round trips merge (each leader that ends beside
    another leaves the waiting calls to it) down to one at a time, as fewer and larger round
    trips cost less. Once a round trip ends with no call waiting, calls go at once again."""
    trips = Trips(0.005)
    echo = Coalescer(trips, limit=100, parallel=4)

    def caller(t: int) -> list[int]:
        return [echo(t * 1000 + i) for i in range(40)]

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(caller, range(32)))
    assert answers == [[t * 1000 + i for i in range(40)] for t in range(32)]
    assert max(trips.beside) <= 4
    middle = trips.beside[len(trips.beside) // 4 : -len(trips.beside) // 4]
    assert middle and max(middle) == 1, trips.beside  # merged: one round trip at a time
    assert sum(trips.carried) == 32 * 40 and len(trips.carried) < 32 * 40 / 4
    echo(-1)  # alone: the crowd is over
    trips.seconds = 0.2
    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(echo, range(3))) == [0, 1, 2]
    assert trips.carried[-3:] == [1, 1, 1] and trips.beside[-1] == 3  # at once again


def test_parallel_is_checked():
    with pytest.raises(ValueError, match="limit and parallel must be at least 1, not 10 and 0"):
        Coalescer(lambda items: items, limit=10, parallel=0)


def test_takes_ask_for_exactly_the_waiting_calls_and_those_left_without_get_none():
    asked: list[int] = []
    stock = list(range(5))
    gate = threading.Event()

    def take(n: int) -> list[int]:
        if not asked:
            gate.wait(5)
        asked.append(n)
        got, stock[:] = stock[:n], stock[n:]
        return got

    pop = take_coalescer(lambda calls: take(len(calls)), limit=100, parallel=1)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(pop, None)
        time.sleep(0.1)
        rest = [pool.submit(pop, None) for _ in range(8)]
        time.sleep(0.2)
        gate.set()
        answers = [first.result()] + [f.result() for f in rest]
    assert asked == [1, 8]  # never more than the calls waiting: no message taken for nobody
    assert sorted(a for a in answers if a is not None) == [0, 1, 2, 3, 4]
    assert answers.count(None) == 4


def test_each_ack_whose_lease_was_lost_gets_its_own_lease_lost():
    acked: list[str] = []

    def ack_many(messages: list[str]) -> None:
        lost = [m for m in messages if m.startswith("late")]
        acked.extend(m for m in messages if m not in lost)
        if lost:
            raise LeaseLost.of_acks(lost, len(messages))

    ack = ack_coalescer(ack_many, limit=100)
    with ThreadPoolExecutor(8) as pool:
        futures = {m: pool.submit(ack, m) for m in ["a", "late1", "b", "c", "late2", "d", "e", "f"]}
    for m, f in futures.items():
        if m.startswith("late"):
            with pytest.raises(LeaseLost) as lost:
                f.result()
            assert lost.value.messages == [m]
        else:
            assert f.result() is None
    assert sorted(acked) == ["a", "b", "c", "d", "e", "f"]


def test_calls_share_round_trips_with_the_calls_of_the_same_options_only():
    gate = threading.Event()
    trips: list[tuple[str, list[int]]] = []

    def coalescer(option: str) -> Coalescer[int, str]:
        def run(items: list[int]) -> list[str]:
            if option == "slow" and not any(o == "slow" for o, _ in trips):
                gate.wait(5)  # the first slow round trip stays in flight while the others arrive
            trips.append((option, items))
            return [f"{option}{i}" for i in items]

        return Coalescer(run, limit=100, parallel=1)

    by_options: ByOptions[str, int, str] = ByOptions(coalescer)
    with ThreadPoolExecutor(10) as pool:
        first = pool.submit(by_options, "slow", 0)
        time.sleep(0.1)
        slow = [pool.submit(by_options, "slow", i) for i in range(1, 5)]
        time.sleep(0.1)
        # Calls of other options are not held behind the slow round trip: they come back first.
        fast = [pool.submit(by_options, "fast", i) for i in range(5)]
        assert sorted(f.result(timeout=5) for f in fast) == [f"fast{i}" for i in range(5)]
        assert not first.done()
        gate.set()
        assert [first.result()] + [f.result() for f in slow] == [f"slow{i}" for i in range(5)]
    slow_trips = [items for option, items in trips if option == "slow"]
    assert slow_trips[0] == [0] and sorted(slow_trips[1]) == [1, 2, 3, 4]  # the waiting four shared one
    assert by_options.round_trips == len(trips)


def test_past_the_most_option_values_the_oldest_is_forgotten_and_made_again_when_called():
    made: list[int] = []

    def coalescer(option: int) -> Coalescer[int, int]:
        made.append(option)
        return Coalescer(lambda items: [option + i for i in items], limit=10)

    by_options: ByOptions[int, int, int] = ByOptions(coalescer, most=3)
    assert [by_options(o, 1) for o in (10, 20, 30, 10, 40, 10)] == [11, 21, 31, 11, 41, 11]
    assert made == [10, 20, 30, 40, 10]  # 40 made the oldest (10) go; 10 is made again
    assert by_options.round_trips == 6  # the forgotten one's round trips still count
