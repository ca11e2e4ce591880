"""`repair()` of a pipes queue (the operator's cleanup): moves delayed messages that came due,
finishes pipes whose pusher vanished (past maxPushTime), deletes the chunks a client that died
half-way left marked (`dbq.client.pipes.content`), rolls back pending messages past their
deadline (holding that pipe's lease, so one rollback per message), marks pipes drained, and
retires the drained pipes at the head: their totals move to the queue row and the watermark in
one conditional update, then their partitions go. Idempotent and safe while clients work."""

from __future__ import annotations

from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.leasing import PipeLeases
from dbq.client.pipes.model import PipesRepair, PipeState, overdue
from dbq.client.pipes.session import PipesSession
from dbq.client.pipes.settling import PipeSettler
from dbq.client.pipes.writing import PipeWriter
from dbq.errors import QueueNotFound


class PipeRepairer:
    def __init__(
        self, db: PipesSession, writer: PipeWriter, leases: PipeLeases, settler: PipeSettler
    ) -> None:
        self.db = db
        self.writer = writer
        self.leases = leases
        self.settler = settler

    def repair(self) -> PipesRepair:
        db, cql, max_push_time_ms = self.db, self.db.cql, self.leases.max_push_time_ms
        meta = db.meta()
        if meta is None:
            raise QueueNotFound(f"queue {db.names.queue} is gone")
        delayed_due = self._deliver_due()
        finished = rolled_back = dead_lettered = drained = ended = 0
        pipes = self.leases.live_pipes(meta)
        states = self.leases.states([p for p, _ in pipes])
        pending = db.many(cql.pending_of, [(p,) for p, _ in pipes])
        at = tuning.now_ms()
        retirable: list[PipeState] = []
        prefix = True
        for (pipe, status), found, rows in zip(pipes, states, pending, strict=True):
            state = found or PipeState.never_opened(pipe)
            if found is None and not state.done_pushing(max_push_time_ms, at):
                prefix = False  # a pusher is opening it right now
                continue
            # (A pipe listed but never opened, its pusher gone, is finished like any other.)
            if not state.finished and state.done_pushing(max_push_time_ms, at):
                db.rows(cql.finish_pipe, pipe)
                if status == "active":
                    db.rows(cql.set_status, "finished", at, pipe)
                finished += 1
            late, finished_ends = self.settler.finish_ending(pipe, overdue(rows, at))
            ended += finished_ends
            if late:
                with self.leases.lease_of(pipe):  # the pipe may be this client's own
                    moved, dead = self.settler.roll_back(state, late) or (0, 0)
                rolled_back, dead_lettered = rolled_back + moved, dead_lettered + dead
            if late or finished_ends:
                rows = db.rows(cql.pending_of, pipe)
            is_drained = state.remaining <= 0 and state.done_pushing(max_push_time_ms, at)
            if is_drained and status != "drained":
                db.rows(cql.set_status, "drained", at, pipe)
                drained += 1
            prefix = prefix and is_drained and not rows
            if prefix:
                retirable.append(state)
        retired = self._retire(meta, retirable) if retirable else 0
        return PipesRepair(finished, rolled_back, drained, retired, dead_lettered, delayed_due, ended)

    def _deliver_due(self) -> int:
        """Move delayed messages that are due to this client's pipe, with their ids (at most
        DUE_BATCHES logged batches per repair). Each is claimed first, so two repairs never
        both move one; a claim whose batch failed is retried only after RETAKE_AFTER_S."""
        cql = self.db.cql
        moved = 0
        for _ in range(tuning.DUE_BATCHES):
            at = tuning.now_ms()
            rows = [r for r in self.db.rows(cql.due, at, tuning.LOGGED_MAX_MESSAGES) if (r[4] or 0) < at]
            if not rows:
                break
            rows = self.db.claimed(cql.claim_delayed, rows, lambda r: (r[0], r[1]), at)
            if rows:
                self.writer.append(
                    [r[2] for r in rows], ids=[r[1] for r in rows], expires=[r[3] for r in rows],
                    headers=[r[5] for r in rows], also=[(cql.undelay, (r[0], r[1])) for r in rows], requeue=False,
                )  # fmt: skip
            moved += len(rows)
        return moved

    def _retire(self, meta: list[Any], states: list[PipeState]) -> int:
        """Move the totals of drained head pipes into the queue row, then drop their partitions."""
        db, cql = self.db, self.db.cql
        totals = [int(v or 0) for v in meta[5:11]]
        for s in states:
            for i, v in enumerate((s.pushed, s.requeued, s.popped, s.acquired, s.expired, 1)):
                totals[i] += v
        last = states[-1].pipe
        if not db.cas(cql.retire, last, *totals, db.names.queue, meta[4]):
            return 0  # another repair moved the watermark first
        db.many(cql.drop_state, [(s.pipe,) for s in states])
        db.many(cql.drop_waiting, [(s.pipe,) for s in states])
        db.many(cql.drop_pending, [(s.pipe,) for s in states])
        db.rows(cql.drop_pipe_rows, last)
        return len(states)
