"""Where a batch's server CPU goes: dbq's batch routines beside a hand-built batch, and beside
the ring's own statements without routines, sequences or counters.

One session a line, one thread, batches of 100 bodies of 300 random bytes; the CPU of that
session's PostgreSQL backend alone (/proc/<pid>/schedstat, nanoseconds), so the WAL writer and
the checkpointer (counted by bench/server_cost.py) are left out. Lines take turns in every round
(--rounds, medians); a message is one pushed and taken.

  hand-built          INSERT of 100 rows, DELETE of the 100 oldest (SKIP LOCKED) RETURNING
  hand-built leased   INSERT of 100 rows, UPDATE of a visibility time on the 100 oldest visible
                      (SKIP LOCKED) RETURNING, DELETE of their ids
  ring statements     the two UPDATEs a ring batch makes, as plain SQL: 100 slots filled, then
                      freed RETURNING their bodies (the slots move on through the ring as
                      positions do); no routine, no position drawn, nothing counted
  positions+counts    what a message's sequences cost alone: 4 nextval a message (a push and a
                      pop position, the pushed and popped totals), as push_many and pop_many
                      draw them
  dbq                 push_many(100) then pop_many(100), through the client (psycopg)
  dbq leased          push_many(100), acquire_many(100), ack_many
  rows                the row contract, as a worker in another language calls it: send_batch(100)
                      then read(100) at most once; parameters and rows in binary, as Go's pgx
                      sends and reads them
  rows, text array    the same with the bodies' array sent as text, as node-postgres sends it
  rows leased         send_batch(100), read(100) with a lease, ack_many of what it read

    ~/.cache/dbq/venv/bin/python -m bench.batch_cost --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

import psycopg
from bench.cpu import backend_ns

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

BATCH = 100
BODY_BYTES = 300
SIZE = 100_000
SCHEMA, QUEUE = "bench", "cost"
TABLE = f"{SCHEMA}.hand_built"
SCRATCH_SEQUENCES = ("scratch_a", "scratch_b", "scratch_c", "scratch_d")  # drawn as a message's 4


def bodies() -> bytes:
    return os.urandom(BODY_BYTES * BATCH)


# The hand-built batch push: the bodies sent as one value and cut apart, as push_many does.
PUSH_100 = (
    f"INSERT INTO {TABLE} (body) SELECT substring(%s::bytea FROM (g - 1) * {BODY_BYTES} + 1 FOR {BODY_BYTES})"
    f" FROM generate_series(1, {BATCH}) g"
)


def hand_built(cur: psycopg.Cursor) -> Callable[[], int]:
    def cycle() -> int:
        cur.execute(PUSH_100, (bodies(),))
        cur.execute(
            f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} ORDER BY id LIMIT {BATCH}"
            " FOR UPDATE SKIP LOCKED) RETURNING id, body"
        )
        return len(cur.fetchall())

    return cycle


def hand_built_leased(cur: psycopg.Cursor) -> Callable[[], int]:
    def cycle() -> int:
        cur.execute(PUSH_100, (bodies(),))
        cur.execute(
            f"UPDATE {TABLE} SET vt = clock_timestamp() + interval '60 seconds' WHERE id IN (SELECT id FROM {TABLE}"
            f" WHERE vt <= clock_timestamp() ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING id, body"
        )
        ids = [row[0] for row in cur.fetchall()]
        cur.execute(f"DELETE FROM {TABLE} WHERE id = ANY (%s)", (ids,))
        return len(ids)

    return cycle


def ring_statements(cur: psycopg.Cursor) -> Callable[[], int]:
    ring = f"{SCHEMA}.{QUEUE}_ring"
    first = [10**9]  # positions of their own, far past the client's, in slots it is not using

    def cycle() -> int:
        start = first[0]
        first[0] += BATCH
        cur.execute(
            f"UPDATE {ring} r SET msg_id = p, state = 1, lease = 0, attempts = 0, pushed_at = clock_timestamp(),"
            f" visible_at = NULL, expires_at = NULL, headers = NULL,"
            f" body = substring(%s::bytea FROM ((p - %s) * {BODY_BYTES} + 1)::int FOR {BODY_BYTES})"
            f" FROM generate_series(%s::bigint, %s::bigint + {BATCH - 1}) p"
            f" WHERE r.slot = (p + {SIZE // 2}) %% {SIZE} AND r.state = 0",
            (bodies(), start, start, start),
        )
        cur.execute(
            f"UPDATE {ring} r SET state = 0 FROM generate_series(%s::bigint, %s::bigint + {BATCH - 1}) p"
            f" WHERE r.slot = (p + {SIZE // 2}) %% {SIZE} AND r.msg_id = p AND r.state = 1 RETURNING r.msg_id, r.body",
            (start, start),
        )
        return len(cur.fetchall())

    return cycle


def positions_and_counts(cur: psycopg.Cursor) -> Callable[[], int]:
    seqs = ", ".join(f"nextval('{SCHEMA}.{s}')" for s in SCRATCH_SEQUENCES)

    def cycle() -> int:
        cur.execute(f"SELECT {seqs} FROM generate_series(1, {BATCH})")
        return len(cur.fetchall())

    return cycle


def dbq(q: Queue) -> Callable[[], int]:
    def cycle() -> int:
        q.push_many([os.urandom(BODY_BYTES) for _ in range(BATCH)])
        return len(q.pop_many(BATCH, timeout=0))

    return cycle


def dbq_leased(q: Queue) -> Callable[[], int]:
    def cycle() -> int:
        q.push_many([os.urandom(BODY_BYTES) for _ in range(BATCH)])
        taken = q.acquire_many(BATCH, timeout=0)
        if taken:
            q.ack_many(taken)
        return len(taken)

    return cycle


def rows(cur: psycopg.Cursor, marker: str = "%b") -> Callable[[], int]:
    fn = f"{SCHEMA}.{QUEUE}"

    def cycle() -> int:
        cur.execute(
            f"SELECT * FROM {fn}_send_batch({marker})", ([os.urandom(BODY_BYTES) for _ in range(BATCH)],)
        )
        cur.execute(f"SELECT * FROM {fn}_read(%s, 0)", (BATCH,), binary=True)
        return len(cur.fetchall())

    return cycle


def rows_text_array(cur: psycopg.Cursor) -> Callable[[], int]:
    return rows(cur, "%t")


def rows_leased(cur: psycopg.Cursor) -> Callable[[], int]:
    fn = f"{SCHEMA}.{QUEUE}"

    def cycle() -> int:
        cur.execute(f"SELECT * FROM {fn}_send_batch(%b)", ([os.urandom(BODY_BYTES) for _ in range(BATCH)],))
        taken = cur.execute(
            f"SELECT msg_id, lease FROM {fn}_read(%s, 60000)", (BATCH,), binary=True
        ).fetchall()
        if taken:
            ids, leases = ",".join(str(r[0]) for r in taken), ",".join(str(r[1]) for r in taken)
            cur.execute(f"SELECT {fn}_ack_many(%s, %s)", (ids, leases))
        return len(taken)

    return cycle


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batches", type=int, default=200, help="batches a line runs in each round")
    a = p.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    with scratch_database(stack, "dbq_bench_batch") as db:
        OdbcRing(from_url(db.url), RingTarget(QueueNames(SCHEMA, QUEUE), SIZE, BODY_BYTES)).apply()
        admin = psycopg.connect(db.admin_url, autocommit=True)
        admin.execute(
            f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, body bytea NOT NULL,"
            " vt timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        for s in SCRATCH_SEQUENCES:
            admin.execute(f"CREATE SEQUENCE {SCHEMA}.{s} CACHE 1")
        admin.execute(f"VACUUM ANALYZE {SCHEMA}.{QUEUE}_ring")

        def session() -> tuple[psycopg.Cursor, int]:
            conn = psycopg.connect(db.admin_url, autocommit=True)
            return conn.cursor(), int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]

        lines: dict[str, tuple[Callable[[], int], int]] = {}
        for name, make in (("hand-built", hand_built), ("hand-built leased", hand_built_leased),
                           ("ring statements", ring_statements), ("positions+counts", positions_and_counts),
                           ("rows", rows), ("rows, text array", rows_text_array), ("rows leased", rows_leased)):  # fmt: skip
            cur, pid = session()
            lines[name] = (make(cur), pid)
        for name, make_q in (("dbq", dbq), ("dbq leased", dbq_leased)):
            q = connect(db.url, QUEUE, schema=SCHEMA, pool_size=1, notify=False, smart_batching=False)
            q.push(b"x")
            q.pop(timeout=0)  # the pool's one session is open now
            pid = int(admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'dbq-client'"
                " AND pid NOT IN (SELECT unnest(%s::int[]))", ([p for _, p in lines.values()],)
            ).fetchone()[0])  # type: ignore[index]  # fmt: skip
            lines[name] = (make_q(q), pid)
        spent: dict[str, list[float]] = {name: [] for name in lines}
        for cycle, _ in lines.values():
            for _ in range(10):  # plans made, caches warm
                cycle()
        for _ in range(a.rounds):
            for name, (cycle, pid) in lines.items():
                before = backend_ns(pid)
                messages = sum(cycle() for _ in range(a.batches))
                spent[name].append((backend_ns(pid) - before) / messages / 1000)
            admin.execute(f"VACUUM {TABLE}")
    print(f"backend CPU a message (us), batches of {BATCH}, {BODY_BYTES}-byte bodies, one session a line,"
          f" {a.batches} batches a line a round, medians of {a.rounds} rounds taken in turns")  # fmt: skip
    median = {name: statistics.median(v) for name, v in spent.items()}
    for name, v in spent.items():
        print(f"  {name:18s} {median[name]:6.1f}   ({min(v):.1f}-{max(v):.1f})")
    print(f"  dbq / hand-built {median['dbq'] / median['hand-built']:.2f} x;"
          f" dbq leased / hand-built leased {median['dbq leased'] / median['hand-built leased']:.2f} x;"
          f" ring statements / hand-built {median['ring statements'] / median['hand-built']:.2f} x")  # fmt: skip
    print(f"  rows / dbq {median['rows'] / median['dbq']:.2f} x;"
          f" rows leased / dbq leased {median['rows leased'] / median['dbq leased']:.2f} x")  # fmt: skip


if __name__ == "__main__":
    main()
