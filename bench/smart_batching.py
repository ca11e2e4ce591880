"""Smart batching of single push(), pop(), acquire() and ack() calls, off and on, beside the
commit ceiling of the same run.

Each run calls one message at a time from threads of one process for --seconds, with smart
batching off and on (taking turns, each with a client of its own, with the client's default pool),
on a ring (PostgreSQL) and on pipes (Cassandra):
  push      1, 2, 4, 8, 16, 32 and 64 threads calling push()
  pop       as many calling pop() on a queue filled beforehand
  push+pop  as many pushers and as many poppers at once: messages delivered end to end
  leased    16 pushers and 16 consumers calling acquire() then ack()
Each configuration runs --rounds times, off first in one round and on first in the next; its line
gives the median messages/s, the latency of a call (p50, p99, every round's calls pooled) and
calls a round trip. Then on / off by thread count against the targets: at least 0.95 at 1 and 2
threads (a call with a free connection goes at once: within the noise), at least 1.0 past.
push+pop at 64 threads runs once more with every thread of this process on one CPU, as
`taskset -a -c 0` would run it: a process of many threads that take turns under the GIL hands
the GIL on about three times slower across CPUs. The ceiling: 16 threads each committing a
one-row UPDATE of its own row, as fast as they can (PostgreSQL). After each run the queue is
drained and counted: every message stored was received once or is drained, and none twice.
Last, what 64 + 64 threads at 3 x ceiling/2 would cost the CPU: the hand-off
alone (64 and 128 threads calling a smart batcher whose round trip answers at once, no database;
calls/s and the cores the process used; 128 again on one CPU), a message's CPU in round trips of
30 (push_many, pop_many; one thread), here and in PostgreSQL, a hand-off between two threads
(spread and on one CPU), and from them the most one process
could deliver, its threads taking turns under the GIL (an estimate: hand-off and work add up).
The line before them sets the ring's 64 + 64 and leased results against their targets.
Calls with their own options (ring and pipes, 32 threads on one client, the client's default
pool): acquire(visibility=5) then ack(), pop(timeout=0.5), push(ttl=60) and push(delay=0.01),
off and on, each beside the default call of its kind (acquire() then ack(), pop(), push()) in the
same run; the targets: on at least 1.5 x its own off, and within 1.5 x the default call's on.
`--options-only` runs these alone.

    ~/.cache/dbq/venv/bin/python -m bench.smart_batching --seconds 2 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyodbc
from bench.cpu import cpu_of_programs, on_one_cpu

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.client import connect
from dbq.client.coalescing import Coalescer
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

THREADS = (1, 2, 4, 8, 16, 32, 64)
BODY = b"m" * 100
# Messages a pop run starts on, a second of --seconds: more than its fastest configuration takes
# (the ring's 64 poppers, about 50,000/s at their best; a run that empties the queue says so).
PREFILL = {"ring": 50_000, "pipes": 20_000}


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


@dataclass
class Role:
    """Threads calling `step` until the time is up; what the calls returned (None: nothing) and how long each took."""

    threads: int
    step: Callable[[], Any]
    got: list[Any] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def run_roles(roles: list[Role], seconds: float) -> float:
    """Runs the roles' threads at once; the time they took."""
    stop = time.monotonic() + seconds

    def loop(role: Role) -> None:
        got, took = [], []
        while time.monotonic() < stop:
            t = time.perf_counter()
            value = role.step()
            took.append(time.perf_counter() - t)
            if value is not None:
                got.append(value)
        role.got += got  # list += is atomic under the GIL
        role.seconds += took

    started = time.monotonic()
    with ThreadPoolExecutor(sum(r.threads for r in roles)) as pool:
        list(pool.map(loop, [r for r in roles for _ in range(r.threads)]))
    return time.monotonic() - started


def drain(q: Any) -> list[Any]:
    taken: list[Any] = []
    while got := q.pop_many(500, timeout=0.5):
        taken += [m.id for m in got]
    return taken


def conserved(stored: list[Any], received: list[Any], drained: list[Any]) -> None:
    """Every message stored was received once or drained, none twice, nothing else came."""
    assert len(received) + len(drained) == len(stored), (len(received), len(drained), len(stored))
    assert set(received) | set(drained) == set(stored)


def pop_id(q: Any) -> Any:
    m = q.pop(timeout=0.05)
    return None if m is None else m.id


