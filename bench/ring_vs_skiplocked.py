"""Data-plane benchmark on the local PostgreSQL: the dbq ring against the usual SKIP LOCKED queue.

Every design is driven through the same client stack (pyodbc + psqlODBC, autocommit, one
process per worker), at the same concurrency; those that carry messages carry bodies of the same
size:

- ceiling:    one single-row UPDATE per transaction (each worker its own row): the commit ceiling;
- ceiling-body: the same UPDATE also writing a body of the message size (what a push must write);
- routine:    the same UPDATE inside a PL/pgSQL function that returns the new value: the least a
              queue operation made of one routine call that answers with a row can cost;
- skiplocked: INSERT ... RETURNING to push, DELETE ... (SELECT ... FOR UPDATE SKIP LOCKED) to pop;
- ring-amo:   dbq client push + pop (at-most-once);
- ring-lease: dbq client push + acquire + ack (at-least-once);
- ring-batch: dbq client push_many(100) + pop_many(100).

A cycle is one message pushed and taken. Each design runs short (empty queue; --rounds rounds, the
designs taking turns, so a change in the machine's pace shows in every design alike; the median
counts) and sustained: a
backlog of --backlog messages stands in the queue and another session holds a REPEATABLE READ
transaction open the whole time, so nothing it could still see may be cleaned up.

    ~/.cache/dbq/venv/bin/python bench/ring_vs_skiplocked.py                # 20 s short, 5 min sustained
    ~/.cache/dbq/venv/bin/python bench/ring_vs_skiplocked.py --short 3 --long 10 --backlog 20000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyodbc

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames

DB = "dbq_bench"
SCHEMA = "bench"
BODY = b"m" * 300
BATCH = 100
CEILINGS = ("ceiling", "ceiling-body", "routine")  # references: short runs only


@dataclass
class Run:
    design: str
    kind: str  # short | sustained
    seconds: float
    per_second: list[float]  # cycles (messages) per second, one sample per second

    @property
    def rate(self) -> float:
        return sum(self.per_second) / max(len(self.per_second), 1)

    def window(self, first: bool) -> float:
        part = self.per_second[:60] if first else self.per_second[-60:]
        return statistics.fmean(part) if part else 0.0


# --- workers: each runs cycles until `stop`, adding to its own counter ----------------------------
def worker(design: str, url: str, odbc: str, queue: str, index: int, counter: Any, stop: Any) -> None:
    cycle = make_cycle(design, url, odbc, queue, index)
    n = 0
    while not stop.is_set():
        n += cycle()
        counter.value = n


def make_cycle(design: str, url: str, odbc: str, queue: str, index: int) -> Callable[[], int]:
    if design == "ceiling":
        cur = pyodbc.connect(odbc, autocommit=True).cursor()
        sql = f"UPDATE {SCHEMA}.ceiling SET n = n + 1 WHERE id = ?"
        return lambda: cur.execute(sql, index).rowcount
    if design == "ceiling-body":
        cur = pyodbc.connect(odbc, autocommit=True).cursor()
        sql = f"UPDATE {SCHEMA}.ceiling SET n = n + 1, body = ? WHERE id = ?"
        return lambda: cur.execute(sql, BODY, index).rowcount
    if design == "routine":
        cur = pyodbc.connect(odbc, autocommit=True).cursor()
        sql = f"SELECT {SCHEMA}.bump(?)"
        return lambda: 1 if cur.execute(sql, index).fetchval() else 0
    if design == "skiplocked":
        cur = pyodbc.connect(odbc, autocommit=True).cursor()
        push = f"INSERT INTO {SCHEMA}.sl_queue (body) VALUES (?) RETURNING id"
        pop = (
            f"DELETE FROM {SCHEMA}.sl_queue WHERE id = (SELECT id FROM {SCHEMA}.sl_queue ORDER BY id"
            " LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, body"
        )

        def sl_cycle() -> int:
            cur.execute(push, BODY).fetchone()
            cur.execute(pop)
            return 1 if cur.rowcount > 0 and cur.fetchone() else 0

        return sl_cycle
    q = connect(url, queue, schema=SCHEMA, pool_size=1, pop_timeout=0.0, push_timeout=30)
    if design == "ring-amo":
        return lambda: (q.push(BODY), q.pop() is not None)[1]
    if design == "ring-lease":

        def lease_cycle() -> int:
            q.push(BODY)
            m = q.acquire(timeout=0.0, visibility=60)
            if m is None:
                return 0
            m.ack()
            return 1

        return lease_cycle
    if design == "ring-batch":
        bodies = [BODY] * BATCH
        return lambda: (q.push_many(bodies), len(q.pop_many(BATCH)))[1]
    raise ValueError(design)


# --- setup ------------------------------------------------------------------------------------
def admin(odbc: str) -> pyodbc.Cursor:
    return pyodbc.connect(odbc, autocommit=True).cursor()


def prepare(design: str, url: str, odbc: str, backlog: int, workers: int, fillfactor: int = 0) -> str:
    """Fresh objects for one run, the backlog pushed; the queue's name. `fillfactor` rewrites
    the ring table with another fillfactor than dbq's (for experiments)."""
    cur = admin(odbc)
    cur.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    cur.execute(f"CREATE SCHEMA {SCHEMA}")
    if design in CEILINGS:
        cur.execute(
            f"CREATE TABLE {SCHEMA}.ceiling (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0, body bytea)"
        )
        cur.execute(f"INSERT INTO {SCHEMA}.ceiling (id) SELECT g FROM generate_series(0, {workers}) g")
        cur.execute(
            f"CREATE FUNCTION {SCHEMA}.bump(p_id int, OUT o_n bigint) LANGUAGE plpgsql AS"
            f" $$ BEGIN UPDATE {SCHEMA}.ceiling SET n = n + 1 WHERE id = p_id RETURNING n INTO o_n; END $$"
        )
        return ""
    if design == "skiplocked":
        cur.execute(
            f"CREATE TABLE {SCHEMA}.sl_queue (id bigserial PRIMARY KEY, body bytea NOT NULL,"
            " created_at timestamptz NOT NULL DEFAULT now())"
        )
        if backlog:
            cur.execute(
                f"INSERT INTO {SCHEMA}.sl_queue (body) SELECT ? FROM generate_series(1, {backlog})", BODY
            )
        cur.execute(f"VACUUM ANALYZE {SCHEMA}.sl_queue")
        return ""
    queue = "benchq"
    size = max(16_384, int(backlog * 1.1) + 16_384)
    OdbcRing(from_url(url), RingTarget(QueueNames(SCHEMA, queue), size, len(BODY))).apply()
    if fillfactor:
        cur.execute(f"ALTER TABLE {SCHEMA}.{queue}_ring SET (fillfactor = {int(fillfactor)})")
        cur.execute(f"VACUUM FULL {SCHEMA}.{queue}_ring")
    cur.execute(f"VACUUM ANALYZE {SCHEMA}.{queue}_ring")
    if backlog:
        with connect(url, queue, schema=SCHEMA) as q:
            for start in range(0, backlog, 1000):
                q.push_many([BODY] * min(1000, backlog - start))
    return queue


