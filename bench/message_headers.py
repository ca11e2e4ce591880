"""What message headers cost the ring on the local PostgreSQL: 300-byte bodies with 0, 4 and 16
headers (and with none but a body carrying 4 headers' bytes: what headers cost beyond their
bytes), push + pop (one message a cycle) and batches of 100 (push_many + pop_many), 4 workers,
beside the commit ceiling, all measured in this run; and whether the slot updates stay HOT.

Headers are stored in the slot's row by the same statement as the body: no added statement or
round trip. What they add is bytes: JSON encoding in the client, a larger row, a text column
packed into the answer. The configurations take turns for --rounds rounds, so a change in the
machine's pace shows in each alike; the median counts.

    ~/.cache/dbq/venv/bin/python -m bench.message_headers                    # 3 rounds of 10 s
    ~/.cache/dbq/venv/bin/python -m bench.message_headers --rounds 5 --seconds 20

Writes nothing but its report (tee it to bench/results/message_headers.txt).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

from bench.archive_cost import prepare_ring
from bench.ring_vs_skiplocked import BODY, DB, SCHEMA, Run, admin, bench_database, measure, prepare, sampled

from dbq.client import connect
from dbq.contract.headers import HeaderLimits, encode

BATCH = 100
FOUR = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "content-type": "application/json",
    "tenant": "acme",
    "attempt": 1,
}
SIXTEEN = FOUR | {f"x-field-{i:02}": f"value-{i:02}" for i in range(12)}
FOUR_BYTES = len(encode(FOUR, HeaderLimits()).encode())  # 4 headers as stored
# A configuration: its headers and its body. The last carries 4 headers' bytes in its body
# instead: against it, what headers cost beyond the bytes they add.
CONFIGS: dict[str, tuple[dict[str, Any] | None, bytes]] = {
    "0": (None, BODY),
    "4": (FOUR, BODY),
    "16": (SIXTEEN, BODY),
    "0, body + 4's bytes": (None, BODY + b"h" * FOUR_BYTES),
}
CYCLES = ("ring-amo", "ring-batch")


def cycle_of(kind: str, url: str, queue: str, config: str) -> Callable[[], int]:
    headers, body = CONFIGS[config]
    q = connect(url, queue, schema=SCHEMA, pool_size=1, pop_timeout=0.0, push_timeout=30)
    if kind == "ring-amo":

        def one() -> int:
            q.push(body, headers=headers)
            m = q.pop()
            assert m is None or m.headers == (headers or {})
            return 0 if m is None else 1

        return one
    bodies = [body] * BATCH
    return lambda: (q.push_many(bodies, headers=headers), len(q.pop_many(BATCH)))[1]


def worker(kind: str, url: str, queue: str, config: str, counter: Any, stop: Any) -> None:
    cycle = cycle_of(kind, url, queue, config)
    n = 0
    while not stop.is_set():
        n += cycle()
        counter.value = n


def run(kind: str, url: str, queue: str, config: str, workers: int, seconds: float) -> Run:
    samples = sampled(worker, [(kind, url, queue, config)] * workers, seconds)
    return Run(kind, "short", seconds, samples)


def hot_share(odbc: str, queue: str) -> float:
    """The share of the ring's row updates that were HOT (no index write, same page)."""
    cur = admin(odbc)
    cur.execute("SELECT pg_stat_force_next_flush()")
    upd, hot = cur.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = ? AND relname = ?",
        SCHEMA, f"{queue}_ring",
    ).fetchone()  # fmt: skip
    return hot / upd if upd else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of each run")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, taking turns")
    a = p.parse_args()
    pg, url, odbc = bench_database()
    rates: dict[str, list[float]] = {}
    hot: dict[str, list[float]] = {}
    for round_ in range(1, a.rounds + 1):
        ceiling = measure(
            "ceiling", "short", a.seconds, url, odbc, prepare("ceiling", url, odbc, 0, a.workers), a.workers
        )
        rates.setdefault("ceiling", []).append(ceiling.rate)
        print(f"{'ceiling':40} #{round_}  {ceiling.rate:10,.0f} /s", flush=True)
        for kind in CYCLES:
            for config in CONFIGS:
                label = f"{kind} {config} headers"
                # Slots of the largest body, alike for every configuration.
                queue = prepare_ring(url, odbc, archive=False, message_bytes=len(BODY) + FOUR_BYTES)
                got = run(kind, url, queue, config, a.workers, a.seconds)
                rates.setdefault(label, []).append(got.rate)
                hot.setdefault(label, []).append(hot_share(odbc, queue))
                print(f"{label:40} #{round_}  {got.rate:10,.0f} /s  HOT {hot[label][-1]:.0%}", flush=True)
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    median = {label: statistics.median(values) for label, values in rates.items()}
    print(
        f"\nworkers={a.workers} body={len(BODY)} B, {a.seconds:g} s x {a.rounds} rounds (median), messages/s"
    )
    print(f"4 headers are {FOUR_BYTES} B as stored")
    print(f"{'cycle':12}{'headers':>24}{'rate':>10}{'vs none':>9}{'HOT':>6}{'spread':>8}")
    for kind in CYCLES:
        none = median[f"{kind} 0 headers"]
        for config in CONFIGS:
            label = f"{kind} {config} headers"
            low, high = min(rates[label]), max(rates[label])
            print(f"{kind:12}{config:>24}{median[label]:10,.0f}{median[label] / none:9.2f}"
                  f"{statistics.median(hot[label]):6.0%}{(high - low) / high:8.0%}")  # fmt: skip
    print(f"{'ceiling':12}{'':24}{median['ceiling']:10,.0f}   (one single-row UPDATE per commit)")


if __name__ == "__main__":
    main()
