"""spec.ring.autoGrow: how large the ring is to be, and whether to grow it now. Pure: the upkeep
runs the growth, reconcile and the fleet read `ring_size`.

The size the operator keeps is spec.ring.size, or what autoGrow grew the ring to
(status.ring.grownTo) when that is larger; removing autoGrow brings the ring back to
spec.ring.size. The ring grows when the messages waiting stay above whenFullAbove percent of
its slots for FULL_SAMPLES statistics samples in a row: by `factor`, up to maxSize. At maxSize it
cannot grow: a Warning Event, and the metric the chart's alert reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dbq.api.models import QueueSpec

# Samples in a row above the threshold before the ring grows (a burst one sample long does not).
FULL_SAMPLES = 2


def grown_to(status: Mapping[str, Any] | None) -> int:
    return int(((status or {}).get("ring") or {}).get("grownTo") or 0)


def ring_size(spec: QueueSpec, status: Mapping[str, Any] | None) -> int:
    """The ring's size the operator keeps for this spec and status (a maxSize lowered since the
    growth caps it)."""
    if spec.ring.auto_grow is None:
        return spec.ring.size
    return max(spec.ring.size, min(grown_to(status), spec.ring.auto_grow.max_size))


def with_ring_size(spec: QueueSpec, status: Mapping[str, Any] | None) -> QueueSpec:
    """The spec as the backend is to make it: spec.ring.size as `ring_size` says."""
    size = ring_size(spec, status)
    if size == spec.ring.size:
        return spec
    return spec.model_copy(update={"ring": spec.ring.model_copy(update={"size": size})})


@dataclass(frozen=True)
class Growth:
    """What a statistics sample says: grow to `to` slots, or `blocked` (full and at maxSize), and
    how many samples in a row were above the threshold (kept by the caller)."""

    full_samples: int
    to: int | None = None
    blocked: bool = False


def decide(spec: QueueSpec, size: int, depth: int, full_samples: int) -> Growth:
    """Whether a ring of `size` slots holding `depth` waiting messages grows now."""
    grow = spec.ring.auto_grow
    if grow is None or spec.design != "ring":
        return Growth(0)
    above = depth * 100 > grow.when_full_above * size
    samples = full_samples + 1 if above else 0
    if samples < FULL_SAMPLES:
        return Growth(samples)
    if size >= grow.max_size:
        return Growth(samples, blocked=True)
    return Growth(0, to=min(grow.max_size, max(size + 1, math.ceil(size * grow.factor))))
