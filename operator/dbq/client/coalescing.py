"""Smart batching: single calls made at once by many threads share round trips.

A caller alone goes at once: no timer, no added latency. While its round trip is in flight,
the calls that arrive wait together; when it ends, the first of them leads the next round trip
for all of them (up to `limit`), and the previous leader returns. Each caller gets its own
result or its own error. A thread's calls keep their order, since each returns before the next
is made.
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
    __slots__ = ("done", "error", "item", "lead", "result")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.lead = False  # woken to lead the next round trip, not with a result


class Coalescer(Generic[Item, Result]):
    """`run(items)` makes one round trip for several calls and answers, for each item in order,
    its result or the exception that call must raise."""

    def __init__(self, run: Callable[[list[Item]], Sequence[Result | BaseException]], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._run = run
        self._limit = limit
        self._lock = threading.Lock()
        self._waiting: list[_Call[Item, Result]] = []
        self._busy = False
        self.round_trips = 0  # for benchmarks and tests: how many calls of `run`

    def __call__(self, item: Item) -> Result:
        call: _Call[Item, Result] = _Call(item)
        with self._lock:
            self._waiting.append(call)
            leading = not self._busy
            self._busy = True
        if not leading:
            call.done.wait()
            leading = call.lead
        if leading:
            self._lead()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _lead(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting[: self._limit], self._waiting[self._limit :]
            self.round_trips += 1
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
            call.done.set()
        with self._lock:
            if not self._waiting:
                self._busy = False
                return
            heir = self._waiting[0]
        heir.lead = True  # the next round trip is theirs; this caller has its answer
        heir.done.set()


def pushed_each(
    push_many: Callable[[list[bytes]], list[Id]], bodies: list[bytes]
) -> list[Id | BaseException]:
    """What each body's caller gets from one push_many: its id, or, for a body the full queue
    did not take, a QueueFull of its own."""
    try:
        return list(push_many(bodies))
    except QueueFull as e:
        ids = e.ids + [None] * (len(bodies) - len(e.ids))
        return [QueueFull(str(e), [None]) if i is None else i for i in ids]
