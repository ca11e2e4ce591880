"""Smart batching of single push() calls, off and on, beside the commit ceiling of the same run.

For 1, 4, 16 and 64 threads of one process, each calling push() one message at a time for
--seconds: messages/s and the latency of a call (p50, p99), with smart batching off and on, on a
ring (PostgreSQL) and on pipes (Cassandra). The ceiling: 16 threads each committing a one-row
UPDATE of its own row, as fast as they can (PostgreSQL). After each run the queue is drained and
counted: every id a caller got is a message stored, once.

Only push() coalesces so far (issue 21's first part); pop(), acquire() and ack() do not yet.

    ~/.cache/dbq/venv/bin/python -m bench.smart_batching --seconds 3
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyodbc

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.client import connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

THREADS = (1, 4, 16, 64)
BODY = b"m" * 100


def ceiling(odbc: str, seconds: float, threads: int = 16) -> float:
    cur = pyodbc.connect(odbc, autocommit=True).cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS public.ceiling (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    cur.execute(
        "INSERT INTO public.ceiling (id) SELECT g FROM generate_series(0, 63) g ON CONFLICT DO NOTHING"
    )
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def bump(i: int) -> None:
        c = pyodbc.connect(odbc, autocommit=True).cursor()
        while time.monotonic() < stop:
            c.execute("UPDATE public.ceiling SET n = n + 1 WHERE id = ?", i)
            counts[i] += 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(bump, range(threads)))
    return sum(counts) / seconds


def push_run(q: Any, threads: int, seconds: float) -> tuple[float, float, float, list[Any]]:
    """messages/s, p50 and p99 of a call (ms), and the ids the callers got."""
    stop = time.monotonic() + seconds
    ids: list[list[Any]] = [[] for _ in range(threads)]
    lat: list[list[float]] = [[] for _ in range(threads)]

    def pusher(i: int) -> None:
        while time.monotonic() < stop:
            t = time.perf_counter()
            ids[i].append(q.push(BODY))
            lat[i].append(time.perf_counter() - t)

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(pusher, range(threads)))
    elapsed = time.monotonic() - started
    got = [i for part in ids for i in part]
    ms = sorted(v * 1000 for part in lat for v in part)
    return len(got) / elapsed, statistics.median(ms), ms[int(len(ms) * 0.99)], got


def drain_exactly(q: Any, ids: list[Any]) -> None:
    taken: list[Any] = []
    while True:
        got = q.pop_many(500, timeout=0.5)
        if not got:
            break
        taken += [m.id for m in got]
    assert len(taken) == len(ids) and set(taken) == set(ids), (len(taken), len(ids))


def measure(label: str, make: Any, seconds: float, rows: list[str]) -> None:
    """Off and on take turns at each thread count, each with a client of its own, so that what
    the queue has been through (tombstones, vacuum) weighs on both alike."""
    for threads in THREADS:
        for smart in (False, True):
            q = make(smart)
            rate, p50, p99, ids = push_run(q, threads, seconds)
            drain_exactly(q, ids)
            trips = q._pushes.round_trips if q._pushes is not None else len(ids)
            rows.append(
                f"  {label:5s} {'on ' if smart else 'off'} {threads:3d} threads  {rate:8.0f} msg/s"
                f"  p50 {p50:6.2f} ms  p99 {p99:7.2f} ms  {len(ids) / max(trips, 1):6.1f} pushes a round trip"
            )
            q.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    opts = parser.parse_args()
    stack = Stack()
    stack.up(("postgres", "cassandra"))
    rows: list[str] = []
    with scratch_database(stack, "dbq_bench_sb") as postgres:
        top = ceiling(postgres.odbc, opts.seconds)
        name = f"q_{secrets.token_hex(3)}"
        OdbcRing(from_url(postgres.url), RingTarget(QueueNames("bench", name), 200_000, 128)).apply()
        measure("ring", lambda smart: connect(postgres.url, name, schema="bench", smart_batching=smart,
                                              pool_size=64), opts.seconds, rows)  # fmt: skip
    host, port = stack.cassandra.contact
    keyspace, name = f"bench_{secrets.token_hex(3)}", f"q_{secrets.token_hex(3)}"
    url = f"cassandra://{host}:{port}"
    spec = QueueSpec.model_validate(
        {
            "backend": "cassandra",
            "design": "pipes",
            "connection": {"secretRef": {"name": "s"}, "schema": keyspace},
        }
    )
    backend = open_backend(spec, name, from_url(url))
    backend.apply()
    try:
        measure("pipes", lambda smart: connect(url, name, schema=keyspace, smart_batching=smart, pop_timeout=0),
                opts.seconds, rows)  # fmt: skip
    finally:
        backend.teardown()
        backend.close()
    print(f"push() one message a call, {opts.seconds:g} s a run, bodies of {len(BODY)} bytes")
    print(f"  commit ceiling (PostgreSQL, 16 threads, one-row UPDATE a transaction): {top:.0f}/s")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
