"""Smart batching: single calls made at once by many threads share round trips.

A caller goes at once while fewer than `parallel` round trips are under way (the client's pool
size: a call with a free connection never waits) and no call is waiting. Past that, the calls
that arrive wait together; when a round trip ends, the first of them leads the next one for them
all (up to `limit`), and the previous leader returns. No timer, no added latency. Each caller
gets its own result or its own error. A thread's calls keep their order, since each returns
before the next is made.

Under load, fewer and larger round trips cost less than as many as the pool allows. A round trip
that ends while more callers are in a call (waiting, leading, or answered and not yet returned)
than round trips may go at once makes the coalescer crowded: then a caller never opens a round
trip beside the ones under way, and a leader that ends while others are under way leaves the
waiting calls to them, so round trips merge down to one. A round trip that ends with no more
callers than that ends the crowd. So a few threads go as if there were no smart batching (each
call its own round trip on its own connection) and many share round trips as one leader at a
time would.

Calls that carry options (a visibility, a ttl, a delay) share round trips with the calls of the
same options (`ByOptions`: a coalescer for each option value); a caller's own timeout is kept by
the caller, which tries again until it runs out, so it never makes a call go alone.

The answered callers of a round trip wake one another in turn, each the next as it returns,
rather than all at once by the leader: their threads run Python one at a time anyway, and woken
together they would first queue for the GIL (a wake-up and a sleep more each, the most of a call's
cost under load).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from dbq.client.waiting import Deadline, Waker, take_until
from dbq.errors import LeaseLost

Item = TypeVar("Item")
Result = TypeVar("Result")
Taken = TypeVar("Taken")
Options = TypeVar("Options", bound=Hashable)

PARALLEL = 4  # round trips at once before calls share them, where a client has no pool size


class _Call(Generic[Item, Result]):
    __slots__ = ("abandoned", "answered", "error", "handed", "item", "next", "result", "wake")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.answered = False
        self.handed: list[_Call[Item, Result]] | None = None  # a round trip this caller is to lead
        # A caller that has to wait blocks on this lock, held from the start; whoever answers
        # it or hands it a round trip releases it (cheaper than an Event: no condition, no
        # lock allocated per wait). None for a caller that leads at once.
        self.wake: threading.Lock | None = None
        self.next: _Call[Item, Result] | None = None  # the caller of its round trip it wakes once answered
        self.abandoned = False  # interrupted while waiting (KeyboardInterrupt): nobody to wake

    def wait(self) -> None:
        assert self.wake is not None
        self.wake.acquire()

    def signal(self) -> None:
        if self.wake is not None:
            self.wake.release()


class Coalescer(Generic[Item, Result]):
    """`run(items)` makes one round trip for several calls and answers, for each item in order,
    its result or the exception that call must raise. At most `parallel` round trips at once
    (a number, or a function that tells it when a call comes), fewer in a crowd (the module's
    docstring)."""

    def __init__(
        self,
        run: Callable[[list[Item]], Sequence[Result | BaseException]],
        limit: int,
        parallel: int | Callable[[], int] = PARALLEL,
    ) -> None:
        if limit < 1 or (isinstance(parallel, int) and parallel < 1):
            raise ValueError(f"limit and parallel must be at least 1, not {limit} and {parallel}")
        self._run = run
        self._limit = limit
        self._parallel = parallel if callable(parallel) else lambda: parallel
        self._lock = threading.Lock()
        self._waiting: list[_Call[Item, Result]] = []
        self._leaders = 0
        self._crowded = False  # the last round trip to end saw more callers than round trips may go
        self._inside = 0  # callers in a call: waiting, leading, or answered and not yet returned
        self.round_trips = 0  # for benchmarks and tests: how many calls of `run`

    def __call__(self, item: Item) -> Result:
        call: _Call[Item, Result] = _Call(item)
        batch = None
        with self._lock:
            self._inside += 1
            alone = not self._waiting and not self._crowded and self._leaders < self._parallel()
            if alone or self._leaders == 0:  # lead a round trip of one
                self._leaders += 1
                self.round_trips += 1
                batch = [call]
            else:
                call.wake = threading.Lock()
                call.wake.acquire()
                self._waiting.append(call)
        try:
            while True:
                if batch is not None:
                    self._lead(batch)
                if call.answered:
                    break
                try:
                    call.wait()
                except BaseException:  # interrupted: the calls that count on this one must not hang
                    self._abandon(call)
                    raise
                batch, call.handed = call.handed, None
        finally:
            with self._lock:
                self._inside -= 1
        if call.next is not None:
            call.next.signal()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _lead(self, batch: list[_Call[Item, Result]]) -> None:
        try:
            answers: Sequence[Result | BaseException] = self._run([c.item for c in batch])
            if len(answers) != len(batch):
                raise AssertionError(f"{len(answers)} answers for {len(batch)} calls")
        except BaseException as e:  # the round trip failed as a whole: so did each call in it
            answers = [e] * len(batch)
        with self._lock:  # so that a caller is abandoned (_abandon) before its answer, then skipped, or after
            for call, answer in zip(batch, answers, strict=True):
                if isinstance(answer, BaseException):
                    call.error = answer
                else:
                    call.result = answer
                call.answered = True
            woken = [call for call in batch[1:] if not call.abandoned]  # batch[0] is this leader
            for call, after in itertools.pairwise(woken):
                call.next = after
            # A crowd: more callers than round trips may go at once (counted as this one ends,
            # so a caller slow to come back mid-crowd does not end it).
            self._crowded = self._inside > self._parallel()
            heir = self._hand_on()
        if heir is not None:
            heir.signal()
        if woken:
            woken[0].signal()

    def _hand_on(self) -> _Call[Item, Result] | None:
        """Under the lock, as a round trip ends: the waiting caller to lead the next one, if any;
        none while other round trips are under way (they take the waiting calls as they end:
        round trips merge)."""
        if not self._waiting or self._leaders > 1:
            self._leaders -= 1
            return None
        following, self._waiting = self._waiting[: self._limit], self._waiting[self._limit :]
        self.round_trips += 1
        following[0].handed = following
        return following[0]

    def _abandon(self, call: _Call[Item, Result]) -> None:
        """A caller interrupted while waiting: do what it was to do for the others (wake the next
        answered caller, or lead a round trip) or, not yet reached, drop it."""
        with self._lock:
            call.abandoned = True
            if call in self._waiting:
                self._waiting.remove(call)
                return
            following, call.handed = call.handed, None
            if following is None:  # answered (its round trip links it) or to be (then skipped)
                woken = call.next
            elif len(following) > 1:  # hand its round trip to the next caller in it
                woken = following[1]
                woken.handed = following[1:]
            else:
                woken = self._hand_on()
        if woken is not None:
            woken.signal()


class ByOptions(Generic[Options, Item, Result]):
    """Smart batching for calls that carry options: a Coalescer for each option value, made at
    its first call, so that callers with the same options share round trips (one acquire_many per
    visibility, one push_many per ttl and delay) and a caller with other options never waits
    behind them. At most `most` option values are kept: past that, the oldest is forgotten (its
    callers under way finish with it; the next caller with those options makes a new one)."""

    def __init__(self, make: Callable[[Options], Coalescer[Item, Result]], most: int = 64) -> None:
        self._make = make
        self._most = most
        self._by: dict[Options, Coalescer[Item, Result]] = {}
        self._lock = threading.Lock()
        self._forgotten_trips = 0

    def __call__(self, options: Options, item: Item) -> Result:
        together = self._by.get(options)  # a dict read is atomic: no lock on the hot path
        if together is None:
            together = self._add(options)
        return together(item)

    def _add(self, options: Options) -> Coalescer[Item, Result]:
        with self._lock:
            together = self._by.get(options)
            if together is None:
                if len(self._by) >= self._most:
                    self._forgotten_trips += self._by.pop(next(iter(self._by))).round_trips
                together = self._by[options] = self._make(options)
            return together

    @property
    def round_trips(self) -> int:
        """For benchmarks and tests: the round trips of every option value."""
        with self._lock:
            return self._forgotten_trips + sum(c.round_trips for c in self._by.values())


def take_coalescer(
    take: Callable[[list[Item]], list[Taken]], limit: int, parallel: int | Callable[[], int] = PARALLEL
) -> Coalescer[Item, Taken | None]:
    """Smart batching for pop() and acquire(): one `take(items)` for the waiting calls' items
    (None, or what a design takes per message, such as a visibility), which takes at most one
    message an item, so no message is taken that no caller receives (at-most-once holds). The
    first callers get the messages, in order; a caller left without one gets None."""

    def run(calls: list[Item]) -> list[Taken | None]:
        got: list[Taken | None] = list(take(calls))
        if len(got) > len(calls):
            raise AssertionError(f"took {len(got)} messages for {len(calls)} calls")
        return got + [None] * (len(calls) - len(got))

    return Coalescer(run, limit, parallel)


def take_one(
    take: Callable[[], Taken | None],
    timeout: float,
    waker: Waker | None = None,
    fallback_s: float = 1.0,
    poll_first_s: float = 0.0,
) -> Taken | None:
    """pop() or acquire() through a take coalescer (`take` calls it): tried again
    (`waiting.take_until`) until a message comes or `timeout` seconds pass (then None)."""
    return take_until(take, Deadline(timeout), waker, fallback_s, poll_first_s)


def ack_coalescer(
    ack_many: Callable[[list[Taken]], None], limit: int, parallel: int = PARALLEL
) -> Coalescer[Taken, None]:
    """Smart batching for ack(): one ack_many for the messages of the waiting calls. A caller
    whose lease was lost gets a LeaseLost of its own; the others' acks stand."""

    def run(messages: list[Taken]) -> list[BaseException | None]:
        try:
            ack_many(messages)
        except LeaseLost as e:
            lost = {id(m) for m in e.messages}
            return [LeaseLost.of_acks([m], 1) if id(m) in lost else None for m in messages]
        return [None] * len(messages)

    return Coalescer(run, limit, parallel)
