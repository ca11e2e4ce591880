"""Rolling push and pop rates from successive totals (any design: the totals are monotonic).

meter = RateMeter(window=60)
meter.add(time.time(), stats.pushed, stats.popped + stats.acquired)
meter.rates()  # (pushes/s, takes/s) over the last `window` seconds of samples
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RateMeter:
    window: float = 60.0
    samples: deque[tuple[float, int, int]] = field(default_factory=deque)

    def add(self, at: float, pushed: int, taken: int) -> None:
        if self.samples and at <= self.samples[-1][0]:
            return  # clocks that step back do not make rates negative
        self.samples.append((at, pushed, taken))
        # Keep one sample at or before the window's start, so the window is fully covered.
        while len(self.samples) > 2 and self.samples[1][0] <= at - self.window:
            self.samples.popleft()

    def rates(self) -> tuple[float, float] | None:
        """(pushes/s, takes/s) between the oldest kept and the newest sample; None before two."""
        if len(self.samples) < 2:
            return None
        (t0, p0, k0), (t1, p1, k1) = self.samples[0], self.samples[-1]
        span = t1 - t0
        return (max(p1 - p0, 0) / span, max(k1 - k0, 0) / span)
