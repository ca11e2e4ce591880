"""What the lease sweep costs a read, against the ring's size.

Since ring schema version 23, `Q_read` sweeps expired leases back at most once a second a queue
(`Q_expire_leases`), so PGMQ's visibility timeout holds without the operator's cleanup. The sweep
scans the ring for leases past their end: its cost grows with the ring's slots, not with the
messages. For each size: a ring of that many slots, a tenth of them holding messages, a hundredth
leased, and the sweep timed with no lease due (what nearly every sweep finds) and with them all
due; then the share of one core a queue's reads spend sweeping while leases are held (a sweep
every second, or every slots/100 ms past 100,000 slots: `sweep_every_ms` of the ring's SQL).

    ~/.cache/dbq/venv/bin/python -m bench.lease_sweep --sizes 10000,100000,1000000
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

SCHEMA = "bench"


def timed(conn: psycopg.Connection, sql: str, rounds: int) -> float:
    """Median milliseconds of `sql`, each call its own transaction."""
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        conn.execute(sql)
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    rows = []
    with scratch_database(stack, "dbq_bench_sweep") as db:
        conn = psycopg.connect(db.admin_url, autocommit=True)
        for size in (int(s) for s in a.sizes.split(",")):
            name = f"r{size}"
            ring = OdbcRing(from_url(db.url), RingTarget(QueueNames(SCHEMA, name), size, 256))
            ring.apply()
            ring.close()
            fn = f"{SCHEMA}.{name}"
            held = size // 10
            for start in range(0, held, 10_000):
                n = min(10_000, held - start)
                conn.execute(f"SELECT count(*) FROM {fn}_send_batch(%s)", ([b"x" * 100] * n,))
            conn.execute(f"SELECT count(*) FROM {fn}_read(%s, 600000)", (size // 100,))  # leased for 10 min
            conn.execute(f"VACUUM ANALYZE {fn}_ring")
            none_due = timed(conn, f"SELECT * FROM {fn}_expire_leases()", a.rounds)
            # every lease due: their ends moved into the past, in place
            conn.execute(f"UPDATE {fn}_ring SET visible_at = now() - interval '1 s' WHERE state = 2")
            started = time.perf_counter()
            swept = conn.execute(f"SELECT o_expired FROM {fn}_expire_leases()").fetchone()
            all_due = (time.perf_counter() - started) * 1000
            rows.append((size, held, size // 100, none_due, int(swept[0]) if swept else 0, all_due))
            conn.execute(f"SELECT {fn}_purge()")
    print(
        f"the lease sweep (Q_expire_leases), median of {a.rounds} calls with no lease due; one call with all due"
    )
    print(f"  {'slots':>9s} {'messages':>9s} {'leased':>7s} {'none due ms':>12s} {'swept':>6s} {'all due ms':>11s}"
          f" {'every ms':>9s} {'core share':>11s}")  # fmt: skip
    for size, held, leased, none_due, swept, all_due in rows:
        every = max(1000, size // 100)
        print(f"  {size:9d} {held:9d} {leased:7d} {none_due:12.2f} {swept:6d} {all_due:11.2f} {every:9d}"
              f" {100 * none_due / every:10.2f}%")  # fmt: skip


if __name__ == "__main__":
    main()