def measure(design: str, kind: str, seconds: float, url: str, odbc: str, queue: str, workers: int) -> Run:
    samples = sampled(worker, [(design, url, odbc, queue, i) for i in range(workers)], seconds)
    return Run(design, kind, seconds, samples)  # ring-batch cycles count messages already


def sampled(
    target: Callable[..., None], args: list[tuple[Any, ...]], seconds: float, counted: range | None = None
) -> list[float]:
    """Run `target(*args[i], counter, stop)` in one process each (it adds what it did to its
    counter until `stop` is set; a worker that is ready but has done nothing may set -1); the total
    per second of the `counted` workers (all by default), sampled once a second for `seconds`."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    counters = [ctx.Value("q", 0, lock=False) for _ in args]
    procs = [ctx.Process(target=target, args=(*a, c, stop)) for a, c in zip(args, counters, strict=True)]
    for p in procs:
        p.start()
    # Start the clock once every worker has done its first cycle (connections made).
    while not all(c.value for c in counters):
        time.sleep(0.05)

    def total() -> int:
        return sum(max(counters[i].value, 0) for i in counted or range(len(counters)))

    samples: list[float] = []
    last = total()
    started = tick = time.monotonic()
    while time.monotonic() - started < seconds:
        tick += 1.0
        time.sleep(max(0.0, tick - time.monotonic()))
        now = total()
        samples.append(float(now - last))
        last = now
    stop.set()
    for p in procs:
        p.join(timeout=60)
    return samples


def bench_database() -> tuple[Any, str, str]:
    """The local PostgreSQL (started if it is not running) with a fresh database DB: the
    component, the database's url and its ODBC connection string."""
    pg = Stack().component("postgres")
    if not pg.ready():
        pg.start()
    root = admin(pg.odbc())
    root.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    root.execute(f"CREATE DATABASE {DB}")
    return pg, pg.url(DB), pg.odbc(DB)


