"""What a delivered message costs PostgreSQL: dbq's ring beside a hand-built SKIP LOCKED queue.

Per message pushed and taken, on each path, measured over the same number of messages for both:
- pop:     push() then pop() (at most once); baseline INSERT, then DELETE of the oldest row
           (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING;
- leased:  push(), acquire(), ack() (at least once); baseline INSERT, an UPDATE setting a
           visibility time on the oldest visible row (SKIP LOCKED) RETURNING, then DELETE by id
           (what PGMQ's send/read/delete do);
- batch:   push_many(100) then pop_many(100); baseline one INSERT of 100 rows, one DELETE of the
           100 oldest (SKIP LOCKED) RETURNING;
- lbatch:  leased batches: push_many(100), acquire_many(100), ack_many; baseline one INSERT of 100
           rows, an UPDATE setting a visibility time on the 100 oldest visible rows (SKIP LOCKED)
           RETURNING, then one DELETE of their ids (what PGMQ's send_batch/read/delete do).
Bodies of 300 random bytes (a new one each message), --workers threads each with its own connection, each doing whole cycles.
The ring at 10,000, 100,000 and 1,000,000 slots (the baseline's table has no size: it runs beside
each). Every run starts right after a CHECKPOINT and has another half-way, so the full-page
images a first touch after a checkpoint writes are counted, as a production server's periodic
checkpoints would cause them.

The figures: WAL bytes (pg_current_wal_lsn), of them full-page images and the rest (pg_waldump
--stats over the run's WAL, kept meanwhile by a replication slot), buffers written (pg_stat_bgwriter: by checkpoints, the background writer and backends), all a message;
and PostgreSQL's CPU a message: every postgres process (sessions, WAL writer, checkpointer), from
/proc. The line of each path ends with dbq / baseline for WAL, WAL without full-page images, and
CPU. Then where the WAL went: bytes a message by record type, full-page images apart.

    ~/.cache/dbq/venv/bin/python -m bench.server_cost --messages 20000
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pyodbc
from bench.cpu import cpu_of_programs
from bench.ring_vs_skiplocked import BATCH, SCHEMA, admin, bench_database

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames

SIZES = (10_000, 100_000, 1_000_000)
PATHS = ("pop", "leased", "batch", "lbatch")
BODY_BYTES = 300
SLOT = "dbq_bench_server_cost"  # keeps the runs' WAL until pg_waldump has read it
TABLE = f"{SCHEMA}.sl_queue"
BASELINE = {
    "push": f"INSERT INTO {TABLE} (body) VALUES (?)",
    # the bodies sent as one value and cut apart, as the ring's push_many does
    "push_many": f"INSERT INTO {TABLE} (body) SELECT substring(?::bytea FROM (g - 1) * {BODY_BYTES} + 1 FOR {BODY_BYTES})"
    f" FROM generate_series(1, {BATCH}) g",
    "pop": f"DELETE FROM {TABLE} WHERE id = (SELECT id FROM {TABLE} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
    " RETURNING id, body",
    "read": f"UPDATE {TABLE} SET vt = clock_timestamp() + interval '60 seconds' WHERE id = (SELECT id FROM {TABLE}"
    " WHERE vt <= clock_timestamp() ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, body",
    "delete": f"DELETE FROM {TABLE} WHERE id = ?",
    "pop_many": f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} ORDER BY id LIMIT {BATCH}"
    " FOR UPDATE SKIP LOCKED) RETURNING id, body",
    "read_many": f"UPDATE {TABLE} SET vt = clock_timestamp() + interval '60 seconds' WHERE id IN (SELECT id"
    f" FROM {TABLE} WHERE vt <= clock_timestamp() ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING id, body",
    # the ids as one array, as the ring's ack_many takes them
    "delete_many": f"DELETE FROM {TABLE} WHERE id = ANY (string_to_array(?, ',')::bigint[])",
}


def body() -> bytes:
    return os.urandom(BODY_BYTES)


@dataclass
class Cost:
    messages: int
    wal_bytes: float
    buffers: float
    cpu_s: float
    records: Counter[str]  # WAL bytes by record type, full-page images left out
    fpi_bytes: int

    def per_message(self) -> tuple[float, float, float, float, float]:
        """WAL, of it full-page images and the rest (bytes), buffers written, CPU (us)."""
        n = self.messages
        rest = self.wal_bytes - self.fpi_bytes
        return self.wal_bytes / n, self.fpi_bytes / n, rest / n, self.buffers / n, self.cpu_s / n * 1e6

    def where_wal_went(self) -> str:
        n = self.messages
        shown = [f"{name} {size / n:.0f}" for name, size in self.records.most_common() if size / n >= 1]
        return ", ".join([*shown, f"full-page images {self.fpi_bytes / n:.0f}"])


def server_counters(cur: pyodbc.Cursor) -> tuple[str, int]:
    lsn = cur.execute("SELECT pg_current_wal_lsn()::text").fetchval()
    written = cur.execute("SELECT buffers_checkpoint + buffers_clean + buffers_backend FROM pg_stat_bgwriter")
    return lsn, int(written.fetchval())


def wal_records(wal_dir: str, start: str, end: str) -> tuple[Counter[str], int]:
    """WAL bytes by record type between two positions, without full-page images, and the bytes
    of full-page images (pg_waldump --stats=record)."""
    waldump = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_waldump"))[-1]
    out = subprocess.run([waldump, "--stats=record", "-p", wal_dir, "-s", start, "-e", end],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    records: Counter[str] = Counter()
    fpi = 0
    number = r"(\d+)\s+\(\s*[\d.]+\)"
    for name, _, size, fpi_size in re.findall(rf"^(\S+)\s+{number}\s+{number}\s+{number}", out, re.M):
        records[name] += int(size)
        fpi += int(fpi_size)
    return records, fpi


def rows_of(cur: pyodbc.Cursor, statement: str) -> list[pyodbc.Row]:
    """The rows a RETURNING statement answered; psqlODBC raises "No results" when it matched none."""
    try:
        return cur.execute(statement).fetchall()
    except pyodbc.ProgrammingError:
        return []


def baseline_cycle(odbc: str, path: str) -> Callable[[], int]:
    cur = pyodbc.connect(odbc, autocommit=True).cursor()

    def pop() -> int:
        cur.execute(BASELINE["push"], body())
        return len(rows_of(cur, BASELINE["pop"]))

    def leased() -> int:
        cur.execute(BASELINE["push"], body())
        rows = rows_of(cur, BASELINE["read"])
        for row in rows:
            cur.execute(BASELINE["delete"], row[0])
        return len(rows)

    def batch() -> int:
        cur.execute(BASELINE["push_many"], b"".join(body() for _ in range(BATCH)))
        return len(rows_of(cur, BASELINE["pop_many"]))

    def leased_batch() -> int:
        cur.execute(BASELINE["push_many"], b"".join(body() for _ in range(BATCH)))
        rows = rows_of(cur, BASELINE["read_many"])
        if rows:
            cur.execute(BASELINE["delete_many"], ",".join(str(row[0]) for row in rows))
        return len(rows)

    return {"pop": pop, "leased": leased, "batch": batch, "lbatch": leased_batch}[path]


def ring_cycle(q: Queue, path: str) -> Callable[[], int]:
    def leased() -> int:
        q.push(body())
        m = q.acquire(timeout=0)
        if m is None:
            return 0
        m.ack()
        return 1

    def leased_batch() -> int:
        q.push_many([body() for _ in range(BATCH)])
        taken = q.acquire_many(BATCH, timeout=0)
        if taken:
            q.ack_many(taken)
        return len(taken)

    return {
        "pop": lambda: (q.push(body()), q.pop(timeout=0) is not None)[1],
        "leased": leased,
        "batch": lambda: (q.push_many([body() for _ in range(BATCH)]), len(q.pop_many(BATCH, timeout=0)))[1],
        "lbatch": leased_batch,
    }[path]


def run(cycles: list[Callable[[], int]], messages: int, admin_cur: pyodbc.Cursor, wal_dir: str) -> Cost:
    """The cycles' threads until `messages` are delivered, a CHECKPOINT before and half-way."""
    admin_cur.execute("CHECKPOINT")
    lsn, written = server_counters(admin_cur)
    cpu = cpu_of_programs(["postgres"])["postgres"]
    delivered = [0] * len(cycles)
    halfway = threading.Event()

    def loop(i: int, cycle: Callable[[], int]) -> None:
        while sum(delivered) < messages:
            delivered[i] += cycle()
            if not halfway.is_set() and sum(delivered) >= messages / 2:
                halfway.set()

    threads = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(cycles)]
    for t in threads:
        t.start()
    halfway.wait()
    admin_cur.execute("CHECKPOINT")
    for t in threads:
        t.join()
    cpu = cpu_of_programs(["postgres"])["postgres"] - cpu
    end_lsn, end_written = server_counters(admin_cur)
    wal = int(admin_cur.execute("SELECT pg_wal_lsn_diff(?, ?)", end_lsn, lsn).fetchval())
    records, fpi = wal_records(wal_dir, lsn, end_lsn)
    return Cost(sum(delivered), wal, end_written - written, cpu, records, fpi)


