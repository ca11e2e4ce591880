"""The archive of a pipes queue (spec.archive): messages acked or popped, kept per hour
partition with the retention as each row's TTL; a large body's chunks are copied under the
archive row's key, with the same TTL."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from dbq.client.pipes import tuning
from dbq.client.pipes.content import PipeContent, in_row
from dbq.client.pipes.model import unset
from dbq.client.pipes.session import PipesSession
from dbq.client.pipes.writing import batch_size, sizes
from dbq.client.stats import ArchivedMessage
from dbq.client.waiting import count_arg
from dbq.contract import headers as header_codec
from dbq.errors import QueueError

LOG = logging.getLogger("dbq.pipes")

HOUR_MS = 3_600_000


class PipeArchive:
    def __init__(self, db: PipesSession, ttl_s: int) -> None:
        self.db = db
        self.ttl_s = ttl_s  # how long archived rows live (0: no archive)
        self.content = PipeContent(db)

    def keep(self, taken: list[tuple[uuid.UUID, int, bytes, str | None]]) -> None:
        """Archive messages just acked or popped (id, attempts, body, headers as stored), when spec.archive is on:
        one batch per hour partition, each row with the retention as its TTL. Written after the
        take or ack it records (a failure there must not lose the messages), so a client that
        dies between the two leaves that message unarchived; a failure here is logged."""
        if not self.ttl_s or not taken:
            return
        rows = [
            (uuid.uuid1(), msg_id, attempts, in_row(body), stored) for msg_id, attempts, body, stored in taken
        ]
        try:
            large = [
                (row[0], body) for row, (_, _, body, _) in zip(rows, taken, strict=True) if row[3] is None
            ]
            if large:  # chunks under the archive key, with the same TTL, before the rows
                self.content.put([key for key, _ in large], [body for _, body in large], self.ttl_s)
            start = 0
            while start < len(rows):
                hour = tuning.uuid_ms(rows[start][0]) // HOUR_MS
                same = [r for r in rows[start:] if tuning.uuid_ms(r[0]) // HOUR_MS == hour]
                n = batch_size(sizes([r[3] for r in same], [r[4] for r in same]), len(same))
                self.db.batch(
                    (self.db.cql.keep, (hour, *r[:3], unset(r[3]), r[4], self.ttl_s)) for r in same[:n]
                )
                start += n
        except QueueError as e:
            LOG.warning(
                "queue %s: %d messages were taken but not archived: %s", self.db.names.queue, len(rows), e
            )

    def since(self, since: datetime, limit: int) -> list[ArchivedMessage]:
        """Archived messages acked or popped at or after `since`, oldest first."""
        count_arg(limit, "limit")
        out: list[ArchivedMessage] = []
        hour, last = int(since.timestamp() * 1000) // HOUR_MS, tuning.now_ms() // HOUR_MS
        while hour <= last and len(out) < limit:
            rows = self.db.rows(self.db.cql.kept_since, hour, since, limit - len(out))
            bodies = self.content.get([r[0] for r in rows if r[3] is None])
            out += [
                ArchivedMessage(
                    msg_id,
                    int(attempts or 0),
                    tuning.uuid_ms(msg_id) / 1000,
                    tuning.uuid_ms(acked) / 1000,
                    bytes(body) if body is not None else bodies[acked],
                    header_codec.decode(stored),
                )
                for acked, msg_id, attempts, body, stored in rows
                if body is not None or acked in bodies  # (chunks expire a moment before their row)
            ]
            hour += 1
        return out