def held_transaction(odbc: str) -> pyodbc.Connection:
    """Another session with a REPEATABLE READ snapshot kept open: row versions it could see stay."""
    conn = pyodbc.connect(odbc, autocommit=False)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT txid_current(), count(*) FROM pg_class").fetchone()
    return conn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--short", type=float, default=20.0, help="seconds of each short run")
    p.add_argument("--long", type=float, default=300.0, help="seconds of each sustained run")
    p.add_argument("--backlog", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=3, help="short runs of each design, taking turns")
    p.add_argument(
        "--designs", default="ceiling,ceiling-body,routine,skiplocked,ring-amo,ring-lease,ring-batch"
    )
    p.add_argument("--short-only", action="store_true", help="skip the sustained runs")
    a = p.parse_args()
    pg, url, odbc = bench_database()
    designs = a.designs.split(",")
    runs: list[Run] = []
    for round_ in range(1, a.rounds + 1):
        for design in designs:
            queue = prepare(design, url, odbc, 0, a.workers)
            runs.append(measure(design, "short", a.short, url, odbc, queue, a.workers))
            print(f"{design:12} short #{round_}  {runs[-1].rate:10,.0f} /s", flush=True)
    for design in [] if a.short_only else designs:
        if design in CEILINGS:
            continue  # a per-row counter under a held snapshot measures row-version chains, not commits
        queue = prepare(design, url, odbc, a.backlog, a.workers)
        held = held_transaction(odbc)
        runs.append(measure(design, "sustained", a.long, url, odbc, queue, a.workers))
        held.rollback()
        held.close()
        r = runs[-1]
        print(
            f"{design:12} sustained  {r.rate:10,.0f} /s  first minute {r.window(True):,.0f}"
            f"  last minute {r.window(False):,.0f}",
            flush=True,
        )
    report(runs, a)
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def report(runs: list[Run], a: argparse.Namespace) -> None:
    by = {(r.design, r.kind): r for r in runs if r.kind == "sustained"}

    def rate(design: str, kind: str) -> float:
        """A sustained run's rate; the median of a design's short rounds."""
        rates = [r.rate for r in runs if (r.design, r.kind) == (design, kind)]
        return statistics.median(rates) if rates else float("nan")

    print(
        f"\nworkers={a.workers} body={len(BODY)} B backlog={a.backlog:,} short={a.short:g}s x {a.rounds}"
        f" (median) sustained={a.long:g}s"
    )
    print(f"{'design':12}{'short /s':>12}{'sustained /s':>14}{'first min':>11}{'last min':>10}")
    for design in dict.fromkeys(r.design for r in runs):
        s = by.get((design, "sustained"))
        print(
            f"{design:12}{rate(design, 'short'):12,.0f}{rate(design, 'sustained'):14,.0f}"
            f"{(s.window(True) if s else float('nan')):11,.0f}{(s.window(False) if s else float('nan')):10,.0f}"
        )
    ceiling = rate("ceiling", "short")
    ring, sl = "ring-amo", "skiplocked"
    checks = [
        ("ring-amo cycles >= 0.8 x ceiling / 2", rate(ring, "short") / (ceiling / 2), 0.8),
        # A leased cycle is three transactions (push, acquire, ack): like for like is ceiling / 3.
        ("ring-lease cycles >= 0.8 x ceiling / 3", rate("ring-lease", "short") / (ceiling / 3), 0.8),
        ("ring-amo >= 1.2 x skiplocked, short", rate(ring, "short") / rate(sl, "short"), 1.2),
        ("ring-amo >= 4 x skiplocked, sustained", rate(ring, "sustained") / rate(sl, "sustained"), 4.0),
        (
            "ring-lease >= 4 x skiplocked, sustained",
            rate("ring-lease", "sustained") / rate(sl, "sustained"),
            4.0,
        ),
    ]
    for design in ("ring-amo", "ring-lease", "ring-batch"):
        s = by.get((design, "sustained"))
        if s:
            drift = abs(s.window(False) - s.window(True)) / max(s.window(True), 1e-9)
            checks.append((f"{design} last minute within 15% of first", 1 - drift, 0.85))
    checks.append(("ring-batch >= 50,000 messages/s, short", rate("ring-batch", "short") / 50_000, 1.0))
    checks.append(
        ("ring-batch >= 50,000 messages/s, sustained", rate("ring-batch", "sustained") / 50_000, 1.0)
    )
    print("\nfor reference, like for like (ring-amo / x / 2, ring-lease / x / 3):")
    for ref in ("ceiling-body", "routine"):
        x = rate(ref, "short")
        print(
            f"  {ref:13} / ceiling {x / ceiling:.2f}; ring-amo {rate(ring, 'short') / (x / 2):.2f};"
            f" ring-lease {rate('ring-lease', 'short') / (x / 3):.2f}"
        )
    for what, ratio, need in checks:
        verdict = "ok" if ratio >= need else "MISSED"
        print(f"{verdict:7}{what:48} ratio {ratio:6.2f} (need {need:g})")


if __name__ == "__main__":
    main()
