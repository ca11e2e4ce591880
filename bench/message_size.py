"""What a message's size costs the ring on the local PostgreSQL, 4 pushers and 4 poppers (one
process each, single push and pop): delivered messages/s and MB/s for bodies of 300 B, 4 KiB,
64 KiB and 1 MiB, beside the same run's hand-built table (INSERT to push, DELETE ... FOR UPDATE
SKIP LOCKED to pop, the same bodies; through psycopg, the driver the ring client uses, and
through psqlODBC, as `table-odbc`) and the disk's write rate (one process writing and fsyncing
1 MiB blocks beside the database's files).

Bodies are random bytes (they do not compress), or with --bodies json JSON text of order records
(compressible, as most payloads are). With --compressions the ring is measured once per
spec.messages.compression named (`ring lz4`, `ring none`, ...; the hand-built table keeps the
server's default, pglz); without it, once with the default (lz4 where the server offers it).

The queue has the default ring.messageBytes (300): 4 KiB and larger bodies wait in its content
table, the slot holding their id. The ring of an earlier revision (--old, checked out in a
worktree and run from there) is measured in the same run at every size, taking turns with this
code, so a change in the machine's pace shows in both alike: the medians of --rounds rounds count.

    ~/.cache/dbq/venv/bin/python -m bench.message_size --old 8aaac7d
    ~/.cache/dbq/venv/bin/python -m bench.message_size --old 8aaac7d --rounds 5 --seconds 20
    ~/.cache/dbq/venv/bin/python -m bench.message_size --bodies json --compressions lz4,pglz,none --sizes "64 KiB,1 MiB"

Writes nothing but its report (tee it to bench/results/message_size.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pyodbc
from bench.ring_vs_skiplocked import DB, SCHEMA, admin, bench_database, sampled

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"300 B": 300, "4 KiB": 4 << 10, "64 KiB": 64 << 10, "1 MiB": 1 << 20}
RING_SIZE = 1024  # slots: at 1 MiB a full ring is 1 GiB of content
QUEUE = "benchq"
TABLES = ("table", "table-odbc")  # the hand-built table through psycopg, and through psqlODBC
POP = (
    f"DELETE FROM {SCHEMA}.sl_queue WHERE id = (SELECT id FROM {SCHEMA}.sl_queue ORDER BY id"
    " LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, body"
)


def body_of(kind: str, size: int) -> bytes:
    """A body of `size` bytes: random (incompressible), or JSON text of order records."""
    if kind == "random":
        return os.urandom(size)
    parts, length = [b"["], 1
    while length < size:
        n = len(parts) - 1  # the records before this one
        record = {"order": n, "region": "eu-west", "amount": n * 1.5, "sku": f"SKU-{n % 977:05d}"}
        parts.append(json.dumps(record).encode() + b",")
        length += len(parts[-1])
    text = b"".join(parts)
    return text[: size - 1] + b"]"


# --- one measurement, in a process of its own (--measure): the code under test is on its path ---
def push_worker(design: str, url: str, odbc: str, size: int, bodies: str, counter: Any, stop: Any) -> None:
    body = body_of(bodies, size)
    if design in TABLES:
        insert = f"INSERT INTO {SCHEMA}.sl_queue (body) VALUES "
        if design == "table":  # psycopg: %s placeholders, parameters in a tuple
            cur: Any = psycopg.connect(url, autocommit=True).cursor()
            statement, args = insert + "(%s)", ((body,),)
        else:
            cur = pyodbc.connect(odbc, autocommit=True).cursor()
            statement, args = insert + "(?)", (body,)
        n = 0
        while not stop.is_set():
            cur.execute(statement, *args)
            n += 1
            counter.value = n
        return
    if design == "rows":  # the row contract, as a worker in another language calls it
        cur = psycopg.connect(url, autocommit=True).cursor()
        n = 0
        while not stop.is_set():
            try:
                cur.execute(f"SELECT {SCHEMA}.{QUEUE}_send(%b)", (body,))
            except psycopg.errors.ConfigurationLimitExceeded:
                continue  # the ring is full: the poppers are behind
            n += 1
            counter.value = n
        return
    from dbq.client import connect

    push_loop(
        connect(url, QUEUE, schema=SCHEMA, pool_size=1, push_timeout=1, smart_batching=False),
        body,
        counter,
        stop,
    )


def push_loop(q: Any, body: bytes, counter: Any, stop: Any) -> None:
    """Push `body` with client `q` until `stop`, counting pushes (a full queue waits again)."""
    from dbq.client import QueueFull

    n = 0
    while not stop.is_set():
        try:
            q.push(body)
        except QueueFull:
            continue  # the poppers are behind: wait again
        n += 1
        counter.value = n


def pop_loop(q: Any, size: int, counter: Any, stop: Any) -> None:
    """Pop with client `q` until `stop`, counting messages (each of `size` bytes); -1 once ready."""
    counter.value = -1
    n = 0
    while not stop.is_set():
        m = q.pop()
        if m is not None:
            assert len(m.body) == size
            n += 1
            counter.value = n


def pop_worker(design: str, url: str, odbc: str, size: int, bodies: str, counter: Any, stop: Any) -> None:
    if design in TABLES:
        if design == "table":
            cur: Any = psycopg.connect(url, autocommit=True).cursor(binary=True)
        else:
            cur = pyodbc.connect(odbc, autocommit=True).cursor()
        counter.value = -1  # ready
        n = 0
        while not stop.is_set():
            cur.execute(POP)
            row = cur.fetchone() if cur.rowcount > 0 else None
            if row is not None:
                assert len(row[1]) == size
                n += 1
                counter.value = n
            else:
                time.sleep(0.001)
        return
    if design == "rows":
        cur = psycopg.connect(url, autocommit=True).cursor(binary=True)
        counter.value = -1
        n = 0
        while not stop.is_set():
            rows = cur.execute(f"SELECT msg_id, body FROM {SCHEMA}.{QUEUE}_read(1, 0, 50)").fetchall()
            if rows:
                assert len(rows[0][1]) == size
                n += 1
                counter.value = n
        return
    from dbq.client import connect

    pop_loop(
        connect(url, QUEUE, schema=SCHEMA, pool_size=1, pop_timeout=0.05, smart_batching=False),
        size,
        counter,
        stop,
    )


def worker(role: str, *args: Any) -> None:
    (push_worker if role == "push" else pop_worker)(*args)


def prepare(design: str, url: str, odbc: str, compression: str) -> None:
    cur = admin(odbc)
    cur.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    if design in TABLES:
        cur.execute(f"CREATE SCHEMA {SCHEMA}")
        cur.execute(f"CREATE TABLE {SCHEMA}.sl_queue (id bigserial PRIMARY KEY, body bytea NOT NULL)")
        return
    from dbq.backends.odbc_ring import OdbcRing
    from dbq.connection import from_url
    from dbq.contract.ring import RingTarget
    from dbq.names import QueueNames

    OdbcRing(
        from_url(url), RingTarget(QueueNames(SCHEMA, QUEUE), RING_SIZE, 300, compression=compression)
    ).apply()
    cur.execute(f"VACUUM ANALYZE {SCHEMA}.{QUEUE}_ring")


def measure(
    design: str, size: int, url: str, odbc: str, seconds: float, workers: int, bodies: str, compression: str
) -> float:
    """Delivered messages per second (the poppers' counts) of `workers` pushers and as many
    poppers, one process each, over `seconds` once all of them are connected."""
    prepare(design, url, odbc, compression)
    args = [("push", design, url, odbc, size, bodies)] * workers + [
        ("pop", design, url, odbc, size, bodies)
    ] * workers
    # The pushers count once their first push is done, the poppers say -1 once connected.
    return statistics.fmean(sampled(worker, args, seconds, counted=range(workers, 2 * workers)))


def disk_rate(directory: str, seconds: float) -> float:
    """MB/s of one process writing 1 MiB blocks to a file in `directory`, fsyncing each."""
    block = os.urandom(1 << 20)
    fd, path = tempfile.mkstemp(dir=directory, prefix="dbq-bench-disk")
    written, started = 0, time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            os.write(fd, block)
            os.fsync(fd)
            written += len(block)
    finally:
        os.close(fd)
        os.unlink(path)
    return written / (time.monotonic() - started) / 1e6


def run_measurement(
    code: Path, design: str, size: int, seconds: float, workers: int, bodies: str, compression: str = ""
) -> float:
    """One measurement in a process whose `dbq` is the package under `code` ('' compression: the
    default, the only choice older code has)."""
    env = {**os.environ, "PYTHONPATH": f"{code / 'operator'}:{ROOT}"}
    chosen = ["--compression", compression] if compression else []
    out = subprocess.run(
        [sys.executable, "-m", "bench.message_size", "--measure", design, "--size", str(size),
         "--seconds", str(seconds), "--workers", str(workers), "--bodies", bodies, *chosen],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=seconds * 10 + 300,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"measurement {design} {size} B under {code} failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["delivered"])


def worktree(revision: str) -> Path:
    path = Path(tempfile.gettempdir()) / f"dbq-bench-{revision}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), revision], cwd=ROOT, check=True)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", help="git revision of earlier code, whose ring is measured beside this one")
    p.add_argument("--workers", type=int, default=4, help="pushers, and as many poppers")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of each run")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, taking turns")
    p.add_argument("--measure", choices=["ring", "rows", *TABLES], help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=300, help=argparse.SUPPRESS)
    p.add_argument("--compression", default="", help=argparse.SUPPRESS)
    p.add_argument("--bodies", choices=["random", "json"], default="random", help="what the bodies hold")
    p.add_argument(
        "--compressions", default="", help="spec.messages.compression values to measure the ring with"
    )
    p.add_argument(
        "--sizes", default=",".join(SIZES), help="body sizes, comma-separated, of: " + ", ".join(SIZES)
    )
    a = p.parse_args()
    if a.measure:  # a child: the database exists
        from dbq.devstack import Stack

        pg = Stack().component("postgres")
        print(
            json.dumps(
                {
                    "delivered": measure(
                        a.measure,
                        a.size,
                        pg.url(DB),
                        pg.odbc(DB),
                        a.seconds,
                        a.workers,
                        a.bodies,
                        a.compression,
                    )
                }
            )
        )
        return
    pg, _url, _odbc = bench_database()
    codes = {"this": ROOT} | ({"old": worktree(a.old)} if a.old else {})
    sizes = {label: SIZES[label] for label in a.sizes.split(",")}
    compressions = a.compressions.split(",") if a.compressions else [""]
    this = compressions[0] or "this"  # the ring figures of the summary
    rates: dict[str, list[float]] = {}
    disk: list[float] = []
    for round_ in range(1, a.rounds + 1):
        disk.append(disk_rate(str(pg.dir), a.seconds))
        print(f"{'disk, 1 MiB blocks fsynced':36} #{round_} {disk[-1]:10,.1f} MB/s", flush=True)
        for label, size in sizes.items():
            runs = [("ring", "this", c) for c in compressions] + [
                ("table", "this", ""),
                ("table-odbc", "this", ""),
            ]
            runs += [("ring", "old", "")] if a.old else []
            for design, code, compression in runs:
                key = f"{design} {compression or code} {label}"
                rate = run_measurement(codes[code], design, size, a.seconds, a.workers, a.bodies, compression)
                rates.setdefault(key, []).append(rate)
                print(f"{key:36} #{round_} {rate:10,.1f} /s {rate * size / 1e6:8,.1f} MB/s", flush=True)
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    median = {key: statistics.median(values) for key, values in rates.items()}
    disk_mb = statistics.median(disk)
    print(f"\n{a.workers} pushers + {a.workers} poppers, single push and pop, {a.seconds:g} s x {a.rounds}"
          f" rounds (median); ring.messageBytes 300, {RING_SIZE} slots; {a.bodies} bodies;"
          f" ring compression {compressions[0] or 'the default'}")  # fmt: skip
    print(f"disk: one process writing 1 MiB blocks, fsync each: {disk_mb:,.1f} MB/s")
    print(f"{'body':>8}{'ring /s':>10}{'MB/s':>8}{'table /s':>10}{'MB/s':>8}{'ring/table':>11}"
          f"{'table-odbc /s':>14}{'ring/odbc':>10}{'of disk':>9}{'spread':>8}")  # fmt: skip
    for label, size in sizes.items():
        ring, table = median[f"ring {this} {label}"], median[f"table this {label}"]
        odbc_table = median[f"table-odbc this {label}"]
        values = rates[f"ring {this} {label}"]
        spread = (max(values) - min(values)) / max(values)
        print(f"{label:>8}{ring:10,.1f}{ring * size / 1e6:8,.1f}{table:10,.1f}{table * size / 1e6:8,.1f}"
              f"{ring / table:11.2f}{odbc_table:14,.1f}{ring / odbc_table:10.2f}"
              f"{ring * size / 1e6 / disk_mb:9.0%}{spread:8.0%}")  # fmt: skip
    for compression in compressions[1:]:
        print(f"ring with compression {compression}, against {compressions[0]}: " + ", ".join(
            f"{label} {median[f'ring {compression} {label}']:,.1f} /s"
            f" ({median[f'ring {compression} {label}'] / median[f'ring {this} {label}']:.2f})"
            for label in sizes
        ))  # fmt: skip
    for label in sizes if a.old else ():
        old, new = median[f"ring old {label}"], median[f"ring {this} {label}"]
        print(
            f"{label}: this code {new:,.1f} /s, the code of {a.old} {old:,.1f} /s: {new / old:.2f}"
            f" (its runs: {', '.join(f'{v:,.0f}' for v in rates[f'ring old {label}'])};"
            f" this code's: {', '.join(f'{v:,.0f}' for v in rates[f'ring {this} {label}'])})"
        )


if __name__ == "__main__":
    main()
