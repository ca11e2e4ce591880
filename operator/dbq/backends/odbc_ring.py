"""Ring queues over ODBC (PostgreSQL, SQL Server): observe, plan, apply, measure, clean up,
maintain, tear down.

The dialect object (`dialects.ring_sql`) supplies every statement; this class only runs them.
Statistics and repair call the queue's own routines, as the data-plane client does, on the
backend's one connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pyodbc

from dbq.api.limits import DEFAULT_MAX_BODY_BYTES
from dbq.backends.base import ApplyResult, Depth, Finding, Resized
from dbq.backends.dialects import RingSql, relations, ring_sql
from dbq.backends.maintenance import (
    IndexFigures,
    MaintenanceResult,
    TableFigures,
    figures,
    plan_maintenance,
)
from dbq.backends.odbc import OdbcBackend, transaction
from dbq.backends.postgres import pgmq
from dbq.backends.postgres.access import ensure_helper
from dbq.backends.ring_plan import (
    Observed,
    Recorded,
    RingAction,
    RingStep,
    choose_compression,
    is_new,
    plan_ring,
)
from dbq.backends.ring_resize import (
    Generation,
    ResizeState,
    chunks,
    place_generation,
)
from dbq.backends.sqlserver.server import refuse_below_floor
from dbq.client import QueueStats, RepairResult
from dbq.connection import ConnectionSettings
from dbq.connection.odbc import UNDEFINED_OBJECT_STATES, connect, driver_error, retried, translate
from dbq.contract.headers import DEFAULT_HEADER_BYTES, DEFAULT_MAX_HEADERS
from dbq.contract.ring import (
    RING_SCHEMA_VERSION,
    RingTarget,
    call_statement,
    positions_of_many,
    quiet_sequences,
    stats_of_many,
)
from dbq.errors import DbqError, QueueNotFound, ResizeWaiting
from dbq.names import QueueNames

# A resize's switch waits at most SWITCH_WAIT_MS for the fence (pushes queue behind it meanwhile),
# and is tried SWITCH_TRIES times before the resize reports ResizeWaiting.
SWITCH_WAIT_MS = 100
SWITCH_TRIES = 40
# After each chunk of slots a resize writes or deletes, a pause of this many times its duration.
RESIZE_PACE = 6.0


def paced(cur: pyodbc.Cursor, statement: str) -> None:
    """One chunk of a resize's slots written or deleted, then a pause RESIZE_PACE times as long as
    it took: the queue's clients keep most of what the server gives them meanwhile."""
    started = time.monotonic()
    cur.execute(statement)
    time.sleep((time.monotonic() - started) * RESIZE_PACE)


@dataclass(frozen=True)
class Retired:
    """A retirement run: generations retired, generations alive after it, positions the older
    ones still hold for ring order, and leased messages in their slots."""

    retired: int = 0
    alive: int = 1
    positions_left: int = 0
    leased: int = 0

    @property
    def resizing(self) -> bool:
        return self.alive > 1


# The archive's scavenger removes at most SCAVENGE_BATCH rows per transaction and
# SCAVENGE_BATCHES transactions per cleanup run.
SCAVENGE_BATCH = 5_000
SCAVENGE_BATCHES = 20


