"""The push path: each pushing thread appends to a pipe of its own, one single-partition batch
per push or batch (rows plus the pipe's pushed count), no read, no lock; after
`maxPushesPerPipe` messages or `maxPushTime` it marks the pipe finished and opens a new one.
Delayed messages wait in the delayed table instead, until repair moves them to a pipe. A large
body's chunks are stored first (`dbq.client.pipes.content`), marked in the pipe until its row is."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dbq.client.pipes import tuning
from dbq.client.pipes.content import PipeContent, in_row, to_upload
from dbq.client.pipes.model import Pusher, unset
from dbq.client.pipes.session import Part, PipesSession
from dbq.errors import QueueError


def sizes(bodies: Sequence[bytes | None], headers: Sequence[str | None] | None) -> list[int]:
    """Each message's bytes in a batch: its body as its row holds it, and its headers as stored."""
    held = [len(b) if (b := in_row(body)) is not None else 0 for body in bodies]
    if headers is None:
        return held
    return [n + (len(h.encode()) if h else 0) for n, h in zip(held, headers, strict=True)]


def batch_size(sizes: list[int], room: int, logged: bool = False) -> int:
    """How many of the messages of `sizes` (bytes each, body and headers) go in the next batch.
    A logged batch spans partitions, and Cassandra refuses one past batch_size_fail_threshold
    (50 KiB by default): it stays small."""
    most, most_bytes = (
        (tuning.LOGGED_MAX_MESSAGES, tuning.LOGGED_MAX_BYTES)
        if logged
        else (tuning.BATCH_MAX_MESSAGES, tuning.BATCH_MAX_BYTES)
    )
    total = 0
    for i, size in enumerate(sizes[: min(room, most)]):
        total += size
        if total > most_bytes and i > 0:
            return i
    return min(room, most, len(sizes))


@dataclass
class Staged:
    """Messages of one pipe ready for a caller's batch (`PipeWriter.stage`): their ids, and the
    pipe's pushed count once the batch is written."""

    pusher: Pusher
    parts: list[Part]
    ids: list[uuid.UUID]
    pushed: int


