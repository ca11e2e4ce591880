"""The dead letters of a pipes queue: listed, redriven (pushed again with their ids) and purged,
wherever they are kept (the queue's own dead table, or spec.deadLetter.queue's). A large body
stays in its queue's content table, under the message id, until the dead letter is purged."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.content import PipeContent
from dbq.client.pipes.model import dead_letter_of_row
from dbq.client.pipes.session import PipesSession
from dbq.client.pipes.writing import PipeWriter
from dbq.client.stats import DeadLetter
from dbq.client.waiting import count_arg
from dbq.contract import headers as header_codec
from dbq.contract.pipes import PipesStatements
from dbq.names import QueueNames


class PipeDeadLetters:
    def __init__(self, db: PipesSession, writer: PipeWriter, source: str) -> None:
        self.db = db
        self.writer = writer
        self.source = source  # schema.queue, as dead letters record their queue
        self.content = PipeContent(db)

    def listed(self, limit: int, held: bool) -> list[DeadLetter]:
        """This queue's dead letters, oldest pushed first; `held`: every dead letter this
        queue's table keeps, its own and other queues'."""
        rows = (
            self.db.rows(self.db.cql.held_dead_letters, count_arg(limit, "limit"))
            if held
            else self._rows(None, limit)
        )
        chunked: dict[str, list[uuid.UUID]] = {}  # by source: chunks stay in their queue's table
        for r in rows:
            if r[4] is None:
                chunked.setdefault(r[6] or self.source, []).append(r[0])
        bodies: dict[uuid.UUID, bytes] = {}
        for source, ids in chunked.items():
            theirs = (
                None if source == self.source else PipesStatements(QueueNames.of_qualified(source)).chunks
            )
            bodies |= self.content.get(ids, theirs)
        return [
            dead_letter_of_row(r, bytes(r[4]) if r[4] is not None else bodies.get(r[0], b"")) for r in rows
        ]

    def _rows(self, ids: Iterable[uuid.UUID] | None, limit: int) -> list[Any]:
        count_arg(limit, "limit")
        if ids is None:
            return self.db.rows(self.db.cql.dead_letters, self.source, limit)
        wanted = list(ids)
        if not wanted or not all(isinstance(i, uuid.UUID) for i in wanted):
            raise ValueError("ids are the dead letters' ids (UUIDs), or None for the oldest")
        return self.db.rows(self.db.cql.dead_letters_by_id, wanted[:limit], self.source)

    def redrive(self, ids: Iterable[uuid.UUID] | None, limit: int) -> int:
        """Dead letters back to delivery with their ids and attempts from zero. Each is claimed
        first (so two redrives never both push one), then pushed again and removed from the
        dead letters in one logged batch. How many moved."""
        at = tuning.now_ms()
        rows = [r for r in self._rows(ids, limit) if (r[5] or 0) < at]
        rows = self.db.claimed(self.db.cql.claim_dead, rows, lambda r: (r[0],), at)
        if rows:
            self.writer.append(
                [r[4] for r in rows], ids=[r[0] for r in rows], attempts=[0] * len(rows),
                headers=[header_codec.without_dead_letter_reason(r[7]) for r in rows], also=[(self.db.cql.unbury, (r[0],)) for r in rows],
            )  # fmt: skip
        return len(rows)

    def purge(self, ids: Iterable[uuid.UUID] | None, limit: int) -> int:
        """Dead letters deleted for good. How many went."""
        rows = self._rows(ids, limit)
        self.db.many(self.db.cql.unbury, [(r[0],) for r in rows])
        self.content.drop([r[0] for r in rows if r[4] is None])
        return len(rows)
