"""Statistics of a pipes queue: totals, depth, in-flight and oldest age, summed over pipes
without any lock; exact when nothing moves, a consistent-per-pipe view while clients work."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.leasing import PipeLeases
from dbq.client.pipes.model import PipesStats, PipeStat, PipeState
from dbq.client.pipes.session import PipesSession
from dbq.client.stats import HistorySample
from dbq.contract.pipes import ENDING
from dbq.errors import QueueNotFound


def stats(db: PipesSession, leases: PipeLeases, source: str, counts_dead: bool) -> PipesStats:
    """The queue's statistics; `source` is its schema.queue, `counts_dead` whether it has
    spec.deadLetter (dead letters are counted only then)."""
    meta = db.meta()
    if meta is None:
        raise QueueNotFound(f"queue {db.names.queue} is gone")
    pushed, requeued, popped, acquired, expired, retired = (int(v or 0) for v in meta[5:11])
    pipes = leases.live_pipes(meta)
    states = leases.states([p for p, _ in pipes])
    leased = db.many(db.cql.pending_leases, [(p,) for p, _ in pipes])
    per_pipe: list[PipeStat] = []
    depth = in_flight = 0
    heads: list[PipeState] = []
    at = tuning.now_ms()
    for (pipe, status), state, held in zip(pipes, states, leased, strict=True):
        if state is None:
            continue
        # In flight: rows a consumer holds. Those of lease ENDING mark chunks on their way in or
        # out (a push, a take or an ack under way), not a message anyone holds.
        pending = sum(1 for (lease,) in held if lease != ENDING)
        pushed, requeued = pushed + state.pushed, requeued + state.requeued
        popped, acquired, expired = popped + state.popped, acquired + state.acquired, expired + state.expired
        depth += max(state.remaining, 0)
        in_flight += pending
        if state.remaining > 0 and len(heads) < 4:
            heads.append(state)
        owner = state.owner if (state.lease_until or 0) > at else None
        per_pipe.append(
            PipeStat(str(pipe), status, state.pushed, state.requeued, state.popped + state.acquired,
                     max(state.remaining, 0), pending, owner)
        )  # fmt: skip
    oldest = 0.0
    for rows in _head_ids(db, heads):
        if rows:
            oldest = max(oldest, (at - tuning.uuid_ms(rows[0][0])) / 1000)
    # Dead letters are few (a count of their one partition); none unless spec.deadLetter.
    dead = int(db.rows(db.cql.count_dead, source)[0][0]) if counts_dead else 0
    delayed = int(db.rows(db.cql.count_delayed)[0][0])
    return PipesStats(
        depth=depth, in_flight=in_flight, pushed=pushed, popped=popped, acquired=acquired,
        expired=expired, oldest_age_seconds=max(oldest, 0.0), dead=dead, delayed=delayed, requeued=requeued,
        retired_pipes=retired, pipes=tuple(per_pipe),
    )  # fmt: skip


def _head_ids(db: PipesSession, states: list[PipeState]) -> Iterator[list[Any]]:
    for s in states:
        if s.cursor is None:
            yield db.rows(db.cql.head_id_first, s.pipe)
        else:
            yield db.rows(db.cql.head_id, s.pipe, s.cursor)


def history(db: PipesSession, since: datetime, until: datetime) -> list[HistorySample]:
    """The operator's statistics samples of the queue taken in [since, until), oldest first."""
    rows = db.rows(db.cql.history_range, db.names.queue, since, until)
    return [HistorySample.of_row(row[0] / 1000.0, row[1:]) for row in rows]