def fresh_baseline(cur: pyodbc.Cursor) -> None:
    cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
    cur.execute(
        f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, body bytea NOT NULL,"
        " vt timestamptz NOT NULL DEFAULT clock_timestamp(), created_at timestamptz NOT NULL DEFAULT now())"
    )


def measure(a: argparse.Namespace, url: str, odbc: str, cur: pyodbc.Cursor, wal_dir: str) -> None:
    print(f"per message delivered, {BODY_BYTES}-byte bodies, {a.workers} workers, {a.messages:,} messages a run,"
          " a CHECKPOINT before each run and half-way")  # fmt: skip
    print(f"  {'ring slots':>10} {'path':6} {'system':8} {'WAL B':>7} {'FPI B':>7} {'rest B':>7}"
          f" {'buffers':>8} {'CPU us':>7}")  # fmt: skip
    for size in (int(s) for s in a.sizes.split(",")):
        queue = f"cost_{size}"
        backend = OdbcRing(from_url(url), RingTarget(QueueNames(SCHEMA, queue), size, BODY_BYTES))
        backend.apply()
        cur.execute(f"VACUUM ANALYZE {SCHEMA}.{queue}_ring")
        for path in a.paths.split(","):  # checked in main
            fresh_baseline(cur)
            baseline = run([baseline_cycle(odbc, path) for _ in range(a.workers)], a.messages, cur, wal_dir)
            clients = [
                connect(url, queue, schema=SCHEMA, pool_size=1, notify=False, smart_batching=False)
                for _ in range(a.workers)
            ]
            ring = run([ring_cycle(q, path) for q in clients], a.messages, cur, wal_dir)
            for q in clients:
                q.close()
            for system, cost in (("baseline", baseline), ("dbq", ring)):
                wal, fpi, rest, buffers, cpu = cost.per_message()
                print(f"  {size:>10,} {path:6} {system:8} {wal:7.0f} {fpi:7.0f} {rest:7.0f} {buffers:8.3f} {cpu:7.1f}",
                      flush=True)  # fmt: skip
            (rw, _, rr, _, rc), (bw, _, br, _, bc) = ring.per_message(), baseline.per_message()
            print(f"  {size:>10,} {path:6} dbq / baseline: WAL {rw / bw:.2f} x, without full-page images"
                  f" {rr / br:.2f} x, CPU {rc / bc:.2f} x", flush=True)  # fmt: skip
            for system, cost in (("baseline", baseline), ("dbq", ring)):
                print(f"      {system} WAL, bytes a message: {cost.where_wal_went()}", flush=True)
        backend.teardown()
        backend.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20_000, help="messages delivered in each run")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    p.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)}")
    a = p.parse_args()
    if unknown := set(a.paths.split(",")) - set(PATHS):
        p.error(f"--paths: {', '.join(sorted(unknown))} is not a path; pick from {', '.join(PATHS)}")
    pg, url, odbc = bench_database()
    cur = admin(odbc)
    cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    cur.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ?", SLOT
    )
    cur.execute("SELECT pg_create_physical_replication_slot(?, true)", SLOT)
    try:
        measure(a, url, odbc, cur, str(pg.data / "pg_wal"))
    finally:
        cur.execute("SELECT pg_drop_replication_slot(?)", SLOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
