"""Data-plane benchmark on the local Cassandra: dbq pipes against a naive single-partition queue.

Both designs run in the same session of the same node, through the same driver, with bodies of
the same size, at the same concurrency (--pushers pusher and --poppers popper processes):

- naive: one partition, one row per message clustered by time UUID. Push is an INSERT; pop reads
  the head (LIMIT 1) and claims it with DELETE ... IF EXISTS (a lightweight transaction, so two
  poppers never take the same message). Every popped message leaves a tombstone at the head.
- pipes: the dbq client, push() and pop() (at-most-once), one message per call.

Printed: messages delivered per second for each design and their ratio; each design's pop
latency (p50, p99) in the first and last fifth of its run. Then reads at the head after many
messages passed through one queue: pop latency with a 1,000-message backlog before and after
--passage messages (pipes; through push_many/pop_many) and --naive-passage (naive; the rows are
written and deleted one by one, as pops would).

    ~/.cache/dbq/venv/bin/python bench/pipes_vs_naive.py
    ~/.cache/dbq/venv/bin/python bench/pipes_vs_naive.py --seconds 10 --passage 50000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
import uuid
from typing import Any

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.client import PipesQueue, connect
from dbq.connection import from_url
from dbq.devstack import Stack

KEYSPACE = "dbq_bench"
BODY = b"m" * 300


def url() -> str:
    return Stack().cassandra.url()


def session() -> Any:
    from dbq.connection.cassandra import open_session

    return open_session(from_url(url()))[1]


NAIVE = f'"{KEYSPACE}".naive'


def naive_setup(s: Any, table: str = NAIVE) -> None:
    s.execute(f"DROP TABLE IF EXISTS {table}")
    s.execute(f"CREATE TABLE {table} (k int, msg timeuuid, body blob, PRIMARY KEY ((k), msg))")


def pipes_setup(name: str) -> None:
    spec = QueueSpec.model_validate(
        {
            "backend": "cassandra",
            "design": "pipes",
            "connection": {"secretRef": {"name": "x"}, "schema": KEYSPACE},
        }
    )
    backend = open_backend(spec, name, from_url(url()))
    backend.teardown()
    backend.apply()
    backend.close()


# --- workers ---------------------------------------------------------------------------------------


def pusher(design: str, queue: str, stop: Any, count: Any) -> None:
    if design == "pipes":
        q = connect(url(), queue, schema=KEYSPACE)
        assert isinstance(q, PipesQueue)
        while not stop.is_set():
            q.push(BODY)
            count.value += 1
        q.close()
        return
    s = session()
    insert = s.prepare(f"INSERT INTO {NAIVE} (k, msg, body) VALUES (0, ?, ?)")
    while not stop.is_set():
        s.execute(insert, (uuid.uuid1(), BODY))
        count.value += 1


def popper(design: str, queue: str, stop: Any, count: Any, out: Any) -> None:
    samples: list[tuple[float, float]] = []  # (when, seconds the pop took)
    if design == "pipes":
        q = connect(url(), queue, schema=KEYSPACE)
        assert isinstance(q, PipesQueue)
        while not stop.is_set():
            t = time.perf_counter()
            if q.pop(timeout=0.5) is not None:
                samples.append((time.time(), time.perf_counter() - t))
                count.value += 1
        q.close()
    else:
        s = session()
        head = s.prepare(f"SELECT msg FROM {NAIVE} WHERE k = 0 LIMIT 1")
        claim = s.prepare(f"DELETE FROM {NAIVE} WHERE k = 0 AND msg = ? IF EXISTS")
        while not stop.is_set():
            t = time.perf_counter()
            while not stop.is_set():
                rows = s.execute(head).all()
                if rows and s.execute(claim, (rows[0][0],)).was_applied:
                    samples.append((time.time(), time.perf_counter() - t))
                    count.value += 1
                    break
    out.put(samples)


def run(design: str, queue: str, seconds: float, pushers: int, poppers: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    out = ctx.Queue()
    pushed = [ctx.Value("q", 0, lock=False) for _ in range(pushers)]
    popped = [ctx.Value("q", 0, lock=False) for _ in range(poppers)]
    procs = [ctx.Process(target=pusher, args=(design, queue, stop, c)) for c in pushed]
    procs += [ctx.Process(target=popper, args=(design, queue, stop, c, out)) for c in popped]
    for p in procs:
        p.start()
    time.sleep(3)  # connect and prepare
    start_pops = sum(c.value for c in popped)
    start_pushes = sum(c.value for c in pushed)
    started = time.time()
    time.sleep(seconds)
    pops = sum(c.value for c in popped) - start_pops
    pushes = sum(c.value for c in pushed) - start_pushes
    stop.set()
    samples = [x for _ in range(poppers) for x in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    fifth = seconds / 5
    first = sorted(d for t, d in samples if started <= t < started + fifth)
    last = sorted(d for t, d in samples if started + seconds - fifth <= t < started + seconds)
    return {
        "pops": pops / seconds,
        "pushes": pushes / seconds,
        "first": (pct(first, 50), pct(first, 99)),
        "last": (pct(last, 50), pct(last, 99)),
    }


def pct(values: list[float], p: int) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * p / 100))] * 1000


# --- head reads after a long passage -----------------------------------------------------------


def tombstones(s: Any, table: str) -> str:
    """Tombstones the node scanned per read of `table` (its own histogram, recent reads)."""
    row = s.execute(
        "SELECT p50th, p99th, max FROM system_views.tombstones_per_read WHERE keyspace_name = %s AND table_name = %s",
        (KEYSPACE, table),
    ).one()
    return "n/a" if row is None else f"p50 {row[0]:,.0f}, p99 {row[1]:,.0f}, max {row[2]:,.0f}"


def settle(s: Any, timeout: float = 180) -> float:
    """Wait until the node runs no compaction on the keyspace; seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        tasks = s.execute("SELECT keyspace_name FROM system_views.sstable_tasks").all()
        if not any(t[0] == KEYSPACE for t in tasks):
            break
        time.sleep(1)
    return time.monotonic() - started