def acquire_and_ack(q: Any, **options: Any) -> Any:
    m = q.acquire(**(options or {"timeout": 0.05}))
    if m is None:
        return None
    m.ack()
    return m.id


OPTION_THREADS = 32
OPTION_PREFILL = 100_000  # more than 32 takers deliver in --seconds 3 at their best
# The calls of the option cases: (kind, the call), by name; an option case's default call is the
# one of its kind with no options.
CALLS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "acquire()+ack": ("leased", lambda q: acquire_and_ack(q, timeout=None)),
    "acquire(visibility=5)+ack": ("leased", lambda q: acquire_and_ack(q, visibility=5)),
    "pop()": ("pop", lambda q: getattr(q.pop(), "id", None)),
    "pop(timeout=0.5)": ("pop", lambda q: getattr(q.pop(timeout=0.5), "id", None)),
    "push()": ("push", lambda q: q.push(BODY)),
    "push(ttl=60)": ("push", lambda q: q.push(BODY, ttl=60)),
    "push(delay=0.01)": ("push", lambda q: q.push(BODY, delay=0.01)),
}
DEFAULT_CALL = {"leased": "acquire()+ack", "pop": "pop()", "push": "push()"}


def option_cases(label: str, make: Callable[[bool], Any], seconds: float) -> list[str]:
    """Each call of CALLS from 32 threads of one client, off then on; conservation checked after
    each run. The rates, then one line a case against the targets; the cases that missed them."""
    rates: dict[tuple[str, bool], float] = {}
    for name, (kind, call) in CALLS.items():
        for smart in (False, True):
            q = make(smart)
            filled = q.push_many([BODY] * OPTION_PREFILL) if kind != "push" else []
            role = Role(OPTION_THREADS, lambda q=q, call=call: call(q))
            elapsed = run_roles([role], seconds)
            together = {"push": q._pushes, "pop": q._pops, "leased": q._acquires}[kind]
            trips = together.round_trips if smart else 0
            q.close()
            with make(False) as counter:
                if "delay" in name:
                    time.sleep(0.05)  # all due
                    while label == "pipes" and counter.repair().delayed_due:
                        pass  # each repair moves up to 2,000 due delayed messages to a pipe
                stored, received = (role.got, []) if kind == "push" else (filled, role.got)
                conserved(stored, received, drain(counter))
            if kind != "push" and len(received) == len(filled):
                print(f"  {label:5s} {name}: the queue ran dry; raise OPTION_PREFILL", flush=True)
            rate = rates[name, smart] = len(role.got) / elapsed
            p50, p99 = p50_p99(role.seconds)
            print(f"  {label:5s} {OPTION_THREADS} threads  {name:26s} {'on ' if smart else 'off'} {rate:8.0f} msg/s"
                  f"  p50 {p50:6.2f} ms  p99 {p99:7.2f} ms  {len(role.got) / trips if trips else 1.0:6.1f} calls a round trip",
                  flush=True)  # fmt: skip
    missed = []
    for name, (kind, _) in CALLS.items():
        if name in DEFAULT_CALL.values():
            continue
        off, on, default = rates[name, False], rates[name, True], rates[DEFAULT_CALL[kind], True]
        met = on >= 1.5 * off and on >= default / 1.5
        print(f"  {label:5s} {name}: on / off {on / off:.2f} x (target >= 1.5), on / {DEFAULT_CALL[kind]} on"
              f" {on / default:.2f} x (target >= 0.67): {'met' if met else 'MISSED'}")  # fmt: skip
        if not met:
            missed.append(f"{label} {name}")
    return missed


def runs_of(
    q: Any, kind: str, threads: int, seconds: float, prefill: int
) -> tuple[float, Role, list[Any], list[Any]]:
    """One run: messages/s, the role whose calls are timed, the ids stored and those received."""
    filled = q.push_many([BODY] * int(prefill * seconds)) if kind == "pop" else []
    pushers = Role(threads if kind != "leased" else 16, lambda: q.push(BODY))
    takers = Role(threads, lambda: pop_id(q)) if kind != "leased" else Role(16, lambda: acquire_and_ack(q))
    roles = {"push": [pushers], "pop": [takers], "push+pop": [pushers, takers], "leased": [pushers, takers]}
    elapsed = run_roles(roles[kind], seconds)
    timed = pushers if kind == "push" else takers
    received = [] if kind == "push" else takers.got
    return len(timed.got) / elapsed, timed, filled + pushers.got, received


