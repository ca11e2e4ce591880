"""PGMQ's own Python client against the real PGMQ 1.13 and against dbq's PGMQ API (schema pgmq on a
ring queue), same server, same run.

The real PGMQ's SQL comes from PyPI's `pgmq` package (its SQL-only install) in a database of its
own; dbq's in another, on a Queue with spec.pgmq. The client is `pgmq.PGMQueue` (one pooled
session, autocommit), unchanged; lines take turns in every round (--rounds, medians). A message
is one sent, read and ended:

  send, read, delete    send(q, msg), read(q, vt 30), delete(q, id)
  send, pop             send(q, msg), pop(q)
  ... batch             send_batch of 100, read 100 (delete_batch of their ids), or pop 100

Then several sessions: --sessions producers and as many consumers, each a process with its own
client, move --total messages (split among the producers) through the queue; the rate is the
total over the time until the last message was consumed, and every message must be consumed once:

  sessions, leased       send(q, msg); read(q, vt 30) and delete(q, id)
  sessions, pop          send(q, msg); pop(q)
  sessions, batch        send_batch of 100; read 100 and delete_batch

Then the held snapshot: both queues are given a backlog (--backlog messages), a REPEATABLE READ
transaction in another session holds its snapshot, and the client sends, reads and deletes a
batch of 100 at a time for --hold seconds on each, in turn; the rates of the first and the last
tenth of that time are printed. Rows a snapshot may still see cannot be removed, so a table
queue drags its dead rows along while it is held; the ring reuses its slots.

    ~/.cache/dbq/venv/bin/python -m bench.pgmq_facade --rounds 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import psycopg
from bench.cpu import backend_ns
from pgmq import Message, PGMQueue
from pgmq.install import get_embedded_install_sql, get_embedded_sql_version, install_pgmq_sql

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

BATCH = 100
SIZE = 262_144  # room for the held snapshot's backlog
SCHEMA, QUEUE = "bench", "jobs"


def message(i: int) -> dict[str, object]:
    return {"order": i, "customer": f"c-{i:06d}", "items": [1, 2, 3], "note": "x" * 40}


Cycle = Callable[[PGMQueue, int], int]


def single(c: PGMQueue, i: int) -> int:
    c.send(QUEUE, message(i))
    m = c.read(QUEUE, vt=30)
    assert m is not None
    c.delete(QUEUE, m.msg_id)
    return 1


def single_pop(c: PGMQueue, i: int) -> int:
    c.send(QUEUE, message(i))
    return len(c.pop(QUEUE, 1) and [1])


def batch(c: PGMQueue, i: int) -> int:
    c.send_batch(QUEUE, [message(i + k) for k in range(BATCH)])
    read = c.read(QUEUE, vt=30, qty=BATCH)
    c.delete_batch(QUEUE, [m.msg_id for m in read])
    return len(read)


def batch_pop(c: PGMQueue, i: int) -> int:
    c.send_batch(QUEUE, [message(i + k) for k in range(BATCH)])
    return len(c.pop(QUEUE, BATCH))


LINES: dict[str, Cycle] = {
    "send, read, delete": single,
    "send, pop": single_pop,
    "batch: send, read, delete": batch,
    "batch: send, pop": batch_pop,
}


def produce(url: str, start: int, count: int, per_call: int, go: Synchronized) -> None:  # type: ignore[type-arg]
    client = PGMQueue(conn_string=url, init_extension=False, pool_size=1)
    while not go.value:
        time.sleep(0.001)
    for i in range(start, start + count, per_call):
        if per_call == 1:
            client.send(QUEUE, message(i))
        else:
            client.send_batch(QUEUE, [message(i + k) for k in range(per_call)])
    client.close()


def consume(
    url: str, mode: str, per_call: int, total: int, done: Synchronized, go: Synchronized, seen: str
) -> None:  # type: ignore[type-arg]
    """Consume until `total` messages are consumed by all; the orders this one got go to `seen`."""
    client = PGMQueue(conn_string=url, init_extension=False, pool_size=1)
    orders: list[int] = []
    while not go.value:
        time.sleep(0.001)
    while done.value < total:
        # the client answers one Message (or None) for one, a list for more
        answer = client.pop(QUEUE, per_call) if mode == "pop" else client.read(QUEUE, vt=30, qty=per_call)
        got = [answer] if isinstance(answer, Message) else list(answer or [])
        if mode == "read" and got:
            client.delete_batch(QUEUE, [m.msg_id for m in got])
        if not got:
            time.sleep(0.001)
            continue
        orders.extend(int(m.message["order"]) for m in got)
        with done.get_lock():
            done.value += len(got)
    client.close()
    Path(seen).write_text("\n".join(map(str, orders)))


SESSION_LINES = {
    "sessions, leased": ("read", 1),
    "sessions, pop": ("pop", 1),
    "sessions, batch": ("read", BATCH),
}


def sessions(url: str, mode: str, per_call: int, n: int, total: int, scratch: Path) -> float:
    """Messages a second through `n` producers and `n` consumers; asserts each was consumed once."""
    ctx = multiprocessing.get_context("spawn")
    go, done = ctx.Value("b", 0), ctx.Value("q", 0)
    share = total // n
    files = [scratch / f"seen-{k}" for k in range(n)]
    procs = [ctx.Process(target=produce, args=(url, k * share, share, per_call, go)) for k in range(n)]
    procs += [
        ctx.Process(target=consume, args=(url, mode, per_call, share * n, done, go, str(f))) for f in files
    ]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # every process connected
    started = time.perf_counter()
    go.value = 1
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0, f"a session of the {mode} line failed"
    elapsed = time.perf_counter() - started
    orders = sorted(int(x) for f in files for x in f.read_text().split())
    assert orders == list(range(share * n)), f"{mode}: {len(orders)} consumed of {share * n}, or some twice"
    return share * n / elapsed


def pid_of(client: PGMQueue) -> int:
    return int(client._execute_one("SELECT pg_backend_pid()")[0])


def held(client: PGMQueue, url: str, backlog: int, seconds: float) -> tuple[float, float, float]:
    """Messages a second over the whole hold, its first tenth and its last tenth."""
    for start in range(0, backlog, 1000):
        client.send_batch(QUEUE, [message(start + k) for k in range(1000)])
    with psycopg.connect(url) as snapshot:
        snapshot.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snapshot.execute("SELECT 1")  # the snapshot is taken by the first statement
        marks: list[tuple[float, int]] = []
        started, done = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            done += batch(client, done)
            marks.append((time.perf_counter() - started, done))
        snapshot.rollback()
    tenth = seconds / 10
    first = max((n for t, n in marks if t <= tenth), default=0) / tenth
    before_last = max((n for t, n in marks if t <= seconds - tenth), default=0)
    last = (done - before_last) / (marks[-1][0] - (seconds - tenth))
    client.purge(QUEUE)
    return done / marks[-1][0], first, last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=2000, help="messages a line handles in each round")
    p.add_argument("--backlog", type=int, default=200_000)
    p.add_argument("--hold", type=float, default=120.0, help="seconds each side runs with the snapshot held")
    p.add_argument("--sessions", type=int, default=4, help="producers, and as many consumers")
    p.add_argument("--total", type=int, default=8000, help="messages the sessions move in each round")
    a = p.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    with (
        scratch_database(stack, "dbq_bench_real") as real_db,
        scratch_database(stack, "dbq_bench_api") as dbq_db,
    ):
        with psycopg.connect(real_db.admin_url, autocommit=True) as conn:
            install_pgmq_sql(get_embedded_install_sql(), conn=conn)
        ring = OdbcRing(
            from_url(dbq_db.url), RingTarget(QueueNames(SCHEMA, QUEUE), SIZE, 256, pgmq_name=QUEUE)
        )
        ring.apply()
        ring.close()
        # The server's superuser on both sides: the same rights checks (none).
        clients = {
            "pgmq": PGMQueue(conn_string=real_db.admin_url, init_extension=False, pool_size=1),
            "dbq": PGMQueue(conn_string=dbq_db.admin_url, init_extension=False, pool_size=1),
        }
        clients["pgmq"].create_queue(QUEUE)
        pids = {side: pid_of(c) for side, c in clients.items()}
        rate: dict[tuple[str, str], list[float]] = {(side, line): [] for side in clients for line in LINES}
        cpu: dict[tuple[str, str], list[float]] = {(side, line): [] for side in clients for line in LINES}
        for client in clients.values():
            for cycle in LINES.values():
                for i in range(10):  # plans made, caches warm
                    cycle(client, i)
        for r in range(a.rounds):
            for line, cycle in LINES.items():
                for side, client in clients.items():
                    done, before, started = 0, backend_ns(pids[side]), time.perf_counter()
                    while done < a.messages:
                        done += cycle(client, r * a.messages + done)
                    rate[side, line].append(done / (time.perf_counter() - started))
                    cpu[side, line].append((backend_ns(pids[side]) - before) / done / 1000)
            with psycopg.connect(real_db.admin_url, autocommit=True) as admin:
                admin.execute(f"VACUUM pgmq.q_{QUEUE}")
        urls = {"pgmq": real_db.admin_url, "dbq": dbq_db.admin_url}
        many: dict[tuple[str, str], list[float]] = {
            (side, line): [] for side in urls for line in SESSION_LINES
        }
        with tempfile.TemporaryDirectory() as scratch:
            for _ in range(a.rounds):
                for line, (mode, per_call) in SESSION_LINES.items():
                    for side, url in urls.items():
                        many[side, line].append(
                            sessions(url, mode, per_call, a.sessions, a.total, Path(scratch))
                        )
        holds = {side: held(client, url, a.backlog, a.hold)
                 for (side, client), url in zip(clients.items(), (real_db.admin_url, dbq_db.admin_url), strict=True)}  # fmt: skip
        for client in clients.values():
            client.close()
    print(f"PGMQ's Python client (pgmq on PyPI) against PGMQ {get_embedded_sql_version()} and against dbq's PGMQ API,"
          f" one pooled session each, {a.messages} messages a line a round, medians of {a.rounds} rounds; batches of {BATCH}")  # fmt: skip
    print(
        f"  {'line':28s} {'PGMQ msgs/s':>12s} {'dbq msgs/s':>11s} {'rate':>6s} {'PGMQ us/msg':>12s} {'dbq us/msg':>11s}"
    )
    for line in LINES:
        ours, theirs = statistics.median(rate["dbq", line]), statistics.median(rate["pgmq", line])
        print(f"  {line:28s} {theirs:12.0f} {ours:11.0f} {ours / theirs:5.2f}x"
              f" {statistics.median(cpu['pgmq', line]):12.1f} {statistics.median(cpu['dbq', line]):11.1f}")  # fmt: skip
    print(f"several sessions: {a.sessions} producers and {a.sessions} consumers, a process and a session each,"
          f" {a.total} messages a round, each consumed once (checked), medians of {a.rounds} rounds (msgs/s)")  # fmt: skip
    print(f"  {'line':28s} {'PGMQ msgs/s':>12s} {'dbq msgs/s':>11s} {'rate':>6s}")
    for line in SESSION_LINES:
        ours, theirs = statistics.median(many["dbq", line]), statistics.median(many["pgmq", line])
        print(f"  {line:28s} {theirs:12.0f} {ours:11.0f} {ours / theirs:5.2f}x")
    print(f"held snapshot: {a.backlog} messages waiting, a REPEATABLE READ snapshot held, batches of {BATCH}"
          f" sent, read and deleted for {a.hold:.0f} s on each side (msgs/s)")  # fmt: skip
    print(f"  {'side':6s} {'whole':>8s} {'first tenth':>12s} {'last tenth':>11s} {'last/first':>11s}")
    for side, (whole, first, last) in holds.items():
        print(f"  {side:6s} {whole:8.0f} {first:12.0f} {last:11.0f} {last / first:10.2f}x")
    print(
        f"  dbq against PGMQ with the snapshot held: {holds['dbq'][0] / holds['pgmq'][0]:.2f} x the rate over the"
        f" whole hold, {holds['dbq'][2] / holds['pgmq'][2]:.2f} x in its last tenth"
    )


if __name__ == "__main__":
    main()
