"""What every backend offers the controller, and the errors it reports.

observe -> plan (pure) -> apply, plus stats, teardown. Errors carry a `reason` that becomes
the `Ready` condition's reason, and a message that never contains credentials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendError(Exception):
    """A failure the controller reports as a condition; `retry` says whether waiting may heal it."""

    reason = "BackendError"
    retry = True


class DatabaseUnreachable(BackendError):
    reason = "DatabaseUnreachable"


class AuthenticationFailed(BackendError):
    reason = "AuthenticationFailed"


class InvalidSpec(BackendError):
    reason = "InvalidSpec"
    retry = False


class ConflictingObjects(BackendError):
    """The database holds objects by our names that do not match the spec (e.g. another ring size)."""

    reason = "ConflictingObjects"
    retry = False


@dataclass(frozen=True)
class Step:
    """One idempotent provisioning action; `why` is shown in events and `dbq apply` output."""

    action: str
    why: str


@dataclass(frozen=True)
class Recorded:
    """What the queue's metadata row in the database says about it."""

    schema_version: int
    ring_size: int
    message_bytes: int


@dataclass(frozen=True)
class Observed:
    """What exists in the database for one queue."""

    schema_exists: bool = False
    meta_exists: bool = False
    tables: frozenset[str] = frozenset()
    sequences: frozenset[str] = frozenset()
    routines: frozenset[str] = frozenset()
    ring_rows: int = 0
    recorded: Recorded | None = None


@dataclass
class ApplyResult:
    steps: list[Step] = field(default_factory=list)
    schema_version: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.steps)


@dataclass(frozen=True)
class Depth:
    depth: int
    in_flight: int


@dataclass(frozen=True)
class Sample:
    """One measurement of a queue: the same figures for every design."""

    depth: int
    in_flight: int
    pushed: int
    popped: int
    acquired: int
    expired: int
    oldest_age_s: float

    @property
    def taken(self) -> int:
        return self.popped + self.acquired

    @classmethod
    def of(cls, stats: Any) -> Sample:
        """From a client's QueueStats (ring or pipes)."""
        s = stats
        return cls(s.depth, s.in_flight, s.pushed, s.popped, s.acquired, s.expired, s.oldest_age_seconds)


@dataclass(frozen=True)
class Earlier:
    """A sample from the history table: how old it is and its totals (for rolling rates)."""

    age_s: float
    pushed: int
    taken: int


class QueueBackend(Protocol):
    """`observe` returns the engine's own observation type, which only its `plan` reads."""

    def observe(self) -> Any: ...
    def plan(self, observed: Any) -> list[Step]: ...
    def apply(self) -> ApplyResult: ...
    def depth(self) -> Depth: ...
    def measure(self) -> Sample: ...
    def cleanup(self, stalled_after_s: float) -> dict[str, int]: ...
    def record_sample(self, sample: Sample, retention_s: float) -> None: ...
    def sample_since(self, window_s: float) -> Earlier | None: ...
    def maintain(self, dead_percent: float, fragmentation_percent: float, online: bool) -> Any: ...
    def teardown(self) -> None: ...
    def endpoint(self) -> str: ...
    def close(self) -> None: ...
