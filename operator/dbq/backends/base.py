"""What every backend offers the controller: observe -> plan (pure) -> apply, then measure,
clean up, maintain and tear down.

Errors are `dbq.errors.DbqError`s, translated from the driver's at each backend's edge; their
`reason` becomes the condition's reason, and their message never contains credentials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dbq.client import QueueStats


class Step(Protocol):
    """One idempotent provisioning action of a plan. Each design has its own step type, whose
    `action` its dialect renders through a mapping. `why` says what the plan found (dry runs, drift
    Events); `done` what applying it did (Provisioned and Repaired Events, `dbq apply`)."""

    @property
    def why(self) -> str: ...

    @property
    def done(self) -> str: ...


@dataclass(frozen=True)
class Finding:
    """One failed health check of a provisioned queue: its reason (a condition reason) and what
    a DBA does about it. (Service Broker queues have checks; the other designs report none.)"""

    check: str
    message: str


@dataclass(frozen=True)
class Resized:
    """A switch to another ring size (an online resize): from and to how many slots, how long
    preparing the new slots took, how long the switch's transaction (the pause of pushes) took,
    and the positions the older generations still hold for ring order then."""

    from_size: int
    to_size: int
    prepared_s: float
    switch_s: float
    positions_left: int = 0


@dataclass
class ApplyResult:
    steps: Sequence[Step] = field(default_factory=list)
    schema_version: int = 0
    findings: Sequence[Finding] = field(default_factory=list)  # health checks after applying
    # Nothing of the queue existed before: it was created empty, so it has nothing to clean up
    # and no statistics sample of its own yet (designs that cannot tell leave it False).
    created: bool = False
    # PostgreSQL: sessions of dbq's client logged in with the operator's own login (applications
    # that should hold a QueueUser's); None where not counted.
    operator_login_sessions: int | None = None
    # A ring switched to spec.ring.size by this apply (PostgreSQL rings).
    resized: Resized | None = None

    @property
    def changed(self) -> bool:
        return bool(self.steps)


@dataclass(frozen=True)
class Depth:
    """What a deletion waits for: ready and leased messages."""

    depth: int
    in_flight: int
    conversations: int = 0  # Service Broker: conversation endpoints not closed


@dataclass(frozen=True)
class Earlier:
    """A sample from the history table: how old it is and its totals (for rolling rates)."""

    age_s: float
    pushed: int
    taken: int


class QueueBackend(Protocol):
    """`observe` returns the design's own observation type, which only its `plan` reads."""

    def observe(self) -> Any: ...
    def plan(self, observed: Any) -> Sequence[Step]: ...
    def apply(self) -> ApplyResult: ...
    def ping(self) -> None: ...
    def depth(self) -> Depth: ...
    def measure(self) -> QueueStats: ...
    def checks(self) -> list[Finding]: ...
    def cleanup(self, stalled_after_s: float) -> dict[str, int]: ...
    def resize(self, size: int | None = None) -> Resized | None: ...
    # `purge`: remove the samples older than the retention now (a TTL may do it instead).
    def record_sample(self, stats: QueueStats, retention_s: float, purge: bool = True) -> None: ...
    def sample_since(self, window_s: float) -> Earlier | None: ...
    def maintain(self, dead_percent: float, fragmentation_percent: float, online: bool) -> Any: ...
    # True unless the backend saw that nothing of the queue was left to drop (dropped before).
    def teardown(self) -> bool: ...
    def endpoint(self) -> str: ...
    def close(self) -> None: ...
