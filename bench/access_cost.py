"""What least privilege costs a call (PostgreSQL): the same workloads through a QueueUser's login
(send and receive only), through the owner's side (the operator's login, a member of the owner
role), and, as the baseline, through routines made without SECURITY DEFINER and the pinned
search_path (as every version before 20 made them), called by the owner.

Workloads, one thread, smart batching off: single push then pop, single acquire then ack,
push_many then pop_many in batches of 100, and pushes then pops called n times within one
statement each (the server's time per call alone, without the round trip). Each round runs every variant once, in a rotating
order, so that the machine's drift falls on all alike; the figures are medians of the rounds.

    ~/.cache/dbq/venv/bin/python -m bench.access_cost [--rounds 5] [--messages 2000]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from collections.abc import Callable

import psycopg

from dbq.backends.odbc_ring import OdbcRing
from dbq.backends.postgres.access import PgLogins
from dbq.backends.postgres.sql import PgRing
from dbq.client import Queue, connect
from dbq.connection import from_url, odbc
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames, group_role, login_role
from tests.local import scratch_database

SCHEMA = "bench_access"
BATCH = 100


class Invoker(PgRing):
    """The routines as versions before 20 made them: run as their caller, no search_path of their own."""

    def template_values(self) -> dict[str, object]:
        return super().template_values() | {"definer": ""}


def single_push_pop(q: Queue, n: int) -> None:
    for i in range(n):
        q.push(b"m%06d" % i)
    for _ in range(n):
        assert q.pop(timeout=0) is not None


def single_acquire_ack(q: Queue, n: int) -> None:
    q.push_many([b"a%06d" % i for i in range(n)])
    for _ in range(n):
        m = q.acquire(timeout=0)
        assert m is not None
        m.ack()


def batches(q: Queue, n: int) -> None:
    total = n * 10
    for start in range(0, total, BATCH):
        q.push_many([b"b%06d" % i for i in range(start, start + BATCH)])
    taken = 0
    while taken < total:
        got = q.pop_many(BATCH, timeout=0)
        assert got
        taken += len(got)


def in_one_statement(q: Queue, n: int) -> None:
    """n pushes, then n pops, each n calls of the routine in one statement: the server's time
    per call alone, without a round trip's (the cost of SECURITY DEFINER and the pinned path)."""
    schema, queue = q.names.schema, q.names.queue
    with psycopg.connect(q_urls[id(q)], autocommit=True) as conn:
        pushed = conn.execute(
            f'SELECT count("{schema}"."{queue}_push"(%s, 0, NULL)) FROM generate_series(1, %s)', (b"s", n)
        ).fetchone()
        popped = conn.execute(
            f'SELECT count("{schema}"."{queue}_pop"(0)) FROM generate_series(1, %s)', (n,)
        ).fetchone()
    assert pushed == popped == (n,)


def describe_in_one_statement(q: Queue, n: int) -> None:
    """The describe routine called n times in one statement: reads only, no WAL and no commit to
    wait for, so what differs between the variants is the call itself."""
    schema, queue = q.names.schema, q.names.queue
    with psycopg.connect(q_urls[id(q)], autocommit=True) as conn:
        called = conn.execute(
            f'SELECT count(("{schema}"."{queue}_describe"()).o_version) FROM generate_series(1, %s)', (n,)
        ).fetchone()
    assert called == (n,)


WORKLOADS: dict[str, Callable[[Queue, int], None]] = {
    "push + pop, single": single_push_pop,
    "acquire + ack, single": single_acquire_ack,
    "push_many + pop_many, 100": batches,
    "push + pop, in one statement": in_one_statement,
    "describe, in one statement": describe_in_one_statement,
}
# The url each client was opened with (in_one_statement opens its own session as the same login).
q_urls: dict[int, str] = {}


def rate(q: Queue, work: Callable[[Queue, int], None], n: int) -> float:
    """Messages a second (batches move 10 x n)."""
    started = time.perf_counter()
    work(q, n)
    took = time.perf_counter() - started
    moved = n * 10 if work is batches else n
    return moved / took


def spread(over: list[float], under: list[float]) -> str:
    """The median, lowest and highest of the rounds' ratios over / under."""
    ratios = sorted(a / b for a, b in zip(over, under, strict=True))
    return f"{statistics.median(ratios):.3f} [{ratios[0]:.2f} - {ratios[-1]:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="on",
        help="the clients' synchronous_commit: off takes the disk's flush time (and its noise) out of every call",
    )
    opts = parser.parse_args(argv)
    stack = Stack()
    stack.component("postgres").start()
    with scratch_database(stack, "dbq_bench_access") as db:
        operator = from_url(db.url)
        for name in ("secured", "plain"):
            OdbcRing(operator, RingTarget(QueueNames(SCHEMA, name), 65_536, 64)).apply()
        plain = Invoker(RingTarget(QueueNames(SCHEMA, "plain"), 65_536, 64, database=db.name))
        conn = odbc.connect(operator)
        try:
            cur = conn.cursor()
            for statement in plain.create_routines():
                cur.execute(statement)
            login, password = login_role("bench", secrets.token_hex(3)), secrets.token_urlsafe(24)
            logins = PgLogins(cur)
            logins.set_login(login, password, 20)
            for right in ("send", "receive"):
                logins.grant(login, group_role(db.name, SCHEMA, "secured", right))
            app_url = f"postgresql://{login}:{password}@{operator.host}:{operator.port}/{operator.database}"
            sync = f"?options=-c%20synchronous_commit%3D{opts.synchronous_commit}"
            opened = {
                "plain routines, owner": (db.url + sync, "plain"),
                "secured routines, owner": (db.url + sync, "secured"),
                "secured routines, login": (app_url + sync, "secured"),
            }
            variants = {
                v: connect(url, name, schema=SCHEMA, smart_batching=False)
                for v, (url, name) in opened.items()
            }
            q_urls.update({id(variants[v]): url for v, (url, _) in opened.items()})
            figures: dict[tuple[str, str], list[float]] = {}
            order = list(variants)
            for r in range(opts.rounds):
                turn = order[r % len(order) :] + order[: r % len(order)]
                for workload, work in WORKLOADS.items():
                    for variant in turn:
                        q = variants[variant]
                        assert isinstance(q, Queue)
                        figures.setdefault((workload, variant), []).append(rate(q, work, opts.messages))
            for q in variants.values():
                q.close()
            logins.drop(login)
        finally:
            conn.close()
    print(
        f"messages/s, medians of {opts.rounds} interleaved rounds ({opts.messages} messages a round, x10 in batches);"
    )
    print(
        f"synchronous_commit {opts.synchronous_commit}; ratios: the median of each round's own ratio [lowest - highest]"
    )
    header = f"{'':28}{'plain, owner':>14}{'secured, owner':>16}{'secured, login':>16}"
    print(f"{header}{'login / owner':>26}{'secured / plain':>26}")
    for workload in WORKLOADS:
        invoker, owner_, login_ = (figures[(workload, v)] for v in order)
        medians = "".join(
            f"{statistics.median(f):{w},.0f}" for f, w in ((invoker, 14), (owner_, 16), (login_, 16))
        )
        print(f"{workload:28}{medians}{spread(login_, owner_):>26}{spread(owner_, invoker):>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
