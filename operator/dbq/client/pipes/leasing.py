"""Pipe leases: a popping thread leases one pipe at a time with a lightweight transaction
(PIPE_LEASE_S, renewed while used), preferring the oldest pipe with messages, which gives the
seed's "mostly FIFO". With smart batching, a client's takes go through a few shared leases
(SLOTS), one take at a time on each: the first lease always, and a spare one beside it while
another pipe has messages (a client taking from one thread only uses the first: strict FIFO)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.model import Lease, PipeState
from dbq.client.pipes.session import PipesSession
from dbq.errors import QueueError

SLOTS = 4  # leases a client's smart-batched takes share: takes at once, as many as a ring's pool


@dataclass
class _Slot:
    """One of the client's shared leases (smart batching), held by one take at a time."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    lease: Lease | None = None


class PipeLeases:
    def __init__(self, db: PipesSession, identity: str, max_push_time_ms: int, together: bool) -> None:
        self.db = db
        self.identity = identity
        self.max_push_time_ms = max_push_time_ms
        self._local = threading.local()
        self._lock = threading.Lock()
        self._leases: list[Lease] = []
        # With smart batching (`together`), this client's takes go through its shared leases,
        # one take at a time on each: the leader of a coalesced take changes, a pipe has one
        # lessee, and one thread's single and batch takes go through the first lease (one
        # popper: strict FIFO).
        self.together = together
        self._slots = [_Slot() for _ in range(SLOTS)]
        self._spare_after = 0.0  # a spare slot looks for a pipe no sooner (monotonic), after a miss
        self._spare_wait = tuning.MOVE_SCAN_S  # how long after the next miss: doubled by each miss in a row

    @contextlib.contextmanager
    def client_lease(self, spare: bool = True) -> Iterator[bool]:
        """With smart batching, this thread holds one of the client's shared leases meanwhile:
        the first if it is free (or if not `spare`), else a spare one that holds a pipe or can
        lease one now (only while the first holds one: the first is the client's lease, the
        spares take from other pipes beside it); failing those, the first, once free. The first
        without a pipe adopts a spare's. Whether it holds a spare one. Without smart batching,
        the thread's own lease stays (False)."""
        if not self.together:
            yield False
            return
        first = self._slots[0]
        slot = self._free_slot() if spare else None
        if slot is None:
            first.lock.acquire()
            slot = first
        if slot is first and first.lease is None:
            first.lease = self._adopt()
        self._local.lease = slot.lease
        try:
            yield slot is not first
        finally:
            slot.lease, self._local.lease = self.current(), None
            if slot.lease is None and slot is not first:  # its pipe ran dry
                self._spare_after = time.monotonic() + tuning.MOVE_SCAN_S
            slot.lock.release()

    def takes_at_once(self) -> int:
        """How many takes may go at once (smart batching): one on the first lease, and one on
        each spare lease that holds a pipe, or on one more while a spare one may look for a pipe."""
        first, *spares = self._slots
        held = sum(1 for slot in spares if slot.lease is not None)
        looking = first.lease is not None and held < len(spares) and time.monotonic() >= self._spare_after
        return 1 + held + looking

    def _free_slot(self) -> _Slot | None:
        """A free slot: the first, else a spare one with a pipe (leasing one for it while the
        first holds one; after a miss, not for MOVE_SCAN_S, twice as long after each further miss
        in a row, up to SPARE_SCAN_MAX_S: a queue with one pipe with messages seldom pays a
        fruitless scan); None when there is none. The slot's lock is held."""
        first, *spares = self._slots
        if first.lock.acquire(blocking=False):
            return first
        for slot in spares:
            if not slot.lock.acquire(blocking=False):
                continue
            try:
                if slot.lease is None and first.lease is not None and time.monotonic() >= self._spare_after:
                    slot.lease = self.claim()
                    if slot.lease is not None:
                        self._spare_wait = tuning.MOVE_SCAN_S
                        with self._lock:
                            self._leases.append(slot.lease)
                    else:
                        self._spare_after = time.monotonic() + self._spare_wait
                        self._spare_wait = min(2 * self._spare_wait, tuning.SPARE_SCAN_MAX_S)
            except BaseException:  # the cluster did not answer: the slot stays free for the next take
                slot.lock.release()
                raise
            if slot.lease is not None:
                return slot
            slot.lock.release()
        return None

    def _adopt(self) -> Lease | None:
        """A free spare slot's lease, handed over to the first slot (which has none)."""
        for slot in self._slots[1:]:
            if slot.lease is not None and slot.lock.acquire(blocking=False):
                lease, slot.lease = slot.lease, None
                slot.lock.release()
                if lease is not None:
                    return lease
        return None

    @contextlib.contextmanager
    def lease_of(self, pipe: uuid.UUID) -> Iterator[None]:
        """With smart batching, this thread holds the client's shared lease on `pipe` meanwhile,
        if one holds it (a repair rolling back overdue messages of a pipe this client leases);
        without, its own lease stays."""
        for slot in self._slots if self.together else []:
            if slot.lease is not None and slot.lease.state.pipe == pipe:
                with slot.lock:
                    if slot.lease is None or slot.lease.state.pipe != pipe:
                        break  # moved on meanwhile: nothing of this client's holds the pipe
                    self._local.lease = slot.lease
                    try:
                        yield
                    finally:
                        slot.lease, self._local.lease = self.current(), None
                    return
        yield

    def current(self) -> Lease | None:
        """The lease this thread uses, if any."""
        return getattr(self._local, "lease", None)

    def set_current(self, lease: Lease | None) -> None:
        old = self.current()
        if old is not None:
            self._forget(old)
        if lease is not None:
            with self._lock:
                self._leases.append(lease)
        self._local.lease = lease

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            if lease in self._leases:
                self._leases.remove(lease)

    def working(self) -> Lease | None:
        """The thread's lease, renewed when due; else a new one on the oldest pipe with messages."""
        lease = self.current()
        if lease is None:
            lease = self.claim()
            self.set_current(lease)
            return lease
        if time.monotonic() >= lease.renew_at and not self.renew(lease):
            return self.working()
        return lease

    def renew(self, lease: Lease) -> bool:
        """Extend the thread's lease from now; False, and the lease dropped, when the pipe has
        another lessee (ours expired meanwhile and was claimed)."""
        started = time.monotonic()
        until = tuning.now_ms() + int(tuning.PIPE_LEASE_S * 1000)
        if self.db.cas(self.db.cql.renew, until, lease.state.pipe, lease.owner):
            lease.renew_at, lease.until = tuning.lease_use(started)
            return True
        self.set_current(None)
        return False

    def move_from(self, lease: Lease) -> bool:
        """Our pipe is empty but still pushed to: lease one that has messages, if any (looked
        for at most every MOVE_SCAN_S, so an idle popper does not flood the cluster)."""
        now = time.monotonic()
        if now < lease.scan_after:
            return False
        lease.scan_after = now + tuning.MOVE_SCAN_S
        moved = self.claim(exclude=lease.state.pipe)
        if moved is None:
            return False
        self.release(lease)
        self.set_current(moved)
        return True

    def live_pipes(self, meta: list[Any] | None = None) -> list[tuple[uuid.UUID, str]]:
        """The pipes above the watermark, oldest first; `meta` is the queue row if already read."""
        meta = meta or self.db.meta()
        watermark = meta[4] if meta else None
        if watermark is None:
            return [(r[0], r[1]) for r in self.db.rows(self.db.cql.list_all_pipes)]
        return [(r[0], r[1]) for r in self.db.rows(self.db.cql.list_pipes, watermark)]

    def states(self, pipes: Sequence[uuid.UUID]) -> list[PipeState | None]:
        rows = self.db.many(self.db.cql.pipe_state, [(p,) for p in pipes])
        return [PipeState.of_row(p, r[0]) if r else None for p, r in zip(pipes, rows, strict=True)]

    def claim(self, exclude: uuid.UUID | None = None) -> Lease | None:
        """Lease the oldest unleased pipe that has messages; marks exhausted pipes drained."""
        candidates = [p for p, status in self.live_pipes() if status != "drained" and p != exclude]
        for start in range(0, len(candidates), tuning.STATE_READ_WINDOW):
            window = candidates[start : start + tuning.STATE_READ_WINDOW]
            at = tuning.now_ms()
            for state in self.states(window):
                if state is None or (state.lease_until or 0) > at:
                    continue
                if state.remaining <= 0:
                    if state.done_pushing(self.max_push_time_ms, at):
                        self.db.rows(self.db.cql.set_status, "drained", at, state.pipe)
                    continue
                owner = f"{self.identity}/{uuid.uuid4().hex[:12]}"
                started = time.monotonic()
                until = tuning.now_ms() + int(tuning.PIPE_LEASE_S * 1000)
                if self.db.cas(self.db.cql.claim, owner, until, state.pipe, state.lease_until):
                    # Read the state again now that it is ours: between the first read and the
                    # claim, another popper may have leased it, taken messages and released it.
                    fresh = self.states([state.pipe])[0] or state
                    renew_at, use_until = tuning.lease_use(started)
                    return Lease(owner, fresh, use_until, renew_at)
        return None

    def borrow(self, state: PipeState) -> str | None:
        """Lease a pipe for a moment (a rollback of another's pipe): the owner to give it back
        with, or None while someone else leases it."""
        if (state.lease_until or 0) > tuning.now_ms():
            return None
        owner = f"{self.identity}/repair/{uuid.uuid4().hex[:8]}"
        until = tuning.now_ms() + int(tuning.PIPE_LEASE_S * 1000)
        return owner if self.db.cas(self.db.cql.claim, owner, until, state.pipe, state.lease_until) else None

    def give_back(self, pipe: uuid.UUID, owner: str) -> None:
        self.db.cas(self.db.cql.release, pipe, owner)

    def release(self, lease: Lease) -> None:
        with contextlib.suppress(QueueError):  # else it expires on its own
            self.db.cas(self.db.cql.release, lease.state.pipe, lease.owner)
        if self.current() is lease:
            self._local.lease = None
        self._forget(lease)

    def release_all(self) -> None:
        with self._lock:
            leases = list(self._leases)
        for lease in leases:
            self.release(lease)