class OdbcRing(OdbcBackend):
    def __init__(self, settings: ConnectionSettings, target: RingTarget) -> None:
        super().__init__(settings, target.names)
        # The database names the queue's roles: it is the connection's, whatever the caller gave.
        self.target = replace(target, database=settings.database)
        self.sql = ring_sql(settings.backend, self.target)
        self._server_checked = False
        self._compression_resolved = False

    # --- observe / plan / apply -----------------------------------------------------------
    def observe(self) -> Observed:
        with self._errors():
            cur = self.conn.cursor()
            if self.sql.SERVER_VERSION and not self._server_checked:
                major, level = cur.execute(self.sql.SERVER_VERSION).fetchone()
                refuse_below_floor(int(major), int(level))  # InvalidSpec, before anything is planned
                self._server_checked = True
            if self.sql.COMPRESSIONS and not self._compression_resolved:
                self._resolve_compression(cur.execute(self.sql.COMPRESSIONS).fetchval())
            schema = self.names.schema
            keeper_version = self._keeper_version(cur)
            facade_version, pgmq_name, pgmq_topics = self._pgmq(cur) if self.sql.PGMQ else (0, "", ())
            if not cur.execute(self.sql.OBSERVE_SCHEMA, schema).fetchval():
                return Observed(keeper_version=keeper_version, facade_version=facade_version)
            n = self.names
            rels = relations(cur, self.sql, schema, [n.meta, n.history, *n.tables, *n.sequences])
            tables = frozenset(name for name, kind in rels.items() if kind in ("r", "p"))
            sequences = frozenset(name for name, kind in rels.items() if kind == "S")
            wanted = ",".join(n.routine(r) for r in self.sql.ROUTINES)
            routines = frozenset(
                r[0] for r in cur.execute(self.sql.OBSERVE_ROUTINES, schema, wanted).fetchall()
            )
            meta_exists = self.names.meta in tables
            recorded = self._recorded(cur, self.names) if meta_exists else None
            ring_rows = 0
            # The slots that must exist: the newest generation's, or (before generations) the
            # recorded size's, or the spec's for a new ring.
            base, slots = 0, recorded.ring_size if recorded is not None else self.target.size
            if self.names.generations in tables:
                newest = cur.execute(self.sql.newest_generation()).fetchone()
                if newest:
                    base, slots = int(newest[0]), int(newest[1])
            if self.names.ring in tables:
                # The fill is one transaction: a ring that has its first and last slots is whole,
                # so no count of millions of rows on every observe.
                whole = cur.execute(self.sql.slots_present(base, base + slots)).fetchval() == min(2, slots)
                ring_rows = (
                    slots
                    if whole
                    else cur.execute(
                        f"SELECT count(*) FROM {self.sql.ring} WHERE slot >= {base} AND slot < {base + slots}"
                    ).fetchval()
                )
            secured = True
            if self.sql.OBSERVE_INSECURE is not None and routines:
                insecure = cur.execute(
                    self.sql.OBSERVE_INSECURE, schema, self.sql.owner, schema, ",".join(routines)
                ).fetchval()
                secured = not insecure
            return Observed(
                secured=secured,
                schema_exists=True,
                meta_exists=meta_exists,
                tables=tables,
                sequences=sequences,
                routines=routines,
                ring_rows=int(ring_rows),
                slots=slots,
                recorded=recorded,
                keeper_version=keeper_version,
                facade_version=facade_version,
                pgmq_name=pgmq_name,
                pgmq_topics=pgmq_topics,
            )

    def _pgmq(self, cur: pyodbc.Cursor) -> tuple[int, str, tuple[str, ...]]:
        """The database's PGMQ facade version (0: none), the PGMQ name mapped to this queue and the
        topic patterns bound to it."""
        if cur.execute(pgmq.OBSERVE_FACADE).fetchval() != 2:  # none, or not this login's to read yet
            return 0, "", ()
        version = int(cur.execute(pgmq.OBSERVE_VERSION).fetchval())
        name = cur.execute(pgmq.OBSERVE_NAME, self.names.schema, self.names.queue).fetchval()
        if not name or version < pgmq.TOPICS_SINCE:
            return version, name or "", ()
        # sorted here, as the target's are: the database's collation may order them otherwise
        topics = tuple(sorted(r[0] for r in cur.execute(pgmq.OBSERVE_TOPICS, name).fetchall()))
        return version, name, topics

    def _resolve_compression(self, offered: str | None) -> None:
        """The target with spec.messages.compression resolved against what the server offers
        (`offered`, comma-separated; InvalidSpec, before anything is planned, when it does not
        offer the one asked for)."""
        choices = frozenset(offered.split(",")) if offered else frozenset()
        self.target = replace(self.target, compression=choose_compression(self.target.compression, choices))
        self.sql = ring_sql(self.settings.backend, self.target)
        self._compression_resolved = True

    def _recorded(self, cur: pyodbc.Cursor, names: QueueNames) -> Recorded | None:
        """The metadata row of queue `names` (its schema's metadata table exists)."""
        # Every column, by name: a metadata table of an older version lacks the newer ones.
        row = cur.execute(self.sql.meta_row(names), names.queue).fetchone()
        if not row:
            return None
        values = dict(zip((d[0] for d in cur.description), row, strict=True))
        return Recorded(
            schema_version=int(values["schema_version"]),
            ring_size=int(values["ring_size"]),
            message_bytes=int(values["message_bytes"]),
            max_attempts=int(values.get("max_attempts") or 0),
            archive=bool(int(values.get("archive") or 0)),
            dead_letter_queue=str(values.get("dead_letter_queue") or ""),
            header_bytes=int(values.get("header_bytes") or DEFAULT_HEADER_BYTES),
            max_headers=int(values.get("max_headers") or DEFAULT_MAX_HEADERS),
            max_body_bytes=int(values.get("max_body_bytes") or DEFAULT_MAX_BODY_BYTES),
            compression=str(values.get("compression") or ""),
        )

    def _keeper_version(self, cur: pyodbc.Cursor) -> int | None:
        """The schema version of the queue that keeps this one's dead letters (when another does):
        None when its dead-letter table or metadata row does not exist."""
        keeper = self.target.dead_letter_keeper
        if keeper is None:
            return None
        tables = relations(cur, self.sql, keeper.schema, [keeper.meta, keeper.dead])
        if keeper.meta not in tables or keeper.dead not in tables:
            return None
        recorded = self._recorded(cur, keeper)
        return recorded.schema_version if recorded is not None else None

    def plan(self, observed: Observed) -> list[RingStep]:
        return plan_ring(self.target, observed, self.sql.ROUTINES, resizable=self._resizable)

    def advisory_lock(self) -> str:
        return self.sql.advisory_lock()

    def advisory_unlock(self) -> str | None:
        return self.sql.advisory_unlock()

    def history_sql(self) -> RingSql:
        return self.sql

    def apply(self) -> ApplyResult:
        """Make the database match the spec. A first look takes no lock, so a queue that matches
        (what a drift check finds, mostly) costs no transaction. Otherwise it plans again under
        the lock, so a plan another operator finished meanwhile is not applied twice; callers
        that only want to know use plan()."""
        sessions = self._shared_login_sessions()
        first = self._first_look(self.observe)
        if first is not None and not self.plan(first):
            return ApplyResult(
                steps=[],
                schema_version=RING_SCHEMA_VERSION,
                operator_login_sessions=sessions,
                resized=self.resize() if self._resizes(first) else None,
            )
        with self._locked_transaction() as cur:
            observed = self.observe()
            steps = self.plan(observed)
            if self.settings.backend == "postgres" and any(s.action == RingAction.SECURE for s in steps):
                ensure_helper(cur, self.settings.database, self.settings.username)
            for batch in self.sql.batches([s for step in steps for s in self.sql.render(step)]):
                cur.execute(batch)
        # Out of the plan's transaction and its schema lock: a resize prepares its slots in
        # transactions of their own, and its switch is brief.
        return ApplyResult(
            steps=steps,
            schema_version=RING_SCHEMA_VERSION,
            created=is_new(self.target, observed),
            operator_login_sessions=sessions,
            resized=self.resize() if self._resizes(observed) else None,
        )

    @property
    def _resizable(self) -> bool:
        """Whether apply resizes a ring of another size: a ring its Queue provisioned."""
        return self.target.resize

    def _resizes(self, observed: Observed) -> bool:
        """Whether apply resizes: the ring's newest generation has another size than spec.ring.size,
        and not one autoGrow may have grown it to."""
        grown = self.target.size <= observed.slots <= self.target.grows_to
        return self._resizable and observed.slots not in (0, self.target.size) and not grown

    def _shared_login_sessions(self) -> int | None:
        """Sessions of applications on the operator's login in this database, read at most every
        SHARED_LOGIN_READ_S (pg_stat_activity costs milliseconds with hundreds of connections, and
        every queue created or checked reports it)."""
        if self.sql.SHARED_LOGIN_SESSIONS is None:
            return None
        key, now = self.settings.odbc(), time.monotonic()
        read = _shared_logins.get(key)
        if read is not None and now - read[0] < SHARED_LOGIN_READ_S:
            return read[1]
        with self._errors():
            sessions = int(self.conn.cursor().execute(self.sql.SHARED_LOGIN_SESSIONS).fetchval())
        _shared_logins[key] = (now, sessions)
        return sessions

    # --- state ----------------------------------------------------------------------------
    def checks(self) -> list[Finding]:
        """No health checks beyond the observation's drift: this design has none."""
        return []

    def depth(self) -> Depth:
        with self._errors():
            try:
                ready, leased = self.conn.cursor().execute(self.sql.depth_sql()).fetchone()
            except pyodbc.Error as e:
                # A deletion run again after it dropped the queue finds nothing: not an error.
                gone = driver_error(e, self.settings)[0] in UNDEFINED_OBJECT_STATES
                if gone and self.names.ring not in self.observe().tables:
                    raise QueueNotFound(
                        f"queue {self.names.queue}: its ring does not exist (dropped already)"
                    ) from None
                raise
            return Depth(depth=int(ready), in_flight=int(leased))

    def _call(self, verb: str, *args: object) -> list[pyodbc.Row]:
        """One call of the queue's routine `verb` on the backend's connection; one the database
        rolled back for a deadlock or a serialization failure changed nothing, and is made again
        (as the client does). No data-plane client: it would first read the queue's metadata."""
        statement = call_statement(self.settings.backend, self.names, verb)
        with self._errors():
            return retried(lambda: self.conn.cursor().execute(statement, *args).fetchall())

    def measure(self) -> QueueStats:
        return QueueStats.of_row(self._call("stats")[0])

    def cleanup(self, stalled_after_s: float) -> dict[str, int]:
        """Repair: expired leases back to ready, orphans and holes older than `stalled_after_s`
        rescued or voided, expired messages dropped, gap records purged; then archived messages
        past the retention scavenged."""
        grace_ms = int(stalled_after_s * 1000)
        r = RepairResult.of_rows(self._call("repair", grace_ms)[0], self._call("void_holes", grace_ms)[0])
        counts = {"expiredLeases": r.expired_leases, "orphans": r.orphans, "holes": r.holes,
                  "expired": r.expired, "gapsPurged": r.gaps_purged, "deadLettered": r.dead_lettered}  # fmt: skip
        if self.target.archive_retention_s > 0:
            counts["archiveScavenged"] = self._scavenge()
        if self._resize_pending():
            done = self.retire()
            if done is not None:  # None: a resize of this queue holds its lock right now
                counts |= {"generationsRetired": done.retired, "generationsDraining": done.alive - 1,
                           "resizePositionsLeft": done.positions_left, "resizeLeased": done.leased}  # fmt: skip
        return counts

    def _resize_pending(self) -> bool:
        """Whether an older generation drains, or slots no generation holds are left (one cheap
        statement: the ring's lowest and highest slot come from its key)."""
        with self._errors():
            return bool(self.conn.cursor().execute(self.sql.resize_pending()).fetchval())

    def _scavenge(self) -> int:
        """Archived messages past the retention, removed in bounded batches (each its own short
        transaction), at most SCAVENGE_BATCHES of them per run: a large backlog takes several runs."""
        removed, retention_ms = 0, int(self.target.archive_retention_s * 1000)
        for _ in range(SCAVENGE_BATCHES):
            batch = int(self._call("scavenge", retention_ms, SCAVENGE_BATCH)[0][0])
            removed += batch
            if batch < SCAVENGE_BATCH:
                break
        return removed

    # --- online resize (`dbq.backends.ring_resize`) ------------------------------------------
    @contextmanager
    def _resize_session(self) -> Iterator[pyodbc.Cursor | None]:
        """A connection of its own holding the queue's resize lock (None when another run holds
        it): preparing a generation takes many transactions, and must not hold the pool's."""
        sql, lock = self.sql, f"dbq-resize:{self.names.schema}.{self.names.queue}"
        conn = connect(self.settings)
        try:
            cur = conn.cursor()
            if not cur.execute(sql.try_resize_lock(), lock).fetchval():
                yield None
                return
            try:
                yield cur
            finally:
                cur.execute(sql.resize_unlock(), lock)
        except pyodbc.Error as e:
            raise translate(e, self.settings) from None
        finally:
            conn.close()

    def _resize_state(self, cur: pyodbc.Cursor) -> ResizeState:
        rows = cur.execute(self.sql.generations()).fetchall()
        gens = tuple(Generation(int(r[0]), int(r[1]), int(r[2])) for r in rows)
        return ResizeState(gens, int(rows[0][3]) if rows else 0)

    def resize(self, size: int | None = None) -> Resized | None:
        """The ring brought online to `size` slots (spec.ring.size when None) when its newest
        generation has another size: the new generation's slots prepared, then the switch
        (`ResizeWaiting` when pushes kept the fence). None when the newest generation has that
        size already, or another run is resizing."""
        sql, size = self.sql, size or self.target.size
        with self._resize_session() as cur:
            if cur is None:
                return None
            state = self._resize_state(cur)
            if not state.generations or state.newest.size == size:
                return None
            base = place_generation(state.generations, size)
            started = time.monotonic()
            for lo, hi in chunks(base, base + size, sql.RESIZE_CHUNK):
                if cur.execute(sql.slots_present(lo, hi)).fetchval() < min(2, hi - lo):
                    paced(cur, sql.prepare_slots(lo, hi))
            prepared_s = time.monotonic() - started
            pause_s = self._switch(cur, base, size)
            after = self._resize_state(cur)
            self._delete_strays(cur, after)
            left = after.positions_left()
            return Resized(state.newest.size, size, prepared_s, pause_s, left)

    def _switch(self, cur: pyodbc.Cursor, base: int, size: int) -> float:
        """The switch (one statement, its own transaction), tried until it takes the fence (each
        wait at most SWITCH_WAIT_MS, pushes queued behind it meanwhile): how long the last try took."""
        sql = self.sql
        for attempt in range(SWITCH_TRIES):
            started = time.monotonic()
            try:
                cur.execute(sql.switch(base, size, SWITCH_WAIT_MS))
                return time.monotonic() - started
            except pyodbc.Error as e:
                if not sql.fence_busy(*driver_error(e, self.settings)):
                    raise
            time.sleep(0.05 * (attempt + 1))  # let the pushes queued behind it through
        raise ResizeWaiting(
            f"queue {self.names.queue}: the switch to {size} slots did not get the fence of the"
            f" pushes in {SWITCH_TRIES} tries of {SWITCH_WAIT_MS} ms: a push stays inside its transaction"
        )

    def _delete_strays(self, cur: pyodbc.Cursor, state: ResizeState) -> None:
        """With one generation alive, the slots it does not hold (those of a newest generation a
        switch replaced before any push reached it, or of a run stopped while deleting) go."""
        if len(state.generations) != 1:
            return
        sql = self.sql
        low, high = cur.execute(sql.slot_bounds()).fetchone()
        newest = state.newest
        for start, end in ((int(low), newest.slot_base), (newest.slot_end, int(high) + 1)):
            for lo, hi in chunks(start, end, sql.RESIZE_CHUNK):
                paced(cur, sql.delete_slots(lo, hi))

    def retire(self) -> Retired | None:
        """Older generations whose positions are all drawn retire (their leftovers moved to the
        spill table, their slots deleted); what is left to drain, counted. None when a resize of
        the queue holds its lock (the next run looks again)."""
        sql = self.sql
        with self._resize_session() as cur:
            if cur is None:
                return None
            retired = 0
            while (oldest := self._resize_state(cur).retirable()) is not None:
                with transaction(cur.connection):
                    move, forget = sql.retire(oldest.first_pos, oldest.slot_base, oldest.slot_end)
                    cur.execute(move)
                    gone = cur.execute(forget).fetchval()
                if not gone:  # rows a client held were skipped: the next run moves them
                    break
                retired += 1
                for lo, hi in chunks(oldest.slot_base, oldest.slot_end, sql.RESIZE_CHUNK):
                    paced(cur, sql.delete_slots(lo, hi))
            state = self._resize_state(cur)
            self._delete_strays(cur, state)
            leased = sum(int(cur.execute(sql.leased_in(g.slot_base, g.slot_end)).fetchval())
                         for g in state.draining)  # fmt: skip
            return Retired(retired, len(state.generations), state.positions_left(), leased)

    # --- maintenance ----------------------------------------------------------------------
    def _measure_bloat(self, cur: pyodbc.Cursor) -> tuple[list[TableFigures], list[IndexFigures]]:
        schema = self.names.schema
        tables = [TableFigures(r[0], int(r[1]), int(r[2]))
                  for r in cur.execute(self.sql.maintenance_tables(), schema).fetchall()]  # fmt: skip
        indexes = [
            IndexFigures(r[0], r[1], int(r[2]), int(r[3]), None if r[4] is None else float(r[4]))
            for r in cur.execute(self.sql.maintenance_indexes(), schema).fetchall()
        ]
        return tables, indexes

    def maintain(self, dead_percent: float, fragmentation_percent: float, online: bool) -> MaintenanceResult:
        """Measure, then vacuum/reindex what passed its threshold, on a connection of its own that
        holds the queue's maintenance lock for the whole run (autocommit: VACUUM and
        REINDEX CONCURRENTLY refuse to run in a transaction)."""
        started = time.monotonic()
        lock = f"dbq-maintenance:{self.names.schema}.{self.names.queue}"
        conn = connect(self.settings)
        try:
            cur = conn.cursor()
            if not cur.execute(self.sql.try_maintenance_lock(), lock).fetchval():
                return MaintenanceResult("Skipped", "another maintenance run of this queue is still going")
            try:
                tables, indexes = self._measure_bloat(cur)
                before = figures(tables, indexes)
                steps = plan_maintenance(tables, indexes, dead_percent=dead_percent,
                                         fragmentation_percent=fragmentation_percent,
                                         dialect=self.settings.backend)  # fmt: skip
                if not steps:
                    return MaintenanceResult("NotNeeded", "every figure is under its threshold", [], before,
                                             before, time.monotonic() - started)  # fmt: skip
                capable = online and bool(cur.execute(self.sql.online_capable()).fetchval())
                for step in steps:
                    cur.execute(self.sql.maintenance_action(step.action, step.target, step.table, capable))
                after = figures(*self._measure_bloat(cur))
                done = "; ".join(f"{s.action} {s.target} ({s.why})" for s in steps)
                return MaintenanceResult("Succeeded", done, steps, before, after, time.monotonic() - started)
            finally:
                cur.execute(self.sql.maintenance_unlock(), lock).fetchall()
        except pyodbc.Error as e:
            raise translate(e, self.settings) from None
        finally:
            conn.close()

    def teardown(self) -> bool:
        """Its objects dropped, its rows in the schema's tables deleted, its roles dropped, and
        the schema with its last queue: False when none of its tables or sequences nor its
        metadata row was left (a deletion run again after it finished, say)."""
        with self._locked_transaction() as cur:
            if not cur.execute(self.sql.OBSERVE_SCHEMA, self.names.schema).fetchval():
                return False
            meta = self.names.meta
            present = relations(
                cur, self.sql, self.names.schema, [meta, *self.names.tables, *self.names.sequences]
            )
            recorded = self._recorded(cur, self.names) if meta in present else None
            found = recorded is not None or any(name != meta for name in present)
            if recorded is not None and recorded.dead_letter_queue:
                # Its dead letters kept by another queue go with it.
                keeper = QueueNames.of_qualified(recorded.dead_letter_queue)
                if keeper.dead in relations(cur, self.sql, keeper.schema, [keeper.dead]):
                    cur.execute(self.sql.forget_dead_letters(keeper))
            for statement in self.sql.drop():
                if statement.startswith("DELETE FROM") and meta not in present:
                    continue
                cur.execute(statement)
            if meta in present:
                for statement in self.sql.drop_schema_if_unused():
                    cur.execute(statement)
            if self.settings.backend == "postgres":
                ensure_helper(cur, self.settings.database, self.settings.username)
            for statement in self.sql.drop_roles():
                cur.execute(statement)
        return found


