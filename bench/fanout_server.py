"""What a topic's publish costs the PostgreSQL server, without the Python client: `pgbench` (a C
client on the same machine, prepared statements, 4 clients) calls the SQL routines directly, as an
application in any language would, in the same database and queues as `bench.fanout`:

- push: one push routine call per transaction (the plain push);
- publish: one publish routine call per transaction, broadcast (every subscription matches) or
  partitioned (subscription i takes header p = i; each transaction one random p);
- by hand: BEGIN, one push call per matching queue, COMMIT (one round trip each);
- with --batch B, B messages a call: push_many, publish_many, and by hand one push_many per
  matching queue (rings fill B times sooner: keep --seconds short).

Publishes/s count messages, deliveries/s their copies; `x push` compares deliveries with the
plain push of the same run.

    ~/.cache/dbq/venv/bin/python -m bench.fanout_server
    ~/.cache/dbq/venv/bin/python -m bench.fanout_server --seconds 10 --subscriptions 1,8,16,64
    ~/.cache/dbq/venv/bin/python -m bench.fanout_server --batch 32 --seconds 1 --rounds 5

Writes nothing but its report (tee it to bench/results/fanout_server.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.fanout import BODY, PUBLISHERS, print_table, provision, queue_name, schema, take_turns
from bench.ring_vs_skiplocked import DB, admin, bench_database

from dbq.connection import from_url
from dbq.names import pg_quote

Script = str  # the text of one pgbench script


def routine(name: str) -> str:
    return f"{pg_quote(schema())}.{pg_quote(name)}"


# A push into a full ring answers -1 and is no error: the script fails it (a failed transaction
# fails the run), so that no push is counted that stored nothing. A publish says so itself.
FULL = "\\if :full\nSELECT 'the ring is full: fewer seconds or larger rings'::int;\n\\endif"


def batch_of(batch: int, p: int) -> tuple[str, str, str]:
    """Bodies (end to end) and their lengths, and the headers, of `batch` messages, as literals."""
    data = os.urandom(BODY * batch)
    if batch == 1:
        return f"'\\x{data.hex()}'::bytea", "", f"""'{{"p": {p}}}'"""
    headers = json.dumps([{"p": p}] * batch)
    return f"'\\x{data.hex()}'::bytea", f"'{','.join([str(BODY)] * batch)}'", f"'{headers}'"


def push_call(queue: int, p: int, batch: int) -> str:
    bodies, lengths, headers = batch_of(batch, p)
    if batch == 1:
        call = f"{routine(queue_name(queue) + '_push')}({bodies}, 0, {headers}) <= 0"
    else:
        call = f"position('-1' IN {routine(queue_name(queue) + '_push_many')}({bodies}, {lengths}, 0, {headers})) > 0"
    return f"SELECT {call} AS full \\gset\n{FULL}"


def publish_call(topic: str, p: int, batch: int) -> str:
    bodies, lengths, headers = batch_of(batch, p)
    if batch == 1:
        return f"SELECT {routine(topic + '_publish')}({bodies}, {headers}, NULL, 0);"
    return f"SELECT {routine(topic + '_publish_many')}({bodies}, {lengths}, {headers}, NULL, 0);"


def scripts(kind: str, shape: str, n: int, batch: int, topic: str = "") -> list[Script]:
    """The pgbench scripts of one configuration: partitioned ones one per value of p (pgbench picks
    one at random for each transaction; all the messages of a batch have the same p)."""
    out = []
    for p in range(n) if shape == "partitioned" else [0]:
        if kind == "publish":
            out.append(publish_call(topic, p, batch))
        else:
            targets = [p] if shape == "partitioned" else list(range(n))
            out.append("BEGIN;\n" + "\n".join(push_call(q, p, batch) for q in targets) + "\nCOMMIT;")
    return out


def pgbench(url: str, texts: list[Script], seconds: int) -> float:
    """Transactions per second of 4 pgbench clients running `texts` (chosen at random); fails
    loudly when a transaction failed."""
    s = from_url(url)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, text in enumerate(texts):
            path = Path(tmp) / f"s{i}.sql"
            path.write_text(text + "\n")
            files += ["-f", str(path)]
        done = subprocess.run(
            [shutil.which("pgbench") or "pgbench", "-h", s.host, "-p", str(s.port), "-U", s.username, "-n",
             "-M", "prepared", "-c", str(PUBLISHERS), "-j", "2", "-T", str(seconds), *files, s.database],
            env={**os.environ, "PGPASSWORD": s.password}, capture_output=True, text=True, check=False,
        )  # fmt: skip
    tps = re.search(r"^tps = ([\d.]+)", done.stdout, re.MULTILINE)
    failed = re.search(r"number of failed transactions: (\d+)", done.stdout)
    if done.returncode or tps is None or (failed and int(failed.group(1))):
        raise SystemExit(f"pgbench failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    return float(tps.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=5, help="seconds of each run")
    p.add_argument("--subscriptions", default="1,8,64", help="subscription counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, taking turns")
    p.add_argument("--batch", type=int, default=1, help="messages a call (push_many, publish_many)")
    a = p.parse_args()
    counts = [int(c) for c in a.subscriptions.split(",")]
    pg, url, _odbc = bench_database()
    provision(url, max(counts))
    median = take_turns(
        url,
        counts,
        a.rounds,
        lambda: pgbench(url, [push_call(0, 0, a.batch)], a.seconds) * a.batch,
        lambda topic, shape, n: (
            pgbench(url, scripts("publish", shape, n, a.batch, topic), a.seconds) * a.batch
        ),
        lambda shape, n: pgbench(url, scripts("by hand", shape, n, a.batch), a.seconds) * a.batch,
    )
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    print_table(
        median,
        counts,
        f"pgbench: {PUBLISHERS} clients, {a.batch} message(s) of {BODY} B a call, {a.seconds} s each,"
        f" medians of {a.rounds}",
    )


if __name__ == "__main__":
    main()
