"""What TLS costs a client: the same calls over a plain connection and over a verified one (the
Secret's `ca`: sslmode verify-full), in turns, on the stack's PostgreSQL (a ring) and Cassandra
(pipes).

  single   push then pop, one message at a time, one thread
  batch    push_many(100) then pop_many(100), one thread

Each line a round, the two connections taking turns (--rounds, medians); 300-byte bodies. The
handshakes: how many connections each client had open at the end and how many of them it opened
during the rounds (a call never opens one): PostgreSQL's sessions by application_name, the
Cassandra driver's connections by their local ports; and whether the verified ones are encrypted
as the server sees them (pg_stat_ssl, system_views.clients).

    ~/.cache/dbq/venv/bin/python -m bench.tls_cost --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.client import PipesQueue, Queue
from dbq.connection import from_secret_data, odbc
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database
from tests.test_tls import cassandra_tls_of, secret

BODY = 300
BATCH = 100
SCHEMA, QUEUE = "bench_tls", "tls"
Client = Queue | PipesQueue


def single(q: Client, n: int) -> None:
    for _ in range(n):
        q.push(os.urandom(BODY))
        assert q.pop(timeout=2) is not None


def batch(q: Client, n: int) -> None:
    for _ in range(n // BATCH):
        q.push_many([os.urandom(BODY) for _ in range(BATCH)])
        got = 0
        while got < BATCH:
            got += len(q.pop_many(BATCH - got, timeout=2))


LINES: dict[str, Callable[[Client, int], None]] = {"single": single, "batch": batch}


class Postgres:
    name = "PostgreSQL ring"

    def __init__(self, url: str, ca: str) -> None:
        self.modes = {
            "plain": from_secret_data(
                secret(f"{url}?sslmode=disable&application_name=bench-plain"), "postgres"
            ),
            "verified": from_secret_data(secret(f"{url}?application_name=bench-verified", ca), "postgres"),
        }
        names = QueueNames(SCHEMA, QUEUE)
        OdbcRing(self.modes["plain"], RingTarget(names, 10_000, 512)).apply()
        self.clients: dict[str, Client] = {mode: Queue(s, names) for mode, s in self.modes.items()}

    def mark(self) -> Any:
        with odbc.connect(self.modes["plain"]) as conn:
            return conn.cursor().execute("SELECT now()").fetchval()

    def connections(self, mode: str, since: Any) -> tuple[int, int, bool]:
        """(open, opened since `since`, all encrypted) for the mode's client."""
        with odbc.connect(self.modes["plain"]) as conn:
            row = (
                conn.cursor()
                .execute(
                    "SELECT count(*), count(*) FILTER (WHERE a.backend_start > ?), coalesce(bool_and(s.ssl), false)::int"
                    " FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
                    " WHERE a.datname = current_database() AND a.application_name = ?",
                    since,
                    f"bench-{mode}",
                )
                .fetchone()
            )
        return int(row[0]), int(row[1]), bool(int(row[2]))


class Cassandra:
    name = "Cassandra pipes"

    def __init__(self, url: str, ca: str) -> None:
        self.modes = {
            "plain": from_secret_data(secret(url), "cassandra"),
            "verified": from_secret_data(secret(url, ca), "cassandra"),
        }
        spec = QueueSpec.model_validate(
            {
                "backend": "cassandra",
                "design": "pipes",
                "connection": {"secretRef": {"name": "s"}, "schema": SCHEMA},
            }
        )
        backend = open_backend(spec, QUEUE, self.modes["plain"])
        backend.apply()
        backend.close()
        self.clients = {mode: PipesQueue(s, QueueNames(SCHEMA, QUEUE)) for mode, s in self.modes.items()}

    def ports(self, mode: str) -> set[int]:
        session = self.clients[mode].session  # type: ignore[union-attr]
        return {p._connection._socket.getsockname()[1] for p in session._pools.values() if p._connection}

    def mark(self) -> dict[str, set[int]]:
        return {mode: self.ports(mode) for mode in self.modes}

    def connections(self, mode: str, since: dict[str, set[int]]) -> tuple[int, int, bool]:
        now = self.ports(mode)
        encrypted = cassandra_tls_of(self.clients[mode].session)  # type: ignore[union-attr]
        return len(now), len(now - since[mode]), bool(encrypted) and all(encrypted)


@contextmanager
def databases(stack: Stack) -> Iterator[list[Postgres | Cassandra]]:
    with scratch_database(stack, "bench_tls") as db:
        made: list[Postgres | Cassandra] = [
            Postgres(db.url, db.ca),
            Cassandra(stack.cassandra.url(), db.ca),
        ]
        try:
            yield made
        finally:
            for d in made:
                for q in d.clients.values():
                    q.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=2000, help="messages a line a round")
    a = p.parse_args()
    stack = Stack()
    stack.up(("postgres", "cassandra"))
    with databases(stack) as made:
        for d in made:
            for q in d.clients.values():
                q.push(b"warm")  # the connections open here
                assert q.pop(timeout=2) is not None
        marks = [d.mark() for d in made]
        rates: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(a.rounds):
            for d in made:
                for line, run in LINES.items():
                    for mode, q in d.clients.items():
                        started = time.perf_counter()
                        run(q, a.messages)
                        rates.setdefault((d.name, line, mode), []).append(
                            a.messages / (time.perf_counter() - started)
                        )
        print(
            f"messages a second (push + pop), {BODY}-byte bodies, one thread, medians of {a.rounds} rounds in turns"
        )
        for d, mark in zip(made, marks, strict=True):
            print(d.name)
            for line in LINES:
                plain, tls = (statistics.median(rates[d.name, line, m]) for m in d.modes)
                spread = ", ".join(
                    f"{m} {min(rates[d.name, line, m]):,.0f}-{max(rates[d.name, line, m]):,.0f}"
                    for m in d.modes
                )
                print(
                    f"  {line:7s} plain {plain:8,.0f}   verified TLS {tls:8,.0f}   TLS / plain {tls / plain:.2f}   ({spread})"
                )
            for mode in d.modes:
                open_, opened, encrypted = d.connections(mode, mark)
                print(f"  {mode} connections (a handshake each): {open_} open, {opened} opened during the rounds"
                      f" ({a.rounds * len(LINES) * a.messages:,} messages); all encrypted: {encrypted}")  # fmt: skip


if __name__ == "__main__":
    main()
