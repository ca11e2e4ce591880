"""A worker loop with credit-based flow control: `consume(queue, handler, ...)`.

One fetching thread acquires messages (leased, at-least-once) while fewer than `credit` are in
hand (acquired and not yet acked or nacked); `concurrency` threads run the handler. A handler
that returns acks its message; one that raises nacks it with the exception's text and an
exponential, capped, jittered backoff (a ring queue with spec.deadLetter dead-letters it after
maxAttempts). While a handler runs, its lease is extended every half visibility (where the
design can: ring queues). Messages of every design offer `fail(delay, error)`: the nack each
design can make. `stop` (an Event; the CLI sets it on SIGTERM) ends the loop
gracefully: nothing more is acquired, messages not started are given back at once (nack,
no delay), running handlers finish and ack. With `grace` (seconds), the loop returns that long
after `stop` at the latest: handlers still running then are abandoned (their leases are no
longer extended, so their messages come back once their visibility passes). A consumer killed
outright loses nothing either: its messages come back once their visibility passes.

With `at_most_once`, messages are popped instead (gone from the queue once taken): a message is
popped only for a worker free to start it (the credit is the concurrency), and on `stop` the loop
stops popping first, then lets every popped message's handler run to its end, so nothing popped
is left unhandled (within `grace`: past it, a handler still running is abandoned with its
message). A handler that raises loses its message (counted as failed): there is nothing to nack.

The credit is a hard bound: a message is acquired only after a unit of credit is taken, and the
unit comes back only once the message is acked or nacked.
"""

from __future__ import annotations

import queue as queues
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dbq.client.waiting import count_arg, seconds_arg
from dbq.errors import DbqError, LeaseLost

POLL_S = 0.5  # how long one acquire waits for a message before the loop looks at `stop` again


@dataclass
class ConsumeStats:
    """What a consume loop did, and the most messages it held at once (never above its credit)."""

    handled: int = 0  # acked after the handler returned
    failed: int = 0  # nacked after the handler raised (retried later, or dead-lettered)
    dead_lettered: int = 0
    returned: int = 0  # acquired, not started, given back when stopping
    abandoned: int = 0  # still handled when `grace` ran out after `stop`
    lost_leases: int = 0  # the lease had expired when the message was acked or nacked
    most_in_hand: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


def backoff_s(attempts: int, base: float, cap: float) -> float:
    """The delay before a failed message is tried again: base * 2^(attempts-1), at most `cap`,
    times a random factor in [0.5, 1) so failures of many messages spread out."""
    return min(cap, base * 2 ** max(attempts - 1, 0)) * (0.5 + random.random() / 2)


