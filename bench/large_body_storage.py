"""Where the time of a large body goes on this machine, and whether another way of storing it
would beat the hand-built table: 4 pushers and 4 poppers (one process each, single push and pop)
of random bodies, delivered messages/s, with the CPU's busy share, the disk's write rate and the
WAL's rate measured over the same window. Designs:

- `table`: the hand-built table of bench.message_size (INSERT, DELETE ... SKIP LOCKED; the body
  TOASTed, deleted with its row, vacuumed later);
- `ring`: the dbq ring (the body in its content table, the slot holding its id), with
  `compression: none`, as random bodies want, through the Python client (packed records);
- `rows`: the same ring through its row contract (`send`, `read(1, 0)`), as a worker in another
  language calls it: the body answered as a column of the row, not packed into a record;
- `generations`: a pointer table and 8 content tables, each taking the bodies of one range of
  ids in turn; a popper deletes the pointer only, and a janitor TRUNCATEs a content table once
  no pointer into its range is left (no delete of the body, no vacuum, and its pages are never
  written to the table's file when the TRUNCATE comes first);
- `chunks`: as `generations`, with each body cut into 8000-byte rows of its own (no TOAST).

Only `table`, `ring` and `rows` are products; the other two are sketches in SQL, here to measure whether
the storage is what bounds a large body.

    ~/.cache/dbq/venv/bin/python -m bench.large_body_storage --rounds 2

Writes nothing but its report (tee it to bench/results/large_body_storage.txt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
from bench.message_size import SIZES
from bench.message_size import measure as measure_product
from bench.ring_vs_skiplocked import DB, SCHEMA, admin, bench_database, sampled

TABLES = 8  # content tables of the sketches, used in turn
SKETCH_POP = f"SELECT {SCHEMA}.pop()"


def range_of(size: int) -> int:
    """Ids per content table: 16 MiB of bodies, far below shared_buffers (a TRUNCATE then finds
    most pages not yet written)."""
    return max(16, (16 << 20) // size)


def prepare_sketch(url: str, design: str, size: int) -> None:
    chunked = design == "chunks"
    per = range_of(size)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        c.execute(f"CREATE SCHEMA {SCHEMA}")
        c.execute(f"CREATE TABLE {SCHEMA}.pointers (id bigint PRIMARY KEY)")
        c.execute(f"CREATE SEQUENCE {SCHEMA}.ids")
        inserts, selects = [], []
        for k in range(TABLES):
            table = f"{SCHEMA}.content_{k}"
            if chunked:
                c.execute(
                    f"CREATE TABLE {table} (id bigint, n int, part bytea NOT NULL, PRIMARY KEY (id, n))"
                )
                c.execute(f"ALTER TABLE {table} ALTER part SET STORAGE PLAIN")
                inserts.append(
                    f"INSERT INTO {table} SELECT i, n, substring(b FROM n * 8000 + 1 FOR 8000)"
                    " FROM generate_series(0, (octet_length(b) - 1) / 8000) n;"
                )
                selects.append(
                    f"SELECT string_agg(part, ''::bytea ORDER BY n) INTO o FROM {table} WHERE id = i;"
                )
            else:
                c.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, body bytea NOT NULL)")
                c.execute(f"ALTER TABLE {table} ALTER body SET STORAGE EXTERNAL")
                inserts.append(f"INSERT INTO {table} VALUES (i, b);")
                selects.append(f"SELECT body INTO o FROM {table} WHERE id = i;")

        def ladder(statements: list[str]) -> str:
            return "\n".join(f"{'ELSIF' if k else 'IF'} g = {k} THEN {s}" for k, s in enumerate(statements))

        # A push that would lap onto a content table not yet emptied is refused (-1): try again.
        c.execute(f"""CREATE FUNCTION {SCHEMA}.push(b bytea) RETURNS bigint LANGUAGE plpgsql AS $$
          DECLARE i bigint := nextval('{SCHEMA}.ids'); g int := (i / {per}) % {TABLES};
          BEGIN
            IF i - coalesce((SELECT min(id) FROM {SCHEMA}.pointers), i) >= {per * (TABLES - 2)} THEN RETURN -1; END IF;
            {ladder(inserts)} END IF;
            INSERT INTO {SCHEMA}.pointers VALUES (i);
            RETURN i;
          END $$""")  # fmt: skip
        c.execute(f"""CREATE FUNCTION {SCHEMA}.pop(OUT o bytea) LANGUAGE plpgsql AS $$
          DECLARE i bigint; g int;
          BEGIN
            DELETE FROM {SCHEMA}.pointers WHERE id = (SELECT id FROM {SCHEMA}.pointers ORDER BY id LIMIT 1
              FOR UPDATE SKIP LOCKED) RETURNING id INTO i;
            IF i IS NULL THEN RETURN; END IF;
            g := (i / {per}) % {TABLES};
            {ladder(selects)} END IF;
          END $$""")  # fmt: skip


def sketch_worker(role: str, url: str, size: int, counter: Any, stop: Any) -> None:
    """A pusher, a popper or the janitor of a sketch, counting what it did."""
    conn = psycopg.connect(url, autocommit=True)
    if role == "janitor":
        janitor(conn, size, counter, stop)
        return
    cur = conn.cursor(binary=True)
    body, n = os.urandom(size), 0
    counter.value = -1
    while not stop.is_set():
        if role == "push":
            cur.execute(f"SELECT {SCHEMA}.push(%b)", (body,))
            done = cur.fetchone()[0] > 0
        else:
            got = cur.execute(SKETCH_POP).fetchone()[0]
            done = got is not None
            assert got is None or len(got) == size
        if done:
            n += 1
            counter.value = n
        else:
            time.sleep(0.001)


def janitor(conn: psycopg.Connection, size: int, counter: Any, stop: Any) -> None:
    """TRUNCATE each content table whose last range holds no message left, counting them."""
    per, emptied, n = range_of(size), [-1] * TABLES, 0
    conn.execute("SET lock_timeout = '50ms'")
    counter.value = -1
    low_sql = (
        f"SELECT coalesce((SELECT min(id) FROM {SCHEMA}.pointers), (SELECT last_value + 1 FROM {SCHEMA}.ids))"
    )
    while not stop.is_set():
        low = conn.execute(low_sql).fetchone()[0]
        lap_done = [((low // per) - k) // TABLES for k in range(TABLES)]  # the last lap of table k below low
        for k in (k for k in range(TABLES) if lap_done[k] > emptied[k]):
            try:
                with conn.transaction():
                    conn.execute(f"LOCK TABLE {SCHEMA}.content_{k} IN ACCESS EXCLUSIVE MODE")
                    # Read again under the lock: a push that committed meanwhile counts.
                    low = conn.execute(low_sql).fetchone()[0]
                    if (conn.execute(f"SELECT max(id) FROM {SCHEMA}.content_{k}").fetchone()[0] or -1) < low:
                        conn.execute(f"TRUNCATE {SCHEMA}.content_{k}")
                        emptied[k], n = lap_done[k], n + 1
                        counter.value = n
            except psycopg.errors.LockNotAvailable:
                pass  # a pusher or popper holds it: next time
        time.sleep(0.005)


class Machine:
    """The machine's CPU, disk and WAL counters over a window: started at construction."""

    def __init__(self, url: str, data_dir: str) -> None:
        self.url = url
        source = subprocess.run(
            ["df", "--output=source", data_dir], capture_output=True, text=True, check=True
        )
        self.device = Path(source.stdout.split()[-1]).name  # vda: the disk under the database's files
        self.first = self.read()

    def read(self) -> tuple[float, int, int, int, int]:
        """Now; CPU ticks busy and in all; bytes written to the disk; bytes of WAL."""
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
        sectors = next(
            int(f[9]) for f in (line.split() for line in Path("/proc/diskstats").read_text().splitlines())
            if f[2] == self.device
        )  # fmt: skip
        with psycopg.connect(self.url, autocommit=True) as c:
            wal = int(c.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()[0])
        return time.monotonic(), sum(ticks) - ticks[3] - ticks[4], sum(ticks), sectors * 512, wal

    def since(self) -> dict[str, float]:
        (t0, busy0, all0, disk0, wal0), (t1, busy1, all1, disk1, wal1) = self.first, self.read()
        return {
            "cpu": (busy1 - busy0) / max(all1 - all0, 1),
            "disk": (disk1 - disk0) / (t1 - t0) / 1e6,
            "wal": (wal1 - wal0) / (t1 - t0) / 1e6,
        }


