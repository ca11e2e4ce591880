"""What a message's size costs a pipes queue on the local Cassandra, 4 pushers and 4 poppers (one
process each, single push and pop, at-most-once): delivered messages/s and MB/s for bodies of
300 B, 4 KiB, 32 KiB (the most a message's row holds), 32 KiB + 1 (the least stored in chunks
beside the pipes), 64 KiB and 1 MiB, beside the disk's write rate (one process writing and
fsyncing 1 MiB blocks beside Cassandra's files).

At 300 B and 4 KiB the code before chunked bodies (--old, a git revision, checked out in a
worktree and run from there) is measured in the same run, taking turns with this code, so a
change in the machine's pace shows in both alike: the medians of --rounds rounds count.

    ~/.cache/dbq/venv/bin/python -m bench.pipes_message_size --old 146d35d

Writes nothing but its report (tee it to bench/results/pipes_message_size.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.message_size import disk_rate, pop_loop, push_loop, worktree
from bench.ring_vs_skiplocked import sampled

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "300 B": 300,
    "4 KiB": 4 << 10,
    "32 KiB": 32 << 10,
    "32 KiB+1": (32 << 10) + 1,
    "64 KiB": 64 << 10,
    "1 MiB": 1 << 20,
}
KEYSPACE = "dbq_bench_size"


def url() -> str:
    from dbq.devstack import Stack

    return Stack().cassandra.url()


# --- one measurement, in a process of its own (--measure): the code under test is on its path ---
def push_worker(queue: str, size: int, counter: Any, stop: Any) -> None:
    from dbq.client import connect

    push_loop(connect(url(), queue, schema=KEYSPACE, smart_batching=False), os.urandom(size), counter, stop)


def pop_worker(queue: str, size: int, counter: Any, stop: Any) -> None:
    from dbq.client import connect

    pop_loop(
        connect(url(), queue, schema=KEYSPACE, pop_timeout=0.05, smart_batching=False), size, counter, stop
    )


def worker(role: str, *args: Any) -> None:
    (push_worker if role == "push" else pop_worker)(*args)


def measure(size: int, seconds: float, workers: int) -> float:
    """Delivered messages per second (the poppers' counts) of `workers` pushers and as many
    poppers on a new queue, over `seconds` once all of them are connected."""
    from dbq.api.models import QueueSpec
    from dbq.backends import open_backend
    from dbq.connection import from_url

    spec = QueueSpec.model_validate(
        {
            "backend": "cassandra",
            "design": "pipes",
            "connection": {"secretRef": {"name": "x"}, "schema": KEYSPACE},
        }
    )
    queue = f"size_{uuid.uuid4().hex[:8]}"
    backend = open_backend(spec, queue, from_url(url()))
    backend.apply()
    try:
        args = [("push", queue, size)] * workers + [("pop", queue, size)] * workers
        return statistics.fmean(sampled(worker, args, seconds, counted=range(workers, 2 * workers)))
    finally:
        backend.teardown()
        backend.close()


def run_measurement(code: Path, size: int, seconds: float, workers: int) -> float:
    """One measurement in a process whose `dbq` is the package under `code`."""
    env = {**os.environ, "PYTHONPATH": f"{code / 'operator'}:{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-m", "bench.pipes_message_size", "--measure", "--size", str(size),
         "--seconds", str(seconds), "--workers", str(workers)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=seconds * 10 + 300,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"measurement of {size} B under {code} failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["delivered"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--old", help="git revision of the code before chunked bodies (measured at 300 B and 4 KiB)"
    )
    p.add_argument("--workers", type=int, default=4, help="pushers, and as many poppers")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of each run")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, taking turns")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=300, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:  # a child: its code is on its path
        print(json.dumps({"delivered": measure(a.size, a.seconds, a.workers)}))
        return
    from dbq.devstack import Stack

    cassandra = Stack().component("cassandra")
    codes = {"this": ROOT} | ({"old": worktree(a.old)} if a.old else {})
    rates: dict[str, list[float]] = {}
    disk: list[float] = []
    for round_ in range(1, a.rounds + 1):
        disk.append(disk_rate(str(cassandra.dir), a.seconds))
        print(f"{'disk, 1 MiB blocks fsynced':28} #{round_} {disk[-1]:10,.1f} MB/s", flush=True)
        for label, size in SIZES.items():
            for code in ["this", "old"] if a.old and size <= 4 << 10 else ["this"]:
                key = f"{code} {label}"
                rate = run_measurement(codes[code], size, a.seconds, a.workers)
                rates.setdefault(key, []).append(rate)
                print(f"{key:28} #{round_} {rate:10,.1f} /s {rate * size / 1e6:8,.1f} MB/s", flush=True)
    median = {key: statistics.median(values) for key, values in rates.items()}
    disk_mb = statistics.median(disk)
    print(f"\n{a.workers} pushers + {a.workers} poppers, single push and pop, {a.seconds:g} s x {a.rounds}"
          " rounds (median); one Cassandra node")  # fmt: skip
    print(f"disk: one process writing 1 MiB blocks, fsync each: {disk_mb:,.1f} MB/s")
    print(f"{'body':>9}{'pipes /s':>10}{'MB/s':>8}{'of disk':>9}{'spread':>8}")
    for label, size in SIZES.items():
        values = rates[f"this {label}"]
        rate = median[f"this {label}"]
        spread = (max(values) - min(values)) / max(values)
        print(
            f"{label:>9}{rate:10,.1f}{rate * size / 1e6:8,.1f}{rate * size / 1e6 / disk_mb:9.0%}{spread:8.0%}"
        )
    if a.old:
        for label in ("300 B", "4 KiB"):
            old, new = median[f"old {label}"], median[f"this {label}"]
            print(
                f"{label}: this code {new:,.1f} /s, the code of {a.old} {old:,.1f} /s: {new / old:.2f}"
                f" (its runs: {', '.join(f'{v:,.0f}' for v in rates[f'old {label}'])};"
                f" this code's: {', '.join(f'{v:,.0f}' for v in rates[f'this {label}'])})"
            )


if __name__ == "__main__":
    main()
