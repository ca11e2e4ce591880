"""What provisioning one ring queue costs PostgreSQL: its plan's statements sent one by one
(each its own round trip, which psqlODBC wraps in a savepoint) against all in one round trip
(`PgRing.batches`, what the operator does).

Each round provisions --queues new 64-slot queues, each in a schema of its own (as
bench/control_plane.py does), in one transaction per queue; the two ways take turns, twice each,
so a drift of the machine weighs on both alike. Printed: p50 and p95 per queue.

    ~/.cache/dbq/venv/bin/python -m bench.provision_cost
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import pyodbc

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database


def provision(url: str, odbc: str, one_batch: bool) -> tuple[float, int]:
    """Seconds to provision one new queue, and how many statements that took."""
    ring = OdbcRing(from_url(url), RingTarget(QueueNames(f"p_{secrets.token_hex(4)}", "q"), 64, 128))
    statements = [s for step in ring.plan(ring.observe()) for s in ring.sql.render(step)]
    ring.close()
    conn = pyodbc.connect(odbc, autocommit=False)
    cur = conn.cursor()
    started = time.perf_counter()
    for batch in ring.sql.batches(statements) if one_batch else statements:
        cur.execute(batch)
    conn.commit()
    took = time.perf_counter() - started
    conn.close()
    return took, len(statements)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queues", type=int, default=50, help="queues per round")
    opts = parser.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    with scratch_database(stack, "dbq_bench_provision") as postgres:
        times: dict[str, list[float]] = {"one by one": [], "one batch": []}
        statements = 0
        for one_batch in (False, True, True, False):
            label = "one batch" if one_batch else "one by one"
            for _ in range(opts.queues):
                took, statements = provision(postgres.url, postgres.odbc, one_batch)
                times[label].append(took)
    print(
        f"provisioning a 64-slot ring queue in a new schema ({statements} statements), {2 * opts.queues} queues each way"
    )
    for label, values in times.items():
        ms = sorted(v * 1000 for v in values)
        print(f"  {label:10s}  p50 {statistics.median(ms):6.1f} ms  p95 {ms[int(len(ms) * 0.95)]:6.1f} ms")
    ratio = statistics.median(times["one by one"]) / statistics.median(times["one batch"])
    print(f"  one by one / one batch (p50): {ratio:.2f}x")


if __name__ == "__main__":
    main()
