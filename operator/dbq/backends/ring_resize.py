"""Online resize of a ring: pure planning over the ring's generations.

A ring holds one generation per size it had while messages of that size remain: the table of
generations (`QueueNames.generations`) records, for each, the first position it holds, its first
slot and its size; its slots are rows slot_base .. slot_base + size - 1 of the ring table.
Positions keep counting across a resize. A resize to N slots:

1. **prepare**: the new generation's slots are written (state free) where no generation alive
   has slots, in chunks of their own transactions, before anything changes for clients;
2. **switch**: one short transaction takes the fence every push holds while it draws a position
   (so none is drawn meanwhile), reads the boundary B (the next position to draw), records the
   generation from B, and the new size in the metadata. Pushes from B land in the new slots;
   pops find a position's slot from its generation, so they drain the older ones first;
3. **retire**: once every position below B is drawn by a pop, what is still in the older slots
   (leased messages, and ready ones whose popper gave up) moves to the spill table, where acks,
   nacks, extensions and redeliveries already look, and the generation and its slots go. No
   lock but row locks: a long snapshot delays neither traffic nor the retirement.

Any number of generations may be alive: a resize during a drain starts the next one, and they
retire oldest first. No database here: `dbq.backends.odbc_ring` runs the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Generation:
    """One ring alive: positions from `first_pos` (up to the next generation's) in slots
    `slot_base` .. `slot_base + size - 1`."""

    first_pos: int
    slot_base: int
    size: int

    @property
    def slot_end(self) -> int:
        """One past its last slot."""
        return self.slot_base + self.size

    def overlaps(self, base: int, size: int) -> bool:
        return base < self.slot_end and self.slot_base < base + size


@dataclass(frozen=True)
class ResizeState:
    """What a resize needs to know of a ring: its generations (oldest first) and the last position
    a pop drew."""

    generations: tuple[Generation, ...]
    last_popped: int

    @property
    def newest(self) -> Generation:
        return self.generations[-1]

    @property
    def draining(self) -> tuple[Generation, ...]:
        """The older generations, still to retire."""
        return self.generations[:-1]

    def positions_left(self) -> int:
        """Positions below the newest generation's that no pop has drawn yet: the messages the
        older generations still hold for ring order (leases and redeliveries aside)."""
        if not self.draining:
            return 0
        return max(0, self.newest.first_pos - 1 - self.last_popped)

    def retirable(self) -> Generation | None:
        """The oldest generation, once every position it holds is drawn; None while it drains
        (or when only one is alive)."""
        if not self.draining:
            return None
        oldest, following = self.generations[0], self.generations[1]
        return oldest if self.last_popped >= following.first_pos - 1 else None


def place_generation(alive: Sequence[Generation], size: int) -> int:
    """The first slot of a new generation of `size` slots: the lowest where it overlaps no
    generation alive (so the slots of retired generations are used again). The generations'
    slots never overlap, so one pass in slot order finds it."""
    if size < 1:
        raise ValueError(f"a ring has at least one slot, not {size}")
    base = 0
    for g in sorted(alive, key=lambda g: g.slot_base):
        if g.overlaps(base, size):
            base = g.slot_end
    return base


def chunks(start: int, end: int, step: int) -> list[tuple[int, int]]:
    """[start, end) cut into half-open ranges of at most `step`."""
    return [(lo, min(lo + step, end)) for lo in range(start, end, step)]
