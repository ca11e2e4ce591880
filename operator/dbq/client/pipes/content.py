"""Bodies too large for their message's row (past INLINE_BODY_BYTES): stored in chunks in the
content table before the row that points to them (its body unset), read back whole, and deleted
when their message ends. What a client that dies half-way leaves is marked by a pending row of
lease ENDING, which repair finishes after its deadline (`dbq.contract.pipes`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from dbq.client.pipes import tuning
from dbq.client.pipes.session import Part, PipesSession
from dbq.contract.pipes import CHUNK_BYTES, ENDING, INLINE_BODY_BYTES
from dbq.errors import QueueError

LOG = logging.getLogger("dbq.pipes")

# A pending row of lease ENDING: its key in the pipe, and the content's key (None in a row whose
# deletion lost to a clock: its content is gone already).
Ending = tuple[uuid.UUID, uuid.UUID | None]


def to_upload(body: bytes | None) -> bool:
    """Whether a body to store goes to the content table (None: one stored there already)."""
    return body is not None and len(body) > INLINE_BODY_BYTES


def in_row(body: bytes | None) -> bytes | None:
    """What a message's row holds of its body: the body, or nothing (None) for a chunked one."""
    return None if body is None or len(body) > INLINE_BODY_BYTES else body


class PipeContent:
    def __init__(self, db: PipesSession) -> None:
        self.db = db

    def put(self, keys: Sequence[uuid.UUID], bodies: Sequence[bytes], ttl_s: int = 0) -> None:
        """Store bodies in chunks under their keys (message ids, or archive keys with `ttl_s`)."""
        cql = self.db.cql
        text = cql.put_chunk_for if ttl_s else cql.put_chunk
        params = [
            (key, i, body[start : start + CHUNK_BYTES], len(body), *((ttl_s,) if ttl_s else ()))
            for key, body in zip(keys, bodies, strict=True)
            for i, start in enumerate(range(0, max(len(body), 1), CHUNK_BYTES))
        ]
        for start in range(0, len(params), tuning.CONTENT_WINDOW):
            self.db.many(text, params[start : start + tuning.CONTENT_WINDOW])

    def get(self, keys: Sequence[uuid.UUID], statement: str | None = None) -> dict[uuid.UUID, bytes]:
        """The bodies stored under `keys` (`statement`: another queue's `chunks`); a key whose
        chunks are gone, or not all there, is missing from the answer."""
        out: dict[uuid.UUID, bytes] = {}
        text = statement or self.db.cql.chunks
        for start in range(0, len(keys), tuning.CONTENT_WINDOW):
            window = keys[start : start + tuning.CONTENT_WINDOW]
            for key, rows in zip(window, self.db.many(text, [(k,) for k in window]), strict=True):
                body = b"".join(bytes(r[1]) for r in rows if r[1] is not None)
                if rows and len(body) == rows[0][0]:
                    out[key] = body
        return out

    def drop(self, keys: Sequence[uuid.UUID]) -> None:
        self.db.many(self.db.cql.drop_content, [(k,) for k in keys])

    def marks(self, pipe: uuid.UUID, keys: Sequence[uuid.UUID], at: int) -> tuple[list[Ending], list[Part]]:
        """Pending rows of lease ENDING in `pipe` for content under `keys` (due ENDING_S after
        `at`, ms): the rows, and the statements that write them."""
        until = at + int(tuning.ENDING_S * 1000)
        ends: list[Ending] = [(uuid.uuid1(), key) for key in keys]
        written = tuning.before_lwt()
        return ends, [
            (self.db.cql.mark_ending, (pipe, mark, key, until, ENDING, written)) for mark, key in ends
        ]

    def finish(self, pipe: uuid.UUID, ends: Sequence[Ending]) -> int:
        """Delete the content the ENDING rows mark, then the rows (one partition: one batch);
        how many. A failure is logged: repair finishes them after their deadline. (No row of
        lease ENDING ever changes hands, so plain deletes do; should one lose to a clock, the
        row stays ENDING and repair deletes it again.)"""
        if not ends:
            return 0
        try:
            self.drop([key for _, key in ends if key is not None])  # (None: a row half deleted)
            self.db.batch((self.db.cql.ack, (pipe, mark)) for mark, _ in ends)
        except QueueError as e:
            LOG.warning("queue %s: the bodies of %d ended messages are left to repair: %s",
                        self.db.names.queue, len(ends), e)  # fmt: skip
            return 0
        return len(ends)
