"""Online resize of a PostgreSQL ring under load: 4 producer and 4 consumer processes at full
speed (one message a call, logins holding `send` and `receive` alone), while the ring grows
1,000 -> 100,000 -> 1,000,000 slots and shrinks back to 1,000, each step made while they run
(`OdbcRing.resize`, then `OdbcRing.retire` until the older ring is dropped: what the operator runs).

Per switch: how long calls in flight at the switch took (the pause a push or a pop sees), p99
and max, beside the p99 and max of calls in the steady window before the first step; the rate
during each step (from the preparation's start to the older ring's retirement) against the
steady window before it (the older ring's) and the one after it (the new ring's: a larger ring
runs slower at the same load, its updates spread over more pages). At the end, conservation: every push acknowledged is delivered once (at most once:
popped; leased: acked), and pushes that found the ring full are counted.

    ~/.cache/dbq/venv/bin/python -m bench.resize --modes amo leased
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.client import QueueFull, connect
from dbq.connection import from_url
from dbq.devstack import Stack
from tests.local import scratch_database
from tests.manifests import queue
from tests.test_access import Accounts

SCHEMA = "bench_resize"
STEPS = (100_000, 1_000_000, 1_000)


def backend(url: str, name: str, size: int) -> OdbcRing:
    spec = QueueSpec.model_validate(
        {
            **queue()["spec"],
            "connection": {"secretRef": {"name": "s"}, "schema": SCHEMA},
            "ring": {"size": size},
        }
    )
    made = open_backend(spec, name, from_url(url))
    assert isinstance(made, OdbcRing)
    return made


def worker(role: str, url: str, name: str, out: str, stop: str, prefix: str, mode: str) -> None:
    """One client process: calls until `stop` exists (and, for a consumer, the queue is empty);
    writes (start, seconds) of each call, the bodies it pushed or delivered, and when it found the
    ring full."""
    calls: list[tuple[float, float]] = []
    bodies: list[str] = []
    full: list[float] = []
    with connect(url, name, schema=SCHEMA, smart_batching=False) as q:
        Path(out + ".ready").touch()
        n, idle = 0, 0
        while True:
            started = time.time()
            if role == "push":
                if os.path.exists(stop):
                    break
                body = f"{prefix}-{n}"
                try:
                    q.push(body.encode(), timeout=0)
                except QueueFull:
                    full.append(started)
                    time.sleep(0.001)
                    continue
                n += 1
                bodies.append(body)
            else:
                message = q.pop(timeout=0) if mode == "amo" else q.acquire(timeout=0, visibility=60)
                if message is None:
                    idle = idle + 1 if os.path.exists(stop) else 0
                    if idle > 50:
                        break
                    time.sleep(0.001)
                    continue
                if mode == "leased":
                    message.ack()
                bodies.append(message.body.decode())
            calls.append((started, time.time() - started))
    Path(out).write_text(json.dumps({"calls": calls, "bodies": bodies, "full": full}))


def p(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_mode(db: Any, accounts: Accounts, mode: str, steady: float, tmp: Path) -> dict[str, Any]:
    name = f"resize_{mode}"
    backend(db.url, name, 1_000).apply()
    _, producer = accounts.login({name: ("send",)}, SCHEMA)
    _, consumer = accounts.login({name: ("receive",)}, SCHEMA)
    stop = tmp / f"{mode}.stop"
    outs = [tmp / f"{mode}.{i}.json" for i in range(8)]
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench.resize", "worker", "push" if i < 4 else "pop",
                          producer if i < 4 else consumer, name, str(outs[i]), str(stop), f"p{i}", mode])
        for i in range(8)
    ]  # fmt: skip
    while not all(Path(f"{o}.ready").exists() for o in outs):  # every client connected
        time.sleep(0.1)
    time.sleep(3)  # and going
    window = (time.time(), time.time() + steady)
    time.sleep(steady)
    steps: list[dict[str, Any]] = []
    for size in STEPS:
        began = time.time()
        made = backend(db.url, name, size).resize()
        assert made is not None, f"no resize to {size}"
        switched = time.time()
        while (done := backend(db.url, name, size).retire()) is None or done.resizing:
            time.sleep(0.2)
        retired = time.time()
        steps.append({"size": size, "began": began, "switch_end": switched, "switch_begin": switched - made.switch_s,
                      "prepared_s": made.prepared_s, "switch_s": made.switch_s, "retired": retired,
                      "after": (retired, retired + steady)})  # fmt: skip
        time.sleep(steady)  # the new ring's own steady window
    stop.touch()
    for proc in procs:
        assert proc.wait(timeout=600) == 0, f"worker exited {proc.returncode}"
    runs = [json.loads(o.read_text()) for o in outs]
    pushes = [c for r in runs[:4] for c in r["calls"]]
    pops = [c for r in runs[4:] for c in r["calls"]]
    pushed = Counter(b for r in runs[:4] for b in r["bodies"])
    delivered = Counter(b for r in runs[4:] for b in r["bodies"])

    def in_window(calls: list[tuple[float, float]], lo: float, hi: float) -> list[float]:
        return [d for s, d in calls if s < hi and s + d > lo]

    def rate(lo: float, hi: float) -> float:
        return sum(1 for s, d in pops if lo <= s + d < hi) / max(hi - lo, 1e-9)

    base = {
        "push": in_window(pushes, *window),
        "pop": in_window(pops, *window),
        "rate": rate(*window),
    }
    out: dict[str, Any] = {"mode": mode, "base": base, "steps": []}
    before = window
    for step in steps:
        out["steps"].append({
            **step,
            "push": in_window(pushes, step["switch_begin"], step["switch_end"]),
            "pop": in_window(pops, step["switch_begin"], step["switch_end"]),
            "rate": rate(step["began"], step["retired"]),
            "rate_before": rate(*before),
            "rate_after": rate(*step["after"]),
        })  # fmt: skip
        before = step["after"]
    lost = sum((pushed - delivered).values())
    twice = sum((delivered - pushed).values())
    fulls = [t for r in runs[:4] for t in r["full"]]
    base["full"] = sum(1 for t in fulls if window[0] <= t < window[1])
    for s in out["steps"]:  # before the switch the older ring's size holds; after it, the new one's
        s["full_before"] = sum(1 for t in fulls if s["began"] <= t < s["switch_end"])
        s["full_after"] = sum(1 for t in fulls if s["switch_end"] <= t < s["retired"])
    out["conservation"] = {"pushed": sum(pushed.values()), "delivered": sum(delivered.values()), "lost": lost,
                           "twice": twice, "full": len(fulls)}  # fmt: skip
    return out


def report(result: dict[str, Any]) -> None:
    base = result["base"]
    print(f"\n## {result['mode']}: 4 producers + 4 consumers, one message a call")
    print(
        f"steady window: {base['rate']:,.0f} msg/s delivered; calls p99 push {p(base['push'], 0.99) * 1000:.1f} ms,"
        f" pop {p(base['pop'], 0.99) * 1000:.1f} ms; max push {max(base['push'], default=0) * 1000:.1f} ms,"
        f" pop {max(base['pop'], default=0) * 1000:.1f} ms; pushes finding the ring full {base['full']:,}"
    )
    print(
        "to slots   prepared  switch  calls across it  push p99/max ms  pop p99/max ms  msg/s before, during, after"
        "  during/before  during/after  full before / after the switch"
    )
    for s in result["steps"]:
        print(
            f"{s['size']:>9,}  {s['prepared_s']:7.1f}s {s['switch_s'] * 1000:6.1f}ms"
            f"  {len(s['push']) + len(s['pop']):15d}"
            f"  {p(s['push'], 0.99) * 1000:6.1f} / {max(s['push'], default=0) * 1000:6.1f}"
            f"  {p(s['pop'], 0.99) * 1000:6.1f} / {max(s['pop'], default=0) * 1000:6.1f}"
            f"  {s['rate_before']:7,.0f} {s['rate']:7,.0f} {s['rate_after']:7,.0f}"
            f"  {s['rate'] / max(s['rate_before'], 1e-9):13.2f}  {s['rate'] / max(s['rate_after'], 1e-9):12.2f}"
            f"  {s['full_before']:,} / {s['full_after']:,}"
        )
    c = result["conservation"]
    print(
        f"conservation: {c['pushed']:,} pushed, {c['delivered']:,} delivered, {c['lost']} lost, {c['twice']} twice;"
        f" pushes that found the ring full, in all: {c['full']:,}"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(*sys.argv[2:9])
        return
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--modes", nargs="+", choices=["amo", "leased"], default=["amo", "leased"])
    a.add_argument(
        "--steady", type=float, default=10.0, help="seconds of the steady windows before and after each step"
    )
    args = a.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-resize-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    with scratch_database(stack, "bench_resize") as db:
        accounts = Accounts(db)
        try:
            for mode in args.modes:
                report(one_mode(db, accounts, mode, args.steady, tmp))
        finally:
            accounts.close()


if __name__ == "__main__":
    main()