def p50_p99(seconds: list[float]) -> tuple[float, float]:
    ms = sorted(v * 1000 for v in seconds)
    return statistics.median(ms), ms[int(len(ms) * 0.99)]


Rates = dict[tuple[str, int, bool, bool], float]  # messages/s by kind, threads, smart, on one CPU
# The targets, on / off by thread count: a call with a free connection must go as fast as with
# smart batching off (1 and 2 threads within the noise, 0.95), and never lose past that.
TARGETS = {1: 0.95, 2: 0.95} | {t: 1.0 for t in THREADS if t > 2}


@dataclass
class Runs:
    """One configuration's runs over the rounds: messages/s, call latencies, calls, round trips."""

    rates: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    calls: int = 0
    trips: int = 0


def measure(label: str, make: Callable[[bool], Any], seconds: float, rounds: int) -> tuple[Rates, list[str]]:
    """Off and on take turns at each thread count, each with a client of its own, in `rounds`
    rounds (off first in one round, on first in the next), so that what the queue has been
    through (tombstones, vacuum) and a drift of the machine weigh on both alike. One line per
    configuration, with the median rate of its runs and its latencies pooled; then on / off by
    thread count against TARGETS. The median rates, and the kinds that missed a target."""
    plan = [(kind, threads, False) for kind in ("push", "pop", "push+pop") for threads in THREADS]
    plan += [("leased", 16, False), ("push+pop", 64, True)]
    runs: dict[tuple[str, int, bool, bool], Runs] = {}
    for round_ in range(rounds):
        for kind, threads, one_cpu in plan:
            for smart in (False, True) if round_ % 2 == 0 else (True, False):
                with on_one_cpu() if one_cpu else contextlib.nullcontext():
                    q = make(smart)
                    rate, timed, stored, received = runs_of(q, kind, threads, seconds, PREFILL[label])
                    coalescers = (
                        [q._pushes]
                        if kind == "push"
                        else [q._pops]
                        if "pop" in kind
                        else [q._acquires, q._acks]
                    )
                    trips = sum(c.round_trips for c in coalescers) if smart else 0
                    q.close()  # gives its pipe leases back, so that the drain finds every pipe
                with make(False) as counter:
                    conserved(stored, received, drain(counter))
                if kind == "pop" and len(received) == len(stored):
                    print(f"  {label:5s} pop {threads} threads: the queue ran dry; raise PREFILL", flush=True)
                calls = len(timed.seconds) * (2 if kind == "leased" else 1)  # acquire and ack
                got = runs.setdefault((kind, threads, smart, one_cpu), Runs())
                got.rates.append(rate)
                got.seconds += timed.seconds
                got.calls += calls
                got.trips += trips or calls  # off: one round trip a call
        print(f"  {label}: round {round_ + 1} of {rounds} done", file=sys.stderr, flush=True)
    rates: Rates = {}
    for (kind, threads, smart, one_cpu), got in runs.items():
        rate = rates[kind, threads, smart, one_cpu] = statistics.median(got.rates)
        p50, p99 = p50_p99(got.seconds)
        print(f"  {label:5s} {kind:8s} {'on ' if smart else 'off'} {threads:3d} threads  {rate:8.0f} msg/s"
              f"  p50 {p50:6.2f} ms  p99 {p99:7.2f} ms  {got.calls / got.trips:6.1f} calls a round trip"
              f"  (median of {len(got.rates)}, {min(got.rates):.0f}-{max(got.rates):.0f})"
              + ("  (this process on one CPU)" if one_cpu else ""), flush=True)  # fmt: skip
    missed = []
    for kind in ("push", "pop", "push+pop"):
        ratios = {t: rates[kind, t, True, False] / rates[kind, t, False, False] for t in THREADS}
        short = [t for t, r in ratios.items() if r < TARGETS[t]]
        print(f"  {label:5s} {kind:8s} on / off: " + ", ".join(f"{t} {r:.2f}" for t, r in ratios.items())
              + f" (targets {TARGETS[1]} at 1 and 2 threads, {TARGETS[4]} past): "
              + ("met" if not short else f"MISSED at {', '.join(map(str, short))} threads"))  # fmt: skip
        if short:
            missed.append(f"{label} {kind}")
    return rates, missed


WORK_BATCH = 30  # about what a coalesced round trip carries at 64 threads a side


