"""Bounded waiting: a few immediate retries, then sleeps that double up to a ceiling."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from dbq.errors import MessageTooLarge

SPINS = 3
FIRST_SLEEP_S = 0.001
MAX_SLEEP_S = 0.05
MAX_DOUBLINGS = 16  # FIRST_SLEEP_S * 2 ** 16 is past MAX_SLEEP_S


@dataclass
class Deadline:
    """Spin-then-backoff until `timeout` seconds from now; `wait()` says whether to try again."""

    timeout: float
    started: float = field(default_factory=time.monotonic)
    tries: int = 0

    @property
    def remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def wait(self) -> bool:
        """Sleep before the next try; False when the time is up (nothing slept then)."""
        left = self.remaining
        if left <= 0:
            return False
        self.tries += 1
        if self.tries > SPINS:
            # The doubling stops at the ceiling: a wait of minutes makes thousands of tries, and
            # 2 ** tries would outgrow a float.
            doublings = min(self.tries - SPINS - 1, MAX_DOUBLINGS)
            time.sleep(min(FIRST_SLEEP_S * 2**doublings, MAX_SLEEP_S, left))
        return True

    def restart(self) -> None:
        """Progress was made: the next wait spins again (the deadline stays)."""
        self.tries = 0


class Waker(Protocol):
    """Wakes a waiting consumer when messages arrive (`dbq.client.notify`): `mark()` says the
    caller is about to wait (and returns a count of wake-ups so far), `wait(mark, s)` returns
    once the count moved past `mark`, or after `s` seconds."""

    def mark(self) -> int: ...
    def wait(self, mark: int, seconds: float) -> None: ...


T = TypeVar("T")


def take_until(
    take: Callable[[], T],
    deadline: Deadline,
    waker: Waker | None,
    fallback_s: float,
    poll_first_s: float = 0.0,
) -> T:
    """Take until something comes or the deadline passes: spinning, then backing off, for the
    first `poll_first_s` (a busy queue refills within it, and then nobody announces a wait);
    after that, with a waker, the caller marks (announcing that it waits), tries again, and
    waits for a wake-up or `fallback_s`."""
    got = take()
    while not got:
        if waker is None or time.monotonic() - deadline.started < poll_first_s:
            if not deadline.wait():
                return got
            got = take()
            continue
        if deadline.remaining <= 0:
            return got
        mark = waker.mark()
        got = take()
        if not got:
            waker.wait(mark, min(deadline.remaining, fallback_s))
            if deadline.remaining <= 0:
                return take()  # a last look: a delayed message may have come due while waiting
    return got


def seconds_arg(value: float | None, name: str, default: float, *, positive: bool = False) -> float:
    """A duration argument in seconds, `default` when None. Anything else than a number >= 0
    (> 0 with `positive`) is refused, naming the argument, before anything is done."""
    if value is None:
        return default
    bad = isinstance(value, bool) or not isinstance(value, int | float) or value != value  # NaN
    if bad or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a number of seconds {bound}, not {value!r}")
    return float(value)


def check_bodies(
    bodies: Iterable[object], max_bytes: int | None = None, queue: str = "", most: str = ""
) -> None:
    """Refuse, before anything is written, a body that is not bytes, or one larger than the
    queue's spec.messages.maxBytes (`max_bytes`; None: no limit checked here). `most`: how far
    the limit may be raised, in words ("67108864 on a ring")."""
    for body in bodies:
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(f"a message body is bytes, not {type(body).__name__}: encode it first")
        if max_bytes is not None and len(body) > max_bytes:
            raise MessageTooLarge(
                f"message of {len(body)} bytes is larger than spec.messages.maxBytes ({max_bytes}) of queue"
                f" {queue}: raise spec.messages.maxBytes (at most {most}), or store the payload elsewhere"
                " and push a reference to it"
            )


def count_arg(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    return value
