"""What stats() and the drift timer's observe() cost as a ring grows: 100,000, 1,000,000 and
10,000,000 slots (PostgreSQL).

For each size: a ring is provisioned, given a known workload (pushes, acquires, acks, nacks and
pops), then stats() and observe() are timed (p50, p95 over --calls calls). The baseline is the
count of the ring's rows that stats() made up to ring schema version 6, timed on the same ring
in the same run; its answer is also the truth that stats() must equal, figure for figure.

    ~/.cache/dbq/venv/bin/python -m bench.stats_cost
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

SIZES = (100_000, 1_000_000, 10_000_000)


def timed(call: Callable[[], Any], times: int) -> tuple[float, float, Any]:
    """p50 and p95 of a call in ms, and its last answer."""
    took, answer = [], None
    for _ in range(times):
        started = time.perf_counter()
        answer = call()
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.95)], answer


def workload(q: Queue) -> None:
    """5,000 pushed; 700 acquired, of which 300 acked and 100 nacked; 1,000 popped."""
    for start in range(0, 5000, 500):
        q.push_many([b"m%05d" % i for i in range(start, start + 500)])
    held = q.acquire_many(700)
    assert len(held) == 700
    q.ack_many(held[:300])
    for m in held[300:400]:
        m.nack()
    popped = 0
    while popped < 1000:
        popped += len(q.pop_many(min(500, 1000 - popped)))


def counted(q: Queue) -> tuple[int, int, float]:
    """Depth, in flight and the oldest ready message's age by counting rows (version 6's way)."""
    ring, spill = q.names.ring, q.names.spill
    with q._cursor() as cur:
        row = cur.execute(
            f"""SELECT
  (SELECT count(*) FROM "{q.names.schema}".{ring} WHERE state = 1) + (SELECT count(*) FROM "{q.names.schema}".{spill} WHERE state = 1),
  (SELECT count(*) FROM "{q.names.schema}".{ring} WHERE state = 2) + (SELECT count(*) FROM "{q.names.schema}".{spill} WHERE state = 2),
  extract(epoch FROM clock_timestamp() - least(
    (SELECT min(pushed_at) FROM "{q.names.schema}".{ring} WHERE state = 1),
    (SELECT min(pushed_at) FROM "{q.names.schema}".{spill} WHERE state = 1)))"""
        ).fetchone()
    return int(row[0]), int(row[1]), float(row[2] or 0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    opts = parser.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    rows = []
    with scratch_database(stack, "dbq_bench_stats") as postgres:
        settings = from_url(postgres.url)
        for size in opts.sizes:
            name = f"s_{secrets.token_hex(3)}"
            backend = OdbcRing(settings, RingTarget(QueueNames("bench", name), size, 16))
            started = time.monotonic()
            backend.apply()
            built = time.monotonic() - started
            q = connect(postgres.url, name, schema="bench", smart_batching=False)
            assert isinstance(q, Queue)
            workload(q)
            stats_p50, stats_p95, stats = timed(q.stats, opts.calls)
            observe_p50, observe_p95, _ = timed(backend.observe, max(opts.calls // 4, 1))
            count_p50, _, _ = timed(lambda q=q: counted(q), 5)
            # The truth, right after stats(): the oldest message's push time must agree (ages
            # grow while the count runs, so compare the instants they point at).
            stats = q.stats()
            stats_at = time.time()
            depth, in_flight, oldest = counted(q)
            counted_at = time.time()
            exact = (stats.depth, stats.in_flight) == (depth, in_flight) == (3400, 300)
            exact = exact and (stats.pushed, stats.popped, stats.acquired) == (5000, 1300, 700)
            assert exact, (stats, depth, in_flight)
            pushed_at = (stats_at - stats.oldest_age_seconds, counted_at - oldest)
            assert abs(pushed_at[0] - pushed_at[1]) < counted_at - stats_at + 0.1, pushed_at
            rows.append(
                f"  {size:>10,} slots (built in {built:5.1f} s)  stats p50 {stats_p50:6.2f} ms p95 {stats_p95:6.2f} ms"
                f"  observe p50 {observe_p50:6.2f} ms p95 {observe_p95:6.2f} ms"
                f"  | counting rows p50 {count_p50:9.2f} ms ({count_p50 / stats_p50:7.1f} x stats)"
                f"  exact: depth {stats.depth} in flight {stats.in_flight}"
            )
            q.close()
            backend.teardown()
            backend.close()
    print("stats() and observe() by ring size; baseline: counting the ring's rows (version 6's stats)")
    print(f"  {opts.calls} stats calls, {max(opts.calls // 4, 1)} observe calls, 5 counts, per size")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
