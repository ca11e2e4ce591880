"""Bounded waiting: a few immediate retries, then sleeps that double up to a ceiling."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