# Relations a queue's `stats` locks: its eleven counter sequences, its pop sequence, the spill
# table and its index, the ring and its key and the generations table and its key (for the
# oldest message's age).
STATS_RELATIONS = 18
# max_locks_per_transaction of each database (by connection string), read once.
_max_locks: dict[str, int] = {}
# Applications' sessions on the operator's login, by connection string: when read, how many.
_shared_logins: dict[str, tuple[float, int]] = {}
SHARED_LOGIN_READ_S = 10.0


def measure_many(rings: Sequence[OdbcRing]) -> list[QueueStats | DbqError]:
    """The statistics of queues of one database, in order: on PostgreSQL one statement reads
    as many queues as the server's lock table allows one transaction (max_locks_per_transaction
    over STATS_RELATIONS); elsewhere, or when such a statement fails (a queue dropped behind the
    operator's back, say), one call each, so one queue's error is its own. One connection at a
    time: the statements run on the first ring's, which the caller closes."""
    first = rings[0]
    if first.sql.MAX_LOCKS is None:  # SQL Server: no statement reads many queues' routines
        return [_measured(ring) for ring in rings]
    chunk = max(1, _max_locks_of(first) // STATS_RELATIONS)
    out: list[QueueStats | DbqError] = []
    for start in range(0, len(rings), chunk):
        part = rings[start : start + chunk]
        try:
            with first._errors():
                rows = first.conn.cursor().execute(stats_of_many([r.names for r in part])).fetchall()
        except DbqError:
            out += [_measured(ring) for ring in part]
            continue
        by_index = {int(row[0]): QueueStats.of_row(list(row)[1:]) for row in rows}
        out += [by_index[i] for i in range(len(part))]
    return out


@dataclass(frozen=True)
class Positions:
    """A queue's `quiet_sequences` read: their last values, and the sequences' oids, by which the
    next read finds them without a catalog lookup."""

    values: tuple[int, ...]
    oids: tuple[int, ...]


def positions_of(
    rings: Sequence[OdbcRing], oids: Sequence[tuple[int, ...] | None] | None = None
) -> list[Positions | None]:
    """What tells each ring's statistics unchanged while it stays empty (`quiet_sequences`), in
    order; rings of one database, read on the first ring's connection, which the caller closes.
    A ring's sequences are read by the `oids` an earlier read answered where given (None: by
    name). As many rings a statement as the lock table allows one transaction; None for the
    rings of a statement that failed (a queue dropped behind the operator's back, or a sequence
    made anew under another oid), and for every ring where no statement reads many (SQL
    Server)."""
    first = rings[0]
    if first.sql.MAX_LOCKS is None:
        return [None] * len(rings)
    known = list(oids) if oids is not None else [None] * len(rings)
    width = len(quiet_sequences(first.names))
    chunk = max(1, _max_locks_of(first) // width)
    out: list[Positions | None] = []
    for start in range(0, len(rings), chunk):
        part = rings[start : start + chunk]
        statement = positions_of_many([r.names for r in part], known[start : start + chunk])
        try:
            with first._errors():
                rows = [
                    (int(oid), int(value)) for oid, value in first.conn.cursor().execute(statement).fetchall()
                ]
        except DbqError:
            out += [None] * len(part)
            continue
        for i in range(0, len(rows), width):
            read = rows[i : i + width]
            out.append(Positions(tuple(v for _, v in read), tuple(o for o, _ in read)))
    return out


def _max_locks_of(ring: OdbcRing) -> int:
    """max_locks_per_transaction of the ring's database, read once."""
    key = ring.settings.odbc()
    if key not in _max_locks:
        with ring._errors():
            _max_locks[key] = int(ring.conn.cursor().execute(ring.sql.MAX_LOCKS).fetchval())
    return _max_locks[key]


def _measured(ring: OdbcRing) -> QueueStats | DbqError:
    """One queue's statistics, or its error; its connection given back at once."""
    try:
        return ring.measure()
    except DbqError as e:
        return e
    finally:
        ring.close()


def record_samples(rings: Sequence[OdbcRing], stats: Sequence[QueueStats],
                   purge: Sequence[tuple[OdbcRing, float]]) -> None:  # fmt: skip
    """One sample of each ring (rings of one schema) in one statement, and the samples past
    the retention of the `purge` ones (ring, retention in seconds) removed, one statement per
    retention; on the first ring's connection."""
    first = rings[0]
    values = [
        v
        for s in stats
        for v in (
            s.depth,
            s.in_flight,
            s.pushed,
            s.popped,
            s.acquired,
            s.expired,
            float(s.oldest_age_seconds),
        )
    ]
    by_retention: dict[int, list[str]] = {}
    for ring, retention_s in purge:
        by_retention.setdefault(int(retention_s), []).append(ring.names.queue)
    with first._errors():
        cur = first.conn.cursor()
        cur.execute(first.sql.record_samples([r.names.queue for r in rings]), *values)
        for retention_s, queues in by_retention.items():
            cur.execute(first.sql.purge_histories(queues), retention_s)


@dataclass(frozen=True)
class CatalogDigests:
    """What a drift check of each queue of a schema reads that can change behind the operator's
    back (`catalog_digests`), and the database's catalog change counters when it was read."""

    changes: str  # the counters: equal, and nothing in the catalog changed since
    own: dict[str, str]  # by queue: its objects' catalog rows
    rest: str  # the schema's row and its schema-wide tables'
    sessions: int | None  # sessions of applications on the operator's login (the check reports it)

    def of(self, queue: str) -> str | None:
        """The queue's digest; None when none of its objects is left (or it has no metadata
        row): check it."""
        own = self.own.get(queue)
        return None if own is None else f"{own}+{self.rest}/{self.sessions}"


def catalog_digests(ring: OdbcRing, kept: CatalogDigests | None = None) -> CatalogDigests | None:
    """The catalog digests of the queues of the ring's schema: equal as long as nothing a drift
    check of a queue reads changed. The database's catalog change counters are read first: when
    they equal those `kept` was read at, nothing in the catalog changed since and its digests are
    kept (an idle database is not read again). Counters reach the statistics a few seconds after
    a commit, so a change may show a read later. None where the database offers no catalog
    digest (SQL Server)."""
    statement, counters = ring.sql.catalog_digests(), ring.sql.CATALOG_CHANGES
    if statement is None or counters is None:
        return None
    with ring._errors():
        cur = ring.conn.cursor()
        changes = str(cur.execute(counters).fetchval())
        if kept is not None and kept.changes == changes:
            own, rest = kept.own, kept.rest
        else:
            queue = ring.names.queue
            suffixes = ",".join(
                name[len(queue) + 1 :]
                for name in (
                    *ring.names.tables,
                    *ring.names.sequences,
                    *(ring.names.routine(r) for r in ring.sql.ROUTINES),
                )
            )
            shared = f"{ring.names.meta},{ring.names.history}"
            own = dict(cur.execute(statement, ring.names.schema, suffixes, shared).fetchall())
            rest = own.pop("", "0")
    return CatalogDigests(changes, own, rest, ring._shared_login_sessions())