def consume(
    queue: Any,
    handler: Callable[[Any], object],
    *,
    concurrency: int = 1,
    credit: int | None = None,
    visibility: float | None = None,
    backoff: float = 1.0,
    max_backoff: float = 60.0,
    stop: threading.Event | None = None,
    max_messages: int | None = None,
    on_progress: Callable[[ConsumeStats], None] | None = None,
    grace: float | None = None,
    at_most_once: bool = False,
    until_empty: bool = False,
) -> ConsumeStats:
    """Run `handler(message)` for messages of `queue` (a client from `dbq.client.connect`) until
    `stop` is set, or `max_messages` were handled or failed, or (with `until_empty`, a Job's
    consumer) a take found nothing for POLL_S and the handlers running then finished. `credit` (default: concurrency)
    bounds the messages held at once; `visibility` is their lease (default: the queue's);
    `grace` bounds the wait for running handlers after `stop` (default: none);
    `at_most_once` pops instead of acquiring (the module's docstring)."""
    workers = count_arg(concurrency, "concurrency")
    limit = count_arg(credit if credit is not None else workers, "credit")
    if at_most_once and limit > workers:
        raise ValueError(
            f"credit {limit} is above concurrency {workers}: at most once, a message is popped only for"
            " a worker free to start it; leave credit out or make it at most concurrency"
        )
    lease = seconds_arg(visibility, "visibility", getattr(queue, "visibility", 30.0), positive=True)
    base, cap = seconds_arg(backoff, "backoff", 1.0), seconds_arg(max_backoff, "max_backoff", 60.0)
    if max_messages is not None:
        count_arg(max_messages, "max_messages")
    grace_s = None if grace is None else seconds_arg(grace, "grace", 0.0)
    stop = stop or threading.Event()
    stats = ConsumeStats()
    credits = threading.Semaphore(limit)
    in_hand = [0]
    ready: queues.Queue[Any] = queues.Queue()
    fetched_all = threading.Event()
    budget = [max_messages]  # messages still to take, when bounded

    def held(delta: int) -> None:
        with stats.lock:
            in_hand[0] += delta
            stats.most_in_hand = max(stats.most_in_hand, in_hand[0])

    def settle(message: Any, ok: bool, error: str | None) -> None:
        try:
            if at_most_once:  # popped: nothing to ack or nack
                stats.add(handled=int(ok), failed=int(not ok))
            elif ok:
                message.ack()
                stats.add(handled=1)
            else:
                delay = backoff_s(int(getattr(message, "attempts", 1) or 1), base, cap)
                dead = message.fail(delay, error)
                stats.add(failed=1, dead_lettered=int(bool(dead)))
        except LeaseLost:
            stats.add(lost_leases=1)
        finally:
            held(-1)
            credits.release()
            if on_progress:
                on_progress(stats)

    def fetch() -> None:
        try:
            while not stop.is_set():
                if budget[0] is not None and budget[0] <= 0:
                    return
                if not credits.acquire(timeout=POLL_S):
                    continue
                try:
                    if at_most_once:
                        message = queue.pop(timeout=POLL_S)
                    else:
                        message = queue.acquire(timeout=POLL_S, visibility=lease)
                except DbqError:
                    credits.release()
                    stop.wait(POLL_S)  # the database is away: try again shortly
                    continue
                if message is None:
                    credits.release()
                    if until_empty:
                        return  # what is in hand is handled; then the loop ends
                    continue
                held(+1)
                if budget[0] is not None:
                    budget[0] -= 1
                ready.put(message)
        finally:
            fetched_all.set()

    def work() -> None:
        while True:
            try:
                message = ready.get(timeout=0.05)
            except queues.Empty:
                if fetched_all.is_set() and ready.empty():
                    return
                continue
            if stop.is_set() and not at_most_once:  # not started: give it back at once
                try:
                    message.give_back()
                    stats.add(returned=1)
                except LeaseLost:
                    stats.add(lost_leases=1)
                finally:
                    held(-1)
                    credits.release()
                continue
            keeper = _LeaseKeeper(message if not at_most_once else None, lease)
            with stats.lock:
                keepers.add(keeper)
            try:
                handler(message)
            except Exception as e:  # the handler's failure is the message's, not the loop's
                keeper.stop()
                settle(message, False, f"{type(e).__name__}: {e}"[:4000])
            else:
                keeper.stop()
                settle(message, True, None)
            finally:
                with stats.lock:
                    keepers.discard(keeper)

    keepers: set[_LeaseKeeper] = set()  # of the handlers running
    threads = [threading.Thread(target=fetch, name="dbq-consume-fetch", daemon=True)]
    threads += [threading.Thread(target=work, name=f"dbq-consume-{i}", daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    _wait(threads, stop, grace_s)
    with stats.lock:
        running = list(keepers)
    for keeper in running:  # grace ran out: their leases lapse, their messages come back
        keeper.stop()
    stats.add(abandoned=len(running))
    return stats


def _wait(threads: list[threading.Thread], stop: threading.Event, grace: float | None) -> None:
    """Until the threads end, or `grace` seconds after `stop` is set (None: no limit)."""
    deadline = None
    while any(t.is_alive() for t in threads):
        if deadline is None and stop.is_set() and grace is not None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() >= deadline:
            return
        for t in threads:
            t.join(0.05)
            if t.is_alive():
                break


class _LeaseKeeper:
    """Extends a running handler's lease every half visibility, where the design can."""

    def __init__(self, message: Any, visibility: float) -> None:
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        if message is not None and hasattr(message, "extend"):
            self._thread = threading.Thread(target=self._run, args=(message, visibility), daemon=True)
            self._thread.start()

    def _run(self, message: Any, visibility: float) -> None:
        while not self._done.wait(visibility / 2):
            try:
                message.extend(visibility)
            except DbqError:
                return  # lost already: its ack will say so

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
