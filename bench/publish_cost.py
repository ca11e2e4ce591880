"""What one push and one publish cost the PostgreSQL server, without the client, the network or
the wait for the disk: a DO block calls the routine and commits, N times (synchronous_commit
off), and the time per call is reported. Each loop starts right after a CHECKPOINT. The queues and topics are the ones `bench.fanout`
makes (ring queues of 300-byte messages with one header; topics of 1 and 64 partitioned
subscriptions, 8 broadcast ones).

With --old REV the same calls run on routines made by the code of REV (checked out in a worktree,
provisioned from there into a schema of its own in the same database), taking turns with this
code's: medians of --rounds rounds, and their ratios.

    ~/.cache/dbq/venv/bin/python -m bench.publish_cost --old 7d6f858

Writes nothing but its report (tee it to bench/results/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import psycopg
from bench import fanout
from bench.message_size import ROOT, worktree
from bench.ring_vs_skiplocked import bench_database

from dbq.contract.topics import TopicNames
from dbq.names import QueueNames
from dbq.names import pg_quote as quote

# (label, topic or "" for a plain push, the headers of each call as an SQL expression of i)
CALLS = [
    ("push", "", "'{\"p\": 0}'"),
    ("publish, 1 partitioned subscription", "partitioned_1", "'{\"p\": 0}'"),
    ("publish, 1 of 64 partitioned, always the same", "partitioned_64", "'{\"p\": 5}'"),
    ("publish, 1 of 64 partitioned, each in turn", "partitioned_64", "json_build_object('p', i % 64)::text"),
    ("publish, 8 broadcast subscriptions", "broadcast_8", "'{\"p\": 0}'"),
]
TOPICS = (("partitioned", 1), ("partitioned", 64), ("broadcast", 8))
PROVISION = (
    "import sys; from bench import fanout; url = sys.argv[1]; fanout.provision(url, 64)\n"
    f"for shape, n in {TOPICS!r}: fanout.make_topic(url, shape, n).close()"
)


def provision(code: str, url: str, schema: str) -> None:
    """The queues and topics, made by the code checked out at `code`, in `schema`."""
    env = os.environ | {"PYTHONPATH": f"{code}/operator:{code}", fanout.SCHEMA_VARIABLE: schema}
    subprocess.run([sys.executable, "-c", PROVISION, url], cwd=code, env=env, check=True)


def statement(schema: str, topic: str, headers: str, calls: int) -> str:
    body = "'\\x" + "ab" * 300 + "'::bytea"
    if topic:
        call = f"{quote(schema)}.{quote(TopicNames(schema, topic).publish)}({body}, {headers}, NULL, 0)"
    else:
        push = QueueNames(schema, fanout.queue_name(0)).routine("push")
        call = f"{quote(schema)}.{quote(push)}({body}, 0, {headers})"
    return f"DO $$ DECLARE x text; BEGIN FOR i IN 1..{calls} LOOP x := {call}; COMMIT; END LOOP; END $$"


def drain(conn: psycopg.Connection, schema: str) -> None:
    """Empty every queue (pop_many at most once, in SQL: a client speaks its own schema version
    only), so that rings never fill."""
    for i in range(64):
        pop_many = QueueNames(schema, fanout.queue_name(i)).routine("pop_many")
        while (
            len(conn.execute(f"SELECT {quote(schema)}.{quote(pop_many)}(5000, 0)").fetchone()[0] or b"") > 64
        ):
            pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", help="git revision of earlier code, measured beside this one")
    p.add_argument("--calls", type=int, default=10_000, help="calls of each loop")
    p.add_argument("--rounds", type=int, default=5, help="loops of each call and code, taking turns")
    a = p.parse_args()
    _pg, url, _odbc = bench_database()
    codes = {"this": str(ROOT)} | ({"old": str(worktree(a.old))} if a.old else {})
    for label, code in codes.items():
        provision(code, url, f"cost_{label}")
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET synchronous_commit = off")
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.rounds):
        for call, topic, headers in CALLS:
            for label in codes:
                schema = f"cost_{label}"
                drain(conn, schema)
                conn.execute("CHECKPOINT")  # each loop starts alike: its first writes of a page image it
                began = time.perf_counter()
                conn.execute(statement(schema, topic, headers, a.calls))
                times.setdefault((call, label), []).append((time.perf_counter() - began) / a.calls * 1e6)
    conn.close()
    print(f"\nserver time per call, µs (medians of {a.rounds} loops of {a.calls:,} calls, each committed)")
    for call, _topic, _headers in CALLS:
        this = statistics.median(times[(call, "this")])
        line = f"{call:48s} this code {this:6.1f}"
        if a.old:
            old = statistics.median(times[(call, "old")])
            line += f"   {a.old} {old:6.1f}   this / old {this / old:.2f}"
        print(line)
        for label in codes:
            print(f"    {label:5s} loops: {', '.join(f'{t:.1f}' for t in times[(call, label)])}")


if __name__ == "__main__":
    main()
