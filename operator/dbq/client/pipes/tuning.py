"""The clocks and sizes the pipes client works by, in one place (tests shorten some of them)."""

from __future__ import annotations

import time
import uuid

# A popper owns a pipe this long unless it renews; it renews when a third of the lease has passed
# and stops using the lease at half of it (`lease_use`): a take it sent must land before another
# popper can claim the pipe, and the other half is the margin for a process stalled between its
# check and its write (under load, more than clock skew).
PIPE_LEASE_S = 6.0
SKEW_S = 1.0  # clocks of clients and nodes agree within this
# A pipe past maxPushTime + this is finished, whatever its pusher says: longer than a request
# can take, so a write sent before maxPushTime has landed by then.
FINISH_GRACE_S = 15.0
# A rollback (or nack) that took a lease over and then failed to push the message again is
# retried only after this long: its logged batch may still be applied by Cassandra's batchlog
# replay, and pushing again before that would leave two copies.
RETAKE_AFTER_S = 60.0
BATCH_MAX_MESSAGES = 500
BATCH_MAX_BYTES = 4 << 20
LOGGED_MAX_MESSAGES = 50  # a requeue's logged batch (rows plus the pending rows they replace)
LOGGED_MAX_BYTES = 24 << 10
MOVE_SCAN_S = 0.05
SPARE_SCAN_MAX_S = 1.0  # the longest a smart-batched client's spare lease waits to look again
# A popper rolls back the overdue messages of the pipe it leases (nacked with a delay, or whose
# visibility timeout passed) at most this often: while it holds the lease, no repair can.
OWN_ROLLBACK_S = 1.0  # also how often a pipe of deferred messages leased by another is tried
STATE_READ_WINDOW = 16  # pipe states read concurrently when looking for work
DUE_BATCHES = 40  # delayed messages moved per repair: at most this many logged batches of them
LEASE_EXPIRED = "lease expired (visibility timeout)"  # a dead letter's error when repair moved it
# How long a push may take between storing a large body's chunks and its row, and a take or an
# ack between ending a large message and deleting its chunks: past this, repair deletes them.
# A push that took more than half of it gives up (raises) rather than write its rows.
ENDING_S = 60.0
# Chunks written, or bodies read, at once: the driver refuses requests while a connection's socket
# is full, so a client does not queue megabytes on it.
CONTENT_WINDOW = 8
READ_AHEAD = 16  # rows a take reads at least, so most single pops are one round trip (the batch)


def now_ms() -> int:
    return int(time.time() * 1000)


def retake_at() -> int:
    """When a take-over made now may be retried (RETAKE_AFTER_S from now, in ms)."""
    return now_ms() + int(RETAKE_AFTER_S * 1000)


def uuid_ms(value: uuid.UUID) -> int:
    """Milliseconds since the epoch of a version-1 (time) UUID."""
    return (value.time - 0x01B21DD213814000) // 10_000


def lease_use(start: float) -> tuple[float, float]:
    """For a lease taken or renewed at `start` (monotonic): when to renew it, and when to stop
    using it."""
    return start + PIPE_LEASE_S / 3, start + PIPE_LEASE_S / 2


def before_lwt() -> int:
    """The write time (microseconds) of a row that a lightweight transaction may end moments
    later. Cassandra times a lightweight transaction's writes by its ballot, in whole
    milliseconds, while a client times its writes to the microsecond: a row written 0.6 ms into
    a millisecond and deleted by a transaction in that millisecond would outlive its deletion
    (an ack applied, and the message delivered again). Timed a millisecond back, it never does."""
    return (now_ms() - 1) * 1000