def client_work(q: Any, rounds: int = 300) -> dict[str, tuple[float, float]]:
    """CPU seconds a message in push_many and pop_many of WORK_BATCH, one thread: (this
    process, PostgreSQL), by call."""
    spent = {}
    for name, call in (("push_many", lambda: q.push_many([BODY] * WORK_BATCH)),
                       ("pop_many", lambda: q.pop_many(WORK_BATCH))):  # fmt: skip
        client, server = time.process_time(), cpu_of_programs(["postgres"])["postgres"]
        for _ in range(rounds):
            call()
        spent[name] = (
            (time.process_time() - client) / rounds / WORK_BATCH,
            (cpu_of_programs(["postgres"])["postgres"] - server) / rounds / WORK_BATCH,
        )
    return spent


def hand_off(threads: int, seconds: float) -> tuple[float, float]:
    """Calls/s of `threads` threads through a smart batcher whose round trip answers at once,
    and the cores this process used meanwhile."""
    together: Coalescer[bytes, bytes] = Coalescer(lambda bodies: bodies, limit=500)
    role = Role(threads, lambda: together(BODY))
    started = time.process_time()
    elapsed = run_roles([role], seconds)
    return len(role.got) / elapsed, (time.process_time() - started) / elapsed


def ping_pong(rounds: int = 50_000) -> float:
    """Seconds a hand-off takes between two threads of this process passing a turn back and
    forth through two locks: what waking one thread that needs the GIL costs, at the least."""
    mine, theirs = threading.Lock(), threading.Lock()
    mine.acquire()
    theirs.acquire()

    def other() -> None:
        for _ in range(rounds):
            mine.acquire()
            theirs.release()

    partner = threading.Thread(target=other)
    partner.start()
    started = time.perf_counter()
    for _ in range(rounds):
        mine.release()
        theirs.acquire()
    elapsed = time.perf_counter() - started
    partner.join()
    return elapsed / (2 * rounds)


