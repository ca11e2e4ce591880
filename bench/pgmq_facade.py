"""PGMQ's own Python client against the real PGMQ 1.13 and against dbq's PGMQ API (schema pgmq on a
ring queue), same server, same run.

The real PGMQ's SQL comes from PyPI's `pgmq` package (its SQL-only install) in a database of its
own; dbq's in another, on a Queue with spec.pgmq. The client is `pgmq.PGMQueue` (one pooled
session, autocommit), unchanged; lines take turns in every round (--rounds, medians). A message
is one sent, read and ended:

  send, read, delete    send(q, msg), read(q, vt 30), delete(q, id)
  send, pop             send(q, msg), pop(q)
  ... batch             send_batch of 100, read 100 (delete_batch of their ids), or pop 100

Then the held snapshot: both queues are given a backlog (--backlog messages), a REPEATABLE READ
transaction in another session holds its snapshot, and the client sends, reads and deletes a
batch of 100 at a time for --hold seconds on each, in turn; the rates of the first and the last
tenth of that time are printed. Rows a snapshot may still see cannot be removed, so a table
queue drags its dead rows along while it is held; the ring reuses its slots.

    ~/.cache/dbq/venv/bin/python -m bench.pgmq_facade --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import psycopg
from bench.cpu import backend_ns
from pgmq import PGMQueue
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
    p.add_argument("--hold", type=float, default=60.0, help="seconds each side runs with the snapshot held")
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
