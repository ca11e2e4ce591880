"""Moving a real PGMQ queue's messages into a dbq queue, through PGMQ's API on both sides
(`dbq pgmq drain`; docs/developers/pgmq.md, "Moving from a running PGMQ").

Each batch is read from PGMQ with a lease (vt), sent to dbq in one call, then deleted from PGMQ.
A message is never lost: until its delete it stays in PGMQ, where it comes back when the lease
runs out. Should the drain stop between the send and the delete (killed, a connection lost),
that batch is sent again by the next run: each moved message carries its PGMQ id in the header
`pgmq-msg-id`, so a consumer that must not see one twice can tell.

A message the dbq queue refuses for its size (a body past spec.messages.maxBytes, or headers past
spec.messages.headerBytes once the two headers are added) stays in PGMQ, untouched but for its
lease: the rest of its batch is sent one by one, and the drain goes on and names it at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

READ = "SELECT msg_id, enqueued_at, message, headers FROM pgmq.read(%s, %s, %s)"
SEND = "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])"
DELETE = "SELECT * FROM pgmq.delete(%s, %s::bigint[])"
LEFT = "SELECT queue_length FROM pgmq.metrics(%s)"


@dataclass(frozen=True)
class Drained:
    moved: int  # messages sent to dbq and deleted from PGMQ
    left: int  # messages still in PGMQ (in flight, delayed, or refused) when the drain stopped
    refused: dict[int, str] = field(default_factory=dict)  # PGMQ id: why dbq's queue refused it


def moved_headers(msg_id: int, enqueued_at: Any, headers: Any) -> dict[str, Any]:
    """A PGMQ message's headers as dbq keeps them: PGMQ's own (an object, or under `pgmq-headers`
    when they are not one), its id and when it was first sent."""
    kept = headers if isinstance(headers, dict) else ({} if headers is None else {"pgmq-headers": headers})
    return {**kept, "pgmq-msg-id": str(msg_id), "pgmq-enqueued-at": enqueued_at.isoformat()}


def drain(
    source_url: str,
    queue: str,
    target_url: str,
    target_queue: str,
    batch: int = 100,
    visibility_s: int = 30,
    wait_s: float = 60.0,
    progress: Callable[[int], None] = lambda moved: None,
) -> Drained:
    """Move every message of PGMQ queue `queue` (at `source_url`) to dbq's queue of PGMQ name
    `target_queue` (at `target_url`). Messages in flight in PGMQ (read by its consumers and not yet
    deleted) either end there or come back: the drain waits up to `wait_s` seconds from the last
    message it moved for them, then stops, telling how many are left."""
    if batch < 1 or batch > 10_000:
        raise ValueError(f"--batch must be between 1 and 10000, not {batch}")
    if visibility_s < 1:
        raise ValueError(f"--visibility must be at least 1 second, not {visibility_s}")
    moved, last_moved, refused = 0, time.monotonic(), dict[int, str]()
    with (
        psycopg.connect(source_url, autocommit=True) as source,
        psycopg.connect(target_url, autocommit=True) as target,
    ):

        def send(rows: list[Any]) -> None:
            bodies = [Jsonb(r[2]) for r in rows]
            target.execute(
                SEND, (target_queue, bodies, [Jsonb(moved_headers(r[0], r[1], r[3])) for r in rows])
            )

        while True:
            rows = [
                r
                for r in source.execute(READ, (queue, visibility_s, batch)).fetchall()
                if r[0] not in refused
            ]
            if rows:
                try:
                    send(rows)
                except psycopg.errors.StringDataRightTruncation:  # one of them is too large: which?
                    rows = [r for r in rows if not too_large(send, r, refused)]
                if rows:
                    source.execute(DELETE, (queue, [r[0] for r in rows]))
                    moved += len(rows)
                    last_moved = time.monotonic()
                    progress(moved)
                    continue
            left = int(source.execute(LEFT, (queue,)).fetchone()[0])  # type: ignore[index]
            if left <= len(refused) or time.monotonic() - last_moved >= wait_s:
                return Drained(moved, left, refused)
            time.sleep(min(1.0, wait_s))


def too_large(send: Callable[[list[Any]], None], row: Any, refused: dict[int, str]) -> bool:
    """Send one message alone; True (and why, in `refused`) when dbq's queue refuses its size."""
    try:
        send([row])
    except psycopg.errors.StringDataRightTruncation as e:
        refused[row[0]] = e.diag.message_primary or "too large"
        return True
    return False
