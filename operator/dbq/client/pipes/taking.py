"""The take path: a popper reads its leased pipe from the cursor, then deletes what it read as
one range behind the cursor and moves the counters (and, for acquire, copies the rows to
`pending`) in one single-partition batch, so reads at the head never meet tombstones. Large
bodies are read from their chunks first; those of messages popped or expired are deleted after."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.archive import PipeArchive
from dbq.client.pipes.content import PipeContent
from dbq.client.pipes.leasing import PipeLeases
from dbq.client.pipes.model import Lease, MessageOwner, PipeMessage, Visibility, unset
from dbq.client.pipes.session import Part, PipesSession
from dbq.contract import headers as header_codec
from dbq.errors import QueueError

LOG = logging.getLogger("dbq.pipes")


class PipeReader:
    def __init__(
        self,
        db: PipesSession,
        leases: PipeLeases,
        archive: PipeArchive,
        max_push_time_ms: int,
        queue: MessageOwner,
    ) -> None:
        self.db = db
        self.leases = leases
        self.archive = archive
        self.max_push_time_ms = max_push_time_ms
        self.queue = queue  # the client the messages it hands out are acked through
        self.content = PipeContent(db)

    def _rows(self, pipe: uuid.UUID, cursor: uuid.UUID | None, n: int) -> list[Any]:
        """Up to n rows of a pipe after its cursor (from its head when there is none)."""
        if cursor is None:
            return self.db.rows(self.db.cql.read_head, pipe, n)
        return self.db.rows(self.db.cql.read_after, pipe, cursor, n)

    def take(self, lease: Lease, n: int, visibility: Visibility) -> list[PipeMessage]:
        """Up to n messages from the leased pipe; none when it has none (then the lease may be
        given up: the pipe drained, or the lease too old to use safely)."""
        s = lease.state
        if len(lease.ahead) < n:
            lease.ahead = self._rows(s.pipe, s.cursor, max(n, tuning.READ_AHEAD))
        found = lease.ahead[:n]
        if not found:
            fresh = self.leases.states([s.pipe])[0]
            if fresh is None:
                return []
            s.created, s.finished, s.pushed, s.requeued = (
                fresh.created,
                fresh.finished,
                fresh.pushed,
                fresh.requeued,
            )
            if s.remaining <= 0 and s.done_pushing(self.max_push_time_ms, tuning.now_ms()):
                self.db.rows(self.db.cql.set_status, "drained", tuning.now_ms(), s.pipe)
                self.leases.release(lease)
            return []
        cql = self.db.cql
        at = tuning.now_ms()
        live = [r for r in found if r[4] is None or r[4] > at]
        # Large bodies are read before anything moves; one whose chunks are gone (its push gave
        # up too late, see PipeWriter._upload) is counted as expired.
        bodies = self.content.get([r[1] for r in live if r[2] is None])
        if lost := [r for r in live if r[2] is None and r[1] not in bodies]:
            LOG.warning("queue %s: %d messages lost their bodies (ids %s...): counted as expired",
                        self.db.names.queue, len(lost), lost[0][1])  # fmt: skip
            live = [r for r in live if r not in lost]
        # Reads that took long leave too little of the lease for the take to land safely: renew
        # it first, rather than leave the pipe leased to nobody for the rest of the lease.
        if time.monotonic() >= lease.until and not self.leases.renew(lease):
            return []  # another lessee takes these
        last = found[-1][0]
        popped = s.popped + (len(live) if visibility is None else 0)
        acquired = s.acquired + (len(live) if visibility is not None else 0)
        expired = s.expired + len(found) - len(live)
        parts: list[Part] = [
            (cql.delete_head, (s.pipe, last))
            if s.cursor is None
            else (cql.delete_after, (s.pipe, s.cursor, last)),
            (cql.count_takes, (last, popped, acquired, expired, s.pipe)),
        ]
        # Chunks of the messages this take ends (popped or expired) are marked, then deleted.
        ends, marks = self.content.marks(
            s.pipe, [r[1] for r in found if r[2] is None and (visibility is None or r not in live)], at
        )
        parts += marks
        token = uuid.uuid4() if visibility is not None else None
        if visibility is not None:
            each = [visibility] * len(live) if isinstance(visibility, float) else visibility[: len(live)]
            untils = [at + int(seconds * 1000) for seconds in each]  # fewer rows live when some expired
            written = tuning.before_lwt()
            parts += [
                (
                    cql.lease_message,
                    (
                        s.pipe,
                        r[0],
                        r[1],
                        unset(r[2]),
                        int(r[3] or 0) + 1,
                        unset(r[4]),
                        until,
                        token,
                        unset(r[5]),
                        written,
                    ),
                )
                for r, until in zip(live, untils, strict=True)
            ]
        try:
            self.db.batch(parts)
        except QueueError:
            # The batch may have been applied all the same (a timeout): this thread's copy of the
            # pipe's cursor and counters is no longer known to be right. Drop the lease; whoever
            # claims the pipe next reads them again (what was taken and not delivered is pending
            # and rolled back after its deadline, or popped: at most once).
            self.leases.set_current(None)
            raise
        s.cursor, s.popped, s.acquired, s.expired = last, popped, acquired, expired
        del lease.ahead[: len(found)]
        taken = [_message(r, bodies, int(r[3] or 0) + 1, token, s.pipe, self.queue) for r in live]
        if visibility is None:
            self.archive.keep([(m.id, m.attempts - 1, m.body, m.stored_headers) for m in taken])
        self.content.finish(s.pipe, ends)
        return taken

    def peek(self, n: int) -> list[PipeMessage]:
        """Up to n waiting messages, oldest pipe first and in push order within a pipe, none
        taken or leased: a snapshot for looking, while pushes and takes go on."""
        found: list[PipeMessage] = []
        pipes = [p for p, status in self.leases.live_pipes() if status != "drained"]
        for start in range(0, len(pipes), tuning.STATE_READ_WINDOW):
            for s in self.leases.states(pipes[start : start + tuning.STATE_READ_WINDOW]):
                if len(found) >= n:
                    return found
                if s is None:
                    continue
                at = tuning.now_ms()
                rows = [r for r in self._rows(s.pipe, s.cursor, n - len(found)) if r[4] is None or r[4] > at]
                bodies = self.content.get([r[1] for r in rows if r[2] is None])
                found += [
                    _message(r, bodies, int(r[3] or 0), None, s.pipe, None)
                    for r in rows
                    if r[2] is not None or r[1] in bodies
                ]
        return found


def _message(
    row: Any,
    bodies: dict[uuid.UUID, bytes],
    attempts: int,
    lease: uuid.UUID | None,
    pipe: uuid.UUID,
    queue: MessageOwner | None,
) -> PipeMessage:
    """A message from a row of (msg, id, body, attempts, expires, headers); `bodies` holds those
    in chunks, by id."""
    chunked = row[2] is None
    return PipeMessage(
        id=row[1], body=bodies[row[1]] if chunked else bytes(row[2]), attempts=attempts, lease=lease, pipe=pipe,
        key=row[0], headers=header_codec.decode(row[5]), stored_headers=row[5], _queue=queue, chunked=chunked,
    )  # fmt: skip
