"""Smart batching: single calls made at once by many threads share round trips.

A caller goes at once while fewer than `in_flight` round trips are under way (one by default,
as in the LMAX Disruptor): no timer, no added latency. Past that, the calls that arrive wait together; when a round trip ends, the
first of them leads the next one for them all (up to `limit`), and the previous leader returns.
Each caller gets its own result or its own error. A thread's calls keep their order, since each
returns before the next is made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from dbq.errors import QueueFull

Item = TypeVar("Item")
Result = TypeVar("Result")
Id = TypeVar("Id")


class _Call(Generic[Item, Result]):
    __slots__ = ("answered", "error", "handed", "item", "result", "wake")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.answered = False
        self.handed: list[_Call[Item, Result]] | None = None  # a round trip this caller is to lead
        self.wake = threading.Event()


class Coalescer(Generic[Item, Result]):
    """`run(items)` makes one round trip for several calls and answers, for each item in order,
    its result or the exception that call must raise."""

    def __init__(
        self,
        run: Callable[[list[Item]], Sequence[Result | BaseException]],
        limit: int,
        in_flight: int = 1,
    ) -> None:
        if limit < 1 or in_flight < 1:
            raise ValueError(f"limit and in_flight must be at least 1, not {limit} and {in_flight}")
        self._run = run
        self._limit = limit
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self._waiting: list[_Call[Item, Result]] = []
        self._leaders = 0
        self.round_trips = 0  # for benchmarks and tests: how many calls of `run`

    def __call__(self, item: Item) -> Result:
        call: _Call[Item, Result] = _Call(item)
        batch = None
        with self._lock:
            self._waiting.append(call)
            if self._leaders < self._in_flight:
                self._leaders += 1
                batch = self._next_batch()
        while True:
            if batch is not None:
                self._lead(batch)
            if call.answered:
                break
            call.wake.wait()
            call.wake.clear()
            batch, call.handed = call.handed, None
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _next_batch(self) -> list[_Call[Item, Result]]:
        batch, self._waiting = self._waiting[: self._limit], self._waiting[self._limit :]
        self.round_trips += 1
        return batch

    def _lead(self, batch: list[_Call[Item, Result]]) -> None:
        try:
            answers: Sequence[Result | BaseException] = self._run([c.item for c in batch])
            if len(answers) != len(batch):
                raise AssertionError(f"{len(answers)} answers for {len(batch)} calls")
        except BaseException as e:  # the round trip failed as a whole: so did each call in it
            answers = [e] * len(batch)
        for call, answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                call.error = answer
            else:
                call.result = answer
            call.answered = True
            call.wake.set()
        with self._lock:
            if not self._waiting:
                self._leaders -= 1
                return
            following = self._next_batch()
        heir = following[0]  # leads the next round trip; this caller has its answer
        heir.handed = following
        heir.wake.set()


def push_coalescer(push_many: Callable[[list[bytes]], list[Id]], limit: int) -> Coalescer[bytes, Id]:
    """Smart batching for push(): one push_many for the bodies of the waiting calls. Each caller
    gets its id, or, for a body the full queue did not take, a QueueFull of its own."""

    def run(bodies: list[bytes]) -> list[Id | BaseException]:
        try:
            return list(push_many(bodies))
        except QueueFull as e:
            ids = e.ids + [None] * (len(bodies) - len(e.ids))
            return [QueueFull(str(e), [None]) if i is None else i for i in ids]

    return Coalescer(run, limit)