def measure(design: str, size: int, url: str, odbc: str, seconds: float) -> float:
    """Delivered messages/s of one design (4 + 4). The ring stores its bodies uncompressed, as the
    sketches do (spec.messages.compression none: random bodies do not compress)."""
    if design in ("table", "ring", "rows"):
        return measure_product(
            design, size, url, odbc, seconds, 4, "random", "" if design == "table" else "none"
        )
    prepare_sketch(url, design, size)
    args = [("push", url, size)] * 4 + [("pop", url, size)] * 4 + [("janitor", url, size)]
    return statistics.fmean(sampled(sketch_worker, args, seconds, counted=range(4, 8)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of each run")
    p.add_argument("--rounds", type=int, default=2, help="runs of each design, taking turns")
    p.add_argument(
        "--sizes", default="64 KiB,1 MiB", help="body sizes, comma-separated, of: " + ", ".join(SIZES)
    )
    p.add_argument("--designs", default="table,ring,rows,generations,chunks", help="designs, comma-separated")
    a = p.parse_args()
    pg, url, odbc = bench_database()
    designs = tuple(a.designs.split(","))
    sizes = {label: SIZES[label] for label in a.sizes.split(",")}
    rates: dict[tuple[str, str], list[float]] = {}
    print(
        f"{'design':12}{'body':>8}{'round':>6}{'/s':>10}{'MB/s':>8}{'cpu busy':>10}{'disk MB/s':>11}{'WAL MB/s':>10}"
    )
    for round_ in range(1, a.rounds + 1):
        for label, size in sizes.items():
            for design in designs:
                machine = Machine(url, str(pg.dir))
                rate = measure(design, size, url, odbc, a.seconds)
                m = machine.since()  # the window holds the processes' start too: a second or so
                rates.setdefault((design, label), []).append(rate)
                print(f"{design:12}{label:>8}{round_:>6}{rate:10,.1f}{rate * size / 1e6:8,.1f}{m['cpu']:10.0%}"
                      f"{m['disk']:11,.1f}{m['wal']:10,.1f}", flush=True)  # fmt: skip
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    print(f"\nmedians of {a.rounds} runs of {a.seconds:g} s, against the hand-built table")
    for label in sizes:
        table = statistics.median(rates[("table", label)])
        print(f"{label:>8}: " + ", ".join(
            f"{d} {statistics.median(rates[(d, label)]) / table:.2f}" for d in designs[1:]
        ))  # fmt: skip


if __name__ == "__main__":
    main()
