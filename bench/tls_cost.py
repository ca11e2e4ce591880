"""What TLS costs a ring client on PostgreSQL: the same calls over a plain connection and over a
verified one (the Secret's `ca`: sslmode verify-full), in turns, on the stack's PostgreSQL.

  single   push then pop, one message at a time, one thread
  batch    push_many(100) then pop_many(100), one thread

Each line a round, the two connections taking turns (--rounds, medians); 300-byte bodies. The
handshakes: how many sessions each client opened over the whole run (its pool; a call never opens
one), counted from pg_stat_activity by their application_name.

    ~/.cache/dbq/venv/bin/python -m bench.tls_cost --rounds 5

Cassandra is not measured: the stack's Cassandra does not serve TLS yet.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue
from dbq.connection import from_secret_data, odbc
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database
from tests.test_tls import secret

BODY = 300
BATCH = 100
SCHEMA, QUEUE = "bench", "tls"


def single(q: Queue, n: int) -> None:
    for _ in range(n):
        q.push(os.urandom(BODY))
        assert q.pop(timeout=1) is not None


def batch(q: Queue, n: int) -> None:
    for _ in range(n // BATCH):
        q.push_many([os.urandom(BODY) for _ in range(BATCH)])
        assert len(q.pop_many(BATCH, timeout=1)) == BATCH


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=2000, help="messages a line a round")
    a = p.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    with scratch_database(stack, "bench_tls") as db:
        modes = {
            "plain": from_secret_data(
                secret(f"{db.url}?sslmode=disable&application_name=bench-plain"), "postgres"
            ),
            "verified": from_secret_data(
                secret(f"{db.url}?application_name=bench-verified", db.ca), "postgres"
            ),
        }
        names = QueueNames(SCHEMA, QUEUE)
        OdbcRing(modes["plain"], RingTarget(names, 10_000, 512)).apply()
        clients = {mode: Queue(settings, names) for mode, settings in modes.items()}
        lines: dict[str, Callable[[Queue, int], None]] = {"single": single, "batch": batch}
        rates: dict[tuple[str, str], list[float]] = {(line, m): [] for line in lines for m in modes}
        for q in clients.values():
            q.push(b"warm")  # the pool's sessions open here
            q.pop()
        with odbc.connect(modes["plain"]) as conn:
            rounds_began = conn.cursor().execute("SELECT now()").fetchval()
        for _ in range(a.rounds):
            for line, run in lines.items():
                for mode, q in clients.items():
                    started = time.perf_counter()
                    run(q, a.messages)
                    rates[line, mode].append(a.messages / (time.perf_counter() - started))
        with odbc.connect(modes["plain"]) as conn:
            sessions = {
                name: (int(n), int(late))
                for name, n, late in conn.cursor()
                .execute(
                    "SELECT application_name, count(*), count(*) FILTER (WHERE backend_start > ?)"
                    " FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'bench-%'"
                    " GROUP BY application_name",
                    rounds_began,
                )
                .fetchall()
            }
            encrypted = (
                conn.cursor()
                .execute(
                    "SELECT bool_and(s.ssl)::int FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
                    " WHERE a.application_name = 'bench-verified'"
                )
                .fetchval()
            )
        for q in clients.values():
            q.close()
    print(
        f"messages a second (push + pop), {BODY}-byte bodies, one thread, medians of {a.rounds} rounds in turns"
    )
    for line in lines:
        plain, tls = (statistics.median(rates[line, m]) for m in modes)
        spread = ", ".join(f"{m} {min(rates[line, m]):,.0f}-{max(rates[line, m]):,.0f}" for m in modes)
        print(
            f"  {line:7s} plain {plain:8,.0f}   verified TLS {tls:8,.0f}   TLS / plain {tls / plain:.2f}   ({spread})"
        )
    for mode in modes:
        n, late = sessions.get(f"bench-{mode}", (0, 0))
        print(f"{mode} sessions (each one handshake): {n} open, {late} of them opened during the rounds"
              f" ({a.rounds * len(lines) * a.messages:,} messages)")  # fmt: skip
    print(f"verified sessions all encrypted (pg_stat_ssl): {bool(encrypted)}")


if __name__ == "__main__":
    main()
