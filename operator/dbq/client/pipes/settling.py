"""How a taken message ends or comes back: ack checks the lease token and deadline, then deletes
the pending row; nack(0) pushes the message again (same id, to this client's pipe) and deletes
the pending row in one logged batch; nack(delay) moves the deadline, and once it passes the
deferring client's next take (or the pipe's lessee, every OWN_ROLLBACK_S, or repair) pushes it
again. A message acquired deadLetter.maxAttempts times goes to the dead letters instead.
Every move of a pending row first takes its lease over, so an ack and a rollback never both win."""

from __future__ import annotations

import time
import uuid
from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.content import Ending, PipeContent
from dbq.client.pipes.leasing import PipeLeases
from dbq.client.pipes.model import Lease, PipeMessage, PipeState, overdue, unset
from dbq.client.pipes.session import Part, PipesSession
from dbq.client.pipes.writing import PipeWriter
from dbq.contract import headers as header_codec
from dbq.contract.pipes import ENDING
from dbq.errors import LeaseLost


class PipeSettler:
    def __init__(
        self, db: PipesSession, writer: PipeWriter, leases: PipeLeases, max_attempts: int, source: str
    ) -> None:
        self.db = db
        self.writer = writer
        self.leases = leases
        self.max_attempts = max_attempts  # spec.deadLetter.maxAttempts (0: none)
        self.source = source  # schema.queue, as dead letters record their queue
        # Pipes holding messages this client nacked with a delay, and when the last is due
        # (monotonic): its takes push them again then, without waiting for a repair.
        self._deferred: dict[uuid.UUID, float] = {}
        self.content = PipeContent(db)

    def check_leases(self, messages: list[PipeMessage]) -> tuple[list[PipeMessage], list[PipeMessage]]:
        """(still leased with time to spare, lost) among `messages`."""
        by_pipe: dict[uuid.UUID, list[PipeMessage]] = {}
        for m in messages:
            m._leased()
            by_pipe.setdefault(m.pipe, []).append(m)
        pipes = list(by_pipe)
        rows = self.db.many(self.db.cql.leases_of, [(p, [m.key for m in by_pipe[p]]) for p in pipes])
        margin = tuning.now_ms() + int(tuning.SKEW_S * 500)
        held = {
            (p, r[0])
            for p, found in zip(pipes, rows, strict=True)
            for r in found
            if r[2] is not None and r[1] > margin
        }
        tokens = {(p, r[0]): r[2] for p, found in zip(pipes, rows, strict=True) for r in found}
        ok = [m for m in messages if (m.pipe, m.key) in held and tokens[(m.pipe, m.key)] == m.lease]
        return ok, [m for m in messages if m not in ok]

    def ack(self, batch: list[PipeMessage]) -> tuple[list[PipeMessage], list[PipeMessage]]:
        """Acknowledge leased messages: (acknowledged, lost)."""
        ok, lost = self.check_leases(batch)
        by_pipe: dict[uuid.UUID, list[PipeMessage]] = {}
        for m in ok:
            by_pipe.setdefault(m.pipe, []).append(m)
        until = tuning.now_ms() + int(tuning.ENDING_S * 1000)

        def settle(m: PipeMessage) -> Part:
            # A large message's row stays, marked ENDING, until its chunks are deleted (`finish`).
            cql = self.db.cql
            if m.chunked:
                return cql.take_over, (ENDING, until, m.pipe, m.key, m.lease)
            return cql.settle, (m.pipe, m.key, m.lease)

        for ms in by_pipe.values():
            # One conditional batch per pipe (one partition of one table): all of them, or, when
            # a rollback took one over meanwhile, none, and then each on its own.
            if not self.db.batch((settle(m) for m in ms), conditional=True):
                for m in ms:
                    text, params = settle(m)
                    if not self.db.cas(text, *params):
                        lost.append(m)
        return [m for m in ok if m not in lost], lost

    def finish(self, acked: list[PipeMessage]) -> None:
        """Delete the chunks of acked large messages, then their rows (marked ENDING by `ack`)."""
        by_pipe: dict[uuid.UUID, list[Ending]] = {}
        for m in acked:
            if m.chunked:
                by_pipe.setdefault(m.pipe, []).append((m.key, m.id))
        for pipe, ends in by_pipe.items():
            self.content.finish(pipe, ends)

    def nack(self, m: PipeMessage, delay: float, error: str | None, handled: bool) -> bool:
        """Give a leased message back (`PipeMessage.nack`); whether it was dead-lettered."""
        ok, _ = self.check_leases([m])
        if not ok:
            raise LeaseLost.of_nack(m)
        cql = self.db.cql
        if handled and self.max_attempts and m.attempts >= self.max_attempts:
            # Taken over first, so an ack or a rollback of it cannot also succeed; then the dead
            # letter and the end of the pending row in one logged batch.
            if not self.db.cas(cql.take_over, uuid.uuid4(), tuning.retake_at(), m.pipe, m.key, m.lease):
                raise LeaseLost.of_nack(m)
            burial = self.burial(m.pipe, m.key, m.id, m.attempts, error, m.stored_body, m.stored_headers)
            self.db.batch(burial, logged=True)
            return True
        if delay > 0:
            until = tuning.now_ms() + int(delay * 1000)
            if not self.db.cas(cql.defer, until, uuid.uuid4(), m.pipe, m.key, m.lease):
                raise LeaseLost.of_nack(m)
            due = time.monotonic() + delay + tuning.SKEW_S
            self._deferred[m.pipe] = max(due, self._deferred.get(m.pipe, 0.0))
            return False
        if not self.db.cas(cql.take_over, uuid.uuid4(), tuning.retake_at(), m.pipe, m.key, m.lease):
            raise LeaseLost.of_nack(m)  # a rollback took it over: it is delivered again anyway
        attempts = m.attempts if handled else max(m.attempts - 1, 0)
        self.writer.append(
            [m.stored_body],
            ids=[m.id],
            attempts=[attempts],
            headers=[m.stored_headers],
            also=[(cql.ack, (m.pipe, m.key))],
        )
        return False

    def burial(
        self,
        pipe: uuid.UUID,
        key: uuid.UUID,
        msg_id: uuid.UUID,
        attempts: int,
        error: str | None,
        body: bytes | None,
        stored_headers: str | None,
    ) -> list[Part]:
        """The statements that move a pending message (taken over) to the dead letters; its
        headers gain dbq's dead-letter keys (the error and the attempts)."""
        text = None if error is None else error[:4000]
        headers = header_codec.with_dead_letter_reason(stored_headers, text, attempts)
        return [
            (
                self.db.cql.bury,
                (
                    msg_id,
                    self.source,
                    attempts,
                    text,
                    tuning.now_ms(),
                    unset(body),
                    headers,
                    tuning.before_lwt(),
                ),
            ),
            (self.db.cql.ack, (pipe, key)),
        ]

    def roll_back_own(self, lease: Lease) -> None:
        """Push the overdue messages of the leased pipe again (at most every OWN_ROLLBACK_S)."""
        now = time.monotonic()
        if now >= lease.rollback_after:
            lease.rollback_after = now + tuning.OWN_ROLLBACK_S
            self.roll_back_overdue(lease.state)

    def roll_back_deferred(self) -> None:
        """Push again the messages this client deferred that are due, pipe by pipe; a pipe
        another client leases is tried again later (its lessee rolls them back meanwhile)."""
        now = time.monotonic()
        for pipe, due in list(self._deferred.items()):
            if due > now:
                continue
            state = self.leases.states([pipe])[0]
            if state is None or self.roll_back_overdue(state) is not None:
                self._deferred.pop(pipe, None)
            else:
                self._deferred[pipe] = now + tuning.OWN_ROLLBACK_S

    def roll_back_overdue(self, state: PipeState) -> tuple[int, int] | None:
        """Roll back the pipe's overdue pending messages (`roll_back`); None when another
        client leases the pipe."""
        late = overdue(self.db.rows(self.db.cql.pending_of, state.pipe), tuning.now_ms())
        late, _ = self.finish_ending(state.pipe, late)
        return self.roll_back(state, late) if late else (0, 0)

    def finish_ending(self, pipe: uuid.UUID, late: list[Any]) -> tuple[list[Any], int]:
        """Finish the rows of lease ENDING among a pipe's overdue pending rows (their client
        died, or failed, half-way: their chunks go, then they): the other rows, and how many
        were finished."""
        ending = [r for r in late if r[6] == ENDING]
        finished = self.content.finish(pipe, [(r[0], r[1]) for r in ending])
        return [r for r in late if r[6] != ENDING], finished

    def roll_back(self, state: PipeState, late: list[Any]) -> tuple[int, int] | None:
        """Push overdue pending messages again (or dead-letter them), holding the pipe's lease:
        this thread's own, or one taken for the purpose. How many were rolled back, and how many
        of them dead-lettered; None, having done nothing, while another client leases the pipe."""
        mine = self.leases.current()
        owner = None
        if mine is None or mine.state.pipe != state.pipe:
            owner = self.leases.borrow(state)
            if owner is None:
                return None
        cql = self.db.cql
        taken: list[Any] = []
        dead: list[Any] = []
        try:
            # Take each lease over first: an ack that lands meanwhile wins, and then the message
            # is not pushed again.
            token = uuid.uuid4()
            retake = tuning.retake_at()
            taken = [r for r in late if self.db.cas(cql.take_over, token, retake, state.pipe, r[0], r[6])]
            # Those acquired deadLetter.maxAttempts times go to the dead letters instead.
            dead = [r for r in taken if self.max_attempts and int(r[3] or 0) >= self.max_attempts]
            for r in dead:
                burial = self.burial(state.pipe, r[0], r[1], int(r[3]), tuning.LEASE_EXPIRED, r[2], r[7])
                self.db.batch(burial, logged=True)
            taken = [r for r in taken if r not in dead]
            if taken:
                self.writer.append(
                    [r[2] for r in taken],
                    ids=[r[1] for r in taken],
                    attempts=[int(r[3] or 0) for r in taken],
                    expires=[r[4] for r in taken],
                    headers=[r[7] for r in taken],
                    also=[(cql.ack, (state.pipe, r[0])) for r in taken],
                )
        finally:
            if owner is not None:
                self.leases.give_back(state.pipe, owner)
        return len(taken) + len(dead), len(dead)