class PipeWriter:
    def __init__(
        self, db: PipesSession, identity: str, max_pushes_per_pipe: int, max_push_time_ms: int
    ) -> None:
        self.db = db
        self.identity = identity
        self.max_pushes_per_pipe = max_pushes_per_pipe
        self.max_push_time_ms = max_push_time_ms
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pushers: list[Pusher] = []
        self.content = PipeContent(db)

    def _pusher(self) -> Pusher:
        pusher: Pusher | None = getattr(self._local, "pusher", None)
        if pusher is None:
            pusher = self._local.pusher = Pusher()
            with self._lock:
                self._pushers.append(pusher)
        return pusher

    def _room(self, pusher: Pusher) -> int:
        """Messages the thread's pipe still takes; opens a new pipe when it is full or old."""
        age_ms = (time.monotonic() - pusher.opened) * 1000
        if (
            pusher.pipe is None
            or pusher.broken
            or pusher.pushed + pusher.requeued >= self.max_pushes_per_pipe
            or age_ms >= self.max_push_time_ms
        ):
            self._finish(pusher)
            pipe, at = uuid.uuid1(), tuning.now_ms()
            self.db.rows(self.db.cql.add_pipe, pipe, self.identity, at)
            self.db.rows(self.db.cql.open_pipe, pipe, self.identity, at, tuning.before_lwt())
            pusher.pipe, pusher.opened, pusher.pushed, pusher.requeued = pipe, time.monotonic(), 0, 0
            pusher.broken = False
        return self.max_pushes_per_pipe - pusher.pushed - pusher.requeued

    def _finish(self, pusher: Pusher) -> None:
        """Mark the pipe finished, unless it is so old that poppers already treat it so (it may be
        retired: a write now would leave a stray row behind)."""
        if pusher.pipe is None:
            return
        pipe, pusher.pipe = pusher.pipe, None
        if (
            time.monotonic() - pusher.opened
        ) * 1000 >= self.max_push_time_ms + tuning.FINISH_GRACE_S * 1000 / 2:
            return
        try:
            self.db.rows(self.db.cql.finish_pipe, pipe)
            self.db.rows(self.db.cql.set_status, "finished", tuning.now_ms(), pipe)
        except QueueError:
            pass  # poppers treat it as finished after maxPushTime anyway

    def finish_all(self) -> None:
        """Mark the pipes of every thread finished (the next push opens new ones)."""
        with self._lock:
            pushers = list(self._pushers)
        for pusher in pushers:
            self._finish(pusher)

    def _upload(self, pusher: Pusher, ids: list[uuid.UUID], bodies: list[bytes]) -> list[Part]:
        """Store large bodies in chunks, marked in the pusher's pipe meanwhile; the statements
        that end the marks, to go in the batch that writes the messages' rows (one partition)."""
        pipe = pusher.pipe
        assert pipe is not None
        started = time.monotonic()
        ends, marks = self.content.marks(pipe, ids, tuning.now_ms())
        self.db.batch(marks)
        self.content.put(ids, bodies)
        # The rows must land while the marks stand and while the pipe still takes pushes.
        pipe_ends = pusher.opened + (self.max_push_time_ms / 1000 + tuning.FINISH_GRACE_S / 2)
        if time.monotonic() > min(started + tuning.ENDING_S / 2, pipe_ends):
            pusher.broken = True  # the next push opens a new pipe
            raise QueueError(
                f"queue {self.db.names.queue}: storing {len(bodies)} large bodies took"
                f" {time.monotonic() - started:.0f} s, too long to write their messages safely: nothing"
                " was pushed (repair deletes what was stored); push them again"
            )
        return [(self.db.cql.ack, (pipe, mark)) for mark, _ in ends]

    def append(
        self,
        bodies: Sequence[bytes | None],
        *,
        ids: list[uuid.UUID] | None = None,
        attempts: list[int] | None = None,
        expires: list[int | None] | None = None,
        headers: list[str | None] | None = None,
        also: list[Part] | None = None,
        requeue: bool = True,
    ) -> list[uuid.UUID]:
        """Append messages (`headers` as stored) to this thread's pipe. `ids` given: a requeue (ids kept, counted as
        requeued unless `requeue` is False: delayed messages come due, counted as pushed);
        `also` joins the (then logged) batch, e.g. the pending rows being requeued. A body of
        None is one whose chunks are stored already (under its id)."""
        cql = self.db.cql
        pusher = self._pusher()
        out: list[uuid.UUID] = []
        bytes_each = sizes(bodies, headers)
        i = 0
        while i < len(bodies):
            n = batch_size(bytes_each[i:], self._room(pusher), logged=bool(also))
            keys = [uuid.uuid1() for _ in range(n)]
            new_ids = ids[i : i + n] if ids else keys
            again = bool(ids) and requeue
            pushed = pusher.pushed + (0 if again else n)
            requeued = pusher.requeued + (n if again else 0)
            large = [j for j in range(n) if to_upload(bodies[i + j])]
            unmark = (
                self._upload(pusher, [new_ids[j] for j in large], [b for j in large if (b := bodies[i + j])])
                if large
                else []
            )
            parts = self._rows(
                pusher, keys, new_ids, [in_row(b) for b in bodies[i : i + n]],
                attempts[i : i + n] if attempts else None, expires[i : i + n] if expires else None,
                headers[i : i + n] if headers else None,
            )  # fmt: skip
            parts.append((cql.count_pushes, (pushed, requeued, pusher.pipe)))
            parts += unmark  # one partition with the rows: the marks go when the rows come
            extra = also[i : i + n] if also else []
            try:
                self.db.batch([*parts, *extra], logged=bool(extra))
            except QueueError:
                pusher.broken = True  # its counters may be off by this batch: start a new pipe
                raise
            pusher.pushed, pusher.requeued = pushed, requeued
            out.extend(new_ids)
            i += n
        return out

    def _rows(
        self,
        pusher: Pusher,
        keys: list[uuid.UUID],
        ids: list[uuid.UUID],
        held: Sequence[bytes | None],
        attempts: Sequence[int] | None,
        expires: Sequence[int | None] | None,
        headers: Sequence[str | None] | None,
    ) -> list[Part]:
        """The statements that write messages' rows in the pusher's pipe (`held`: what each row
        holds of its body; None for one in chunks)."""
        return [
            (
                self.db.cql.push,
                (
                    pusher.pipe, keys[j], ids[j], unset(held[j]), attempts[j] if attempts else 0,
                    unset(expires[j] if expires else None), unset(headers[j] if headers else None),
                ),
            )
            for j in range(len(ids))
        ]  # fmt: skip

    def stage(self, bodies: Sequence[bytes], expires: int | None, headers: Sequence[str | None],
              chunked: Sequence[bool]) -> Staged:  # fmt: skip
        """Messages to append to this thread's pipe in a batch the caller writes with other
        queues' (a topic's publish): the statements (the rows, the pipe's count, the ends of their
        chunks' marks), all in one pipe. The bodies `chunked` marks, and any past a row's size,
        are stored in the content table now, their rows left without them. Call `landed` once the
        batch is written, `lost` if it failed."""
        pusher = self._pusher()
        n = len(bodies)
        if n > self.max_pushes_per_pipe:
            raise QueueError(
                f"queue {self.db.names.queue}: {n} copies in one publish are more than a pipe takes"
                f" (maxPushesPerPipe {self.max_pushes_per_pipe}): publish fewer at once"
            )
        if self._room(pusher) < n:
            pusher.broken = True  # a fresh pipe, which takes them all
            self._room(pusher)
        ids = [uuid.uuid1() for _ in range(n)]
        large = [j for j in range(n) if chunked[j] or to_upload(bodies[j])]
        unmark = self._upload(pusher, [ids[j] for j in large], [bodies[j] for j in large]) if large else []
        held = [None if chunked[j] else in_row(bodies[j]) for j in range(n)]
        parts = self._rows(pusher, ids, ids, held, None, [expires] * n if expires else None, headers)
        parts.append((self.db.cql.count_pushes, (pusher.pushed + n, pusher.requeued, pusher.pipe)))
        return Staged(pusher, [*parts, *unmark], ids, pusher.pushed + n)

    @staticmethod
    def landed(staged: Staged) -> None:
        staged.pusher.pushed = staged.pushed

    @staticmethod
    def lost(staged: Staged) -> None:
        staged.pusher.broken = True  # its counters may be off by the batch: start a new pipe

    def delay(
        self, bodies: list[bytes], headers: list[str | None], due: int, expiry: int | None
    ) -> list[uuid.UUID]:
        """Keep messages in the delayed table until `due` (ms); their ids. Large bodies are
        marked in this thread's pipe while stored; the marks end in the (then logged) batches
        that write their rows."""
        ids = [uuid.uuid1() for _ in bodies]
        rows: list[tuple[Any, ...]] = [
            (due, i, unset(in_row(body)), unset(expiry), unset(h), tuning.before_lwt())
            for i, body, h in zip(ids, bodies, headers, strict=True)
        ]
        large = [j for j, body in enumerate(bodies) if to_upload(body)]
        unmark: dict[int, Part] = {}
        if large:
            pusher = self._pusher()
            self._room(pusher)
            ends = self._upload(pusher, [ids[j] for j in large], [bodies[j] for j in large])
            unmark = dict(zip(large, ends, strict=True))
        bytes_each = sizes(bodies, headers)
        start = 0
        while start < len(rows):  # one partition: unlogged batches, unless marks end with them
            n = batch_size(bytes_each[start:], len(bodies) - start, logged=bool(unmark))
            ends_here = [unmark[j] for j in range(start, start + n) if j in unmark]
            self.db.batch([*((self.db.cql.delay, row) for row in rows[start : start + n]), *ends_here],
                          logged=bool(ends_here))  # fmt: skip
            start += n
        return ids