def pop_latency(pop: Any, n: int = 300) -> float:
    took = []
    for _ in range(n):
        t = time.perf_counter()
        assert pop(), "the backlog ran dry"
        took.append(time.perf_counter() - t)
    return statistics.median(took) * 1000


def pipes_passage(queue: str, passage: int) -> tuple[float, float, float, float, float]:
    q = connect(url(), queue, schema=KEYSPACE)
    assert isinstance(q, PipesQueue)
    q.push_many([BODY] * 1000)
    before = pop_latency(lambda: q.pop(timeout=1) is not None)
    started = time.perf_counter()
    moved = 0
    while moved < passage:
        q.push_many([BODY] * 500)
        left = 500
        while left:
            got = len(q.pop_many(left, timeout=5))
            assert got, "messages pushed could not be popped"
            left -= got
        moved += 500
        if moved % 100_000 == 0:
            q.repair()  # the operator's cleanup: retire drained pipes
    took = time.perf_counter() - started
    q.repair()
    q.push_many([BODY] * 2000)
    right_after = pop_latency(lambda: q.pop(timeout=1) is not None)
    waited = settle(q.session)
    after = pop_latency(lambda: q.pop(timeout=1) is not None)
    q.close()
    return before, right_after, after, waited, moved / took


def naive_passage(passage: int) -> tuple[float, float]:
    s = session()
    naive_setup(s)
    insert = s.prepare(f"INSERT INTO {NAIVE} (k, msg, body) VALUES (0, ?, ?)")
    head = s.prepare(f"SELECT msg FROM {NAIVE} WHERE k = 0 LIMIT 1")
    delete = s.prepare(f"DELETE FROM {NAIVE} WHERE k = 0 AND msg = ?")

    def pop() -> bool:
        rows = s.execute(head).all()
        if rows:
            s.execute(delete, (rows[0][0],))
        return bool(rows)

    def backlog() -> None:
        for _ in range(10):
            futures = [s.execute_async(insert, (uuid.uuid1(), BODY)) for _i in range(100)]
            for f in futures:
                f.result()

    backlog()
    before = pop_latency(pop)
    while pop():  # the rest of the backlog goes as pops would take it
        pass
    for _ in range(0, passage, 200):  # written and deleted one by one, as pops would
        keys = [uuid.uuid1() for _ in range(200)]
        for f in [s.execute_async(insert, (k, BODY)) for k in keys]:
            f.result()
        for f in [s.execute_async(delete, (k,)) for k in keys]:
            f.result()
    backlog()  # behind every tombstone of the passage
    try:
        after = pop_latency(pop)
    except Exception as e:  # e.g. the node refuses a read over tombstone_failure_threshold
        print(f"  naive head read failed after the passage: {type(e).__name__}: {str(e)[:160]}")
        after = float("inf")
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pushers", type=int, default=4)
    ap.add_argument("--poppers", type=int, default=4)
    ap.add_argument("--passage", type=int, default=1_000_000)
    ap.add_argument("--naive-passage", type=int, default=50_000)
    a = ap.parse_args()
    s = session()
    s.execute(
        f"CREATE KEYSPACE IF NOT EXISTS \"{KEYSPACE}\" WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
    )
    print(f"{a.pushers} pushers + {a.poppers} poppers, {len(BODY)}-byte bodies, {a.seconds:.0f} s per design")
    naive_setup(s)
    pipes_setup("bench_q")
    results = {"naive": run("naive", "", a.seconds, a.pushers, a.poppers)}
    results["pipes"] = run("pipes", "bench_q", a.seconds, a.pushers, a.poppers)
    print(f"{'design':8} {'pushed/s':>9} {'popped/s':>9}   pop ms p50/p99 first fifth   last fifth")
    for name, r in results.items():
        print(
            f"{name:8} {r['pushes']:9,.0f} {r['pops']:9,.0f}   {r['first'][0]:7.2f} / {r['first'][1]:7.2f}"
            f"   {r['last'][0]:7.2f} / {r['last'][1]:7.2f}"
        )
    ratio = results["pipes"]["pops"] / max(results["naive"]["pops"], 1e-9)
    print(f"pipes / naive delivered: {ratio:.2f}x (target >= 3)")
    for name, r in results.items():
        print(f"{name}: last-fifth p50 / first-fifth p50 = {r['last'][0] / r['first'][0]:.2f}")

    print("\nhead reads: pop p50 with a 1,000-message backlog, before and after a passage")
    pipes_setup("bench_passage")
    before, right_after, after, waited, rate = pipes_passage("bench_passage", a.passage)
    print(
        f"pipes  after {a.passage:>9,} messages: {before:6.2f} ms -> {right_after:6.2f} ms right after"
        f" ({right_after / before:.2f}x), {after:6.2f} ms once compaction settled ({after / before:.2f}x,"
        f" waited {waited:.0f} s); passage at {rate:,.0f} msg/s"
    )
    nb, na = naive_passage(a.naive_passage)
    print(f"naive  after {a.naive_passage:>9,} messages: {nb:6.2f} ms -> {na:6.2f} ms ({na / nb:.2f}x)")
    print("\ntombstones scanned per read (system_views.tombstones_per_read):")
    for table in (
        "bench_q_waiting",
        "bench_q_state",
        "bench_passage_waiting",
        "bench_passage_state",
        "naive",
    ):
        print(f"  {table:22} {tombstones(s, table)}")


if __name__ == "__main__":
    main()
