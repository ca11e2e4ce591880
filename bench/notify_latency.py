"""Push-to-delivery latency on an idle ring queue, and what idle consumers cost the server:
consumers that poll (spin, then back off up to 50 ms) against consumers woken by LISTEN/NOTIFY,
measured in the same run (PostgreSQL).

Four consumer threads, each with its own client, wait in pop(timeout=5). A producer pushes one
message at a time, 50-150 ms apart (so the queue is empty, and the consumers waiting, before
each push), stamping the time before the push into the body; the consumer that gets it
records now - stamp. Then the four consumers wait on an empty queue for --idle seconds while
the database's committed transactions are counted (pg_stat_database.xact_commit: every call
of a client in autocommit mode is one). Last, what notification costs a busy queue: N pushers
and N poppers (one client, smart batching on, pop(timeout=0.2)) for --busy seconds, messages
delivered end to end, with notification off and on.

    ~/.cache/dbq/venv/bin/python -m bench.notify_latency
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import struct
import sys
import threading
import time

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import PgDatabase, scratch_database

CONSUMERS = 4


def commits(postgres: PgDatabase) -> int:
    """Transactions committed in the bench's database so far (the statistics collector's count)."""
    conn = postgres.connect()
    try:
        statement = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        return int(conn.cursor().execute(statement).fetchval())
    finally:
        conn.close()


def run(
    postgres: PgDatabase, name: str, notify: bool, messages: int, idle_s: float
) -> tuple[list[float], float]:
    """Latencies in ms, and committed transactions per second while the consumers idle."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        with connect(postgres.url, name, schema="bench", notify=notify, smart_batching=False) as q:
            while not stop.is_set():
                m = q.pop(timeout=5)
                if m is not None:
                    took = (time.perf_counter() - struct.unpack(">d", m.body)[0]) * 1000
                    with lock:
                        latencies.append(took)

    threads = [threading.Thread(target=consume) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # every consumer waiting
    with connect(postgres.url, name, schema="bench", notify=False, smart_batching=False) as producer:
        for _ in range(messages):
            time.sleep(random.uniform(0.05, 0.15))
            producer.push(struct.pack(">d", time.perf_counter()))
    deadline = time.monotonic() + 10
    while len(latencies) < messages and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # idle from here on
    before, started = commits(postgres), time.monotonic()
    time.sleep(idle_s)
    idle_rate = (commits(postgres) - before) / (time.monotonic() - started)
    stop.set()
    for t in threads:
        t.join()
    assert len(latencies) == messages, f"{len(latencies)} of {messages} delivered"
    return latencies, idle_rate


def busy(postgres: PgDatabase, threads: int, notify: bool, seconds: float) -> float:
    """Messages/s delivered end to end by `threads` pushers and as many poppers."""
    name = f"b_{secrets.token_hex(3)}"
    backend = OdbcRing(from_url(postgres.url), RingTarget(QueueNames("bench", name), 100_000, 100))
    backend.apply()
    stop, got, lock = threading.Event(), [0], threading.Lock()
    q = connect(postgres.url, name, schema="bench", notify=notify)

    def push() -> None:
        while not stop.is_set():
            q.push(b"x" * 100)

    def pop() -> None:
        while not stop.is_set():
            if q.pop(timeout=0.2) is not None:
                with lock:
                    got[0] += 1

    workers = [threading.Thread(target=push) for _ in range(threads)]
    workers += [threading.Thread(target=pop) for _ in range(threads)]
    for t in workers:
        t.start()
    time.sleep(1.0)
    first, started = got[0], time.monotonic()
    time.sleep(seconds)
    rate = (got[0] - first) / (time.monotonic() - started)
    stop.set()
    for t in workers:
        t.join()
    q.close()
    backend.teardown()
    backend.close()
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle consumers counted")
    parser.add_argument("--busy", type=float, default=5.0, help="seconds of each busy run")
    opts = parser.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    rows = []
    with scratch_database(stack, "dbq_bench_notify") as postgres:
        for mode, notify in (("polling", False), ("notification", True)):
            name = f"n_{secrets.token_hex(3)}"
            backend = OdbcRing(from_url(postgres.url), RingTarget(QueueNames("bench", name), 1024, 16))
            backend.apply()
            latencies, idle_rate = run(postgres, name, notify, opts.messages, opts.idle)
            latencies.sort()
            p50 = statistics.median(latencies)
            p99 = latencies[min(int(len(latencies) * 0.99), len(latencies) - 1)]
            rows.append((mode, p50, p99, latencies[-1], idle_rate))
            backend.teardown()
            backend.close()
        loads = []
        for threads in (16, 64):
            for notify in (False, True, False, True):  # taking turns: the machine drifts
                loads.append((threads, notify, busy(postgres, threads, notify, opts.busy)))
    print(
        f"idle push-to-delivery latency, {CONSUMERS} consumers waiting, {opts.messages} pushes 50-150 ms apart;"
    )
    print(
        f"server load: committed transactions/s while the {CONSUMERS} consumers wait on an empty queue ({opts.idle:g} s)"
    )
    for mode, p50, p99, worst, idle_rate in rows:
        print(
            f"  {mode:<13} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  max {worst:7.2f} ms  idle load {idle_rate:7.1f} commits/s"
        )
    base, woken = rows[0], rows[1]
    print(f"  notification / polling: p50 {woken[1] / base[1]:.2f} x, p99 {woken[2] / base[2]:.2f} x,"
          f" idle load {woken[4] / max(base[4], 0.1):.2f} x")  # fmt: skip
    print(
        f"busy queue: N pushers + N poppers, messages/s delivered end to end ({opts.busy:g} s each, off/on/off/on)"
    )
    for threads in (16, 64):
        off = [r for t, n, r in loads if t == threads and not n]
        on = [r for t, n, r in loads if t == threads and n]
        print(f"  {threads:>2} + {threads:<2}  notification off {' / '.join(f'{r:,.0f}' for r in off)}"
              f"  on {' / '.join(f'{r:,.0f}' for r in on)}  on/off {sum(on) / sum(off):.2f} x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
