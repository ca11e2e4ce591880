"""Bounded waiting: a few immediate retries, then sleeps that double up to a ceiling."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

SPINS = 3
FIRST_SLEEP_S = 0.001
MAX_SLEEP_S = 0.05


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
            time.sleep(min(FIRST_SLEEP_S * 2 ** (self.tries - SPINS - 1), MAX_SLEEP_S, left))
        return True

    def restart(self) -> None:
        """Progress was made: the next wait spins again (the deadline stays)."""
        self.tries = 0


class Waker(Protocol):
    """Something that says when waiting for more is worth it (`dbq.client.notify`)."""

    def mark(self) -> int: ...
    def wait(self, mark: int, seconds: float) -> None: ...


def wait_for_more(deadline: Deadline, waker: Waker | None, mark: int, fallback_s: float) -> bool:
    """After an empty take: wait for a wake-up (or `fallback_s`) when there is a waker, else
    spin then back off; False when the deadline has passed (nothing waited then)."""
    if waker is None:
        return deadline.wait()
    left = deadline.remaining
    if left <= 0:
        return False
    waker.wait(mark, min(left, fallback_s))
    return True


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


def count_arg(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    return value