def budget(top: float, work: dict[str, tuple[float, float]], seconds: float) -> None:
    """What 64 pushers + 64 poppers at 3 x ceiling/2 would cost this machine's CPU."""
    alone = {threads: hand_off(threads, seconds) for threads in (64, 128)}
    spread_turn = ping_pong()
    with on_one_cpu():
        pinned = hand_off(128, seconds)
        pinned_turn = ping_pong()
    print(f"  a hand-off between two threads (ping-pong through two locks): {spread_turn * 1e6:.1f} us spread over"
          f" the CPUs, {pinned_turn * 1e6:.1f} us on one CPU")  # fmt: skip
    print(f"  hand-off alone (smart batching, no database): {alone[64][0]:.0f} calls/s from 64 threads"
          f" ({alone[64][1]:.2f} cores), {alone[128][0]:.0f} from 128 ({alone[128][1]:.2f} cores);"
          f" 128 with this process on one CPU: {pinned[0]:.0f} ({pinned[1]:.2f} cores)")  # fmt: skip
    push, pop = work["push_many"], work["pop_many"]
    print(f"  a message in round trips of {WORK_BATCH} (one thread), CPU: push_many {push[0] * 1e6:.1f} us"
          f" here + {push[1] * 1e6:.1f} us PostgreSQL, pop_many {pop[0] * 1e6:.1f} + {pop[1] * 1e6:.1f} us")  # fmt: skip
    delivered = 3 * top / 2
    rate, cores = alone[128]
    work_s = push[0] + pop[0]  # the client's CPU a delivered message
    need = {
        "hand-off": 2 * delivered * cores / rate,
        "client": delivered * work_s,
        "PostgreSQL": delivered * (push[1] + pop[1]),
    }
    print(
        f"  64 + 64 at 3 x ceiling/2 ({delivered:.0f} delivered/s) would take, at these costs: "
        + ", ".join(f"{k} {v:.2f}" for k, v in need.items())
        + f" = {sum(need.values()):.2f} cores, of the machine's {os.cpu_count()}"
    )
    # One process's threads run Python one at a time: were the hand-off and the client's work a
    # message all it did, a delivered message (two calls) would take 2 / (hand-off calls/s) + work.
    bound = {where: 1 / (2 / calls + work_s) for where, calls in (("spread", rate), ("one CPU", pinned[0]))}
    print(
        f"  one process's bound, estimated (1 / (2 / hand-off calls/s + client work a message)):"
        f" {bound['spread']:.0f} delivered/s spread over the CPUs ({bound['spread'] / (top / 2):.2f} x ceiling/2),"
        f" {bound['one CPU']:.0f} on one CPU ({bound['one CPU'] / (top / 2):.2f} x)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5, help="off and on runs of each configuration")
    parser.add_argument("--options-only", action="store_true", help="only the calls with their own options")
    parser.add_argument("--designs", default="ring,pipes", help="of ring (PostgreSQL) and pipes (Cassandra)")
    opts = parser.parse_args()
    designs = opts.designs.split(",")
    if unknown := set(designs) - {"ring", "pipes"}:
        parser.error(f"--designs: {', '.join(sorted(unknown))} is not a design; pick from ring, pipes")
    stack = Stack()
    stack.up(tuple(component for design, component in (("ring", "postgres"), ("pipes", "cassandra"))
                   if design in designs))  # fmt: skip
    missed: list[str] = []
    missed_threads: list[str] = []
    if "ring" in designs:
        ring, top, work = measure_ring(stack, opts, missed, missed_threads)
    if "pipes" in designs:
        measure_pipes(stack, opts, missed, missed_threads)
    print(
        "calls with their own options: "
        + (f"targets MISSED by {', '.join(missed)}" if missed else "every target met")
    )
    if opts.options_only:
        return 0
    print(
        "single calls by thread count, on / off: "
        + (f"targets MISSED by {', '.join(missed_threads)}" if missed_threads else "every target met")
    )
    print(f"one message a call, {opts.seconds:g} s a run, bodies of {len(BODY)} bytes;"
          f" pop runs start on {PREFILL['ring'] * opts.seconds:,.0f} messages (ring), {PREFILL['pipes'] * opts.seconds:,.0f} (pipes);"
          " push+pop and leased count messages delivered")  # fmt: skip
    if "ring" not in designs:
        return 0
    print(f"  commit ceiling (PostgreSQL, 16 threads, one-row UPDATE a transaction): {top:.0f}/s")
    half = top / 2
    spread, pinned = ring["push+pop", 64, True, False], ring["push+pop", 64, True, True]
    leased = ring["leased", 16, True, False] / ring["leased", 16, False, False]
    print(f"  ring 64 + 64 delivered, smart batching on: {spread:.0f}/s spread over the CPUs ({spread / half:.2f} x"
          f" ceiling/2), {pinned:.0f}/s on one CPU ({pinned / half:.2f} x); leased 16 + 16 on/off: {leased:.2f} x")  # fmt: skip
    budget(top, work, opts.seconds)
    return 0


def measure_ring(
    stack: Stack, opts: argparse.Namespace, missed: list[str], missed_threads: list[str]
) -> tuple[Rates, float, dict[str, tuple[float, float]]]:
    """The ring's cases (the kinds that missed a target added to the lists): its rates by
    configuration, the commit ceiling and a message's CPU in batches."""
    ring: Rates = {}
    work: dict[str, tuple[float, float]] = {}
    with scratch_database(stack, "dbq_bench_sb") as postgres:
        top = ceiling(postgres.admin_odbc, opts.seconds)  # a table of its own: the superuser
        name = f"q_{secrets.token_hex(3)}"
        OdbcRing(from_url(postgres.url), RingTarget(QueueNames("bench", name), 262_144, 128)).apply()
        missed += option_cases("ring", lambda smart: connect(postgres.url, name, schema="bench",
                                                             smart_batching=smart), opts.seconds)  # fmt: skip
        if not opts.options_only:
            ring, short = measure("ring", lambda smart: connect(postgres.url, name, schema="bench",
                                                                smart_batching=smart), opts.seconds, opts.rounds)  # fmt: skip
            missed_threads += short
            with connect(postgres.url, name, schema="bench", smart_batching=False) as q:
                work = client_work(q)
    return ring, top, work


def measure_pipes(
    stack: Stack, opts: argparse.Namespace, missed: list[str], missed_threads: list[str]
) -> None:
    """The pipes' cases (the kinds that missed a target added to the lists)."""
    keyspace, name = f"bench_{secrets.token_hex(3)}", f"q_{secrets.token_hex(3)}"
    url = stack.cassandra.url()
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
        pipes = lambda smart: connect(url, name, schema=keyspace, smart_batching=smart, pop_timeout=0)  # noqa: E731
        missed += option_cases("pipes", pipes, opts.seconds)
        if not opts.options_only:
            missed_threads += measure("pipes", pipes, opts.seconds, opts.rounds)[1]
    finally:
        backend.teardown()
        backend.close()


if __name__ == "__main__":
    sys.exit(main())
