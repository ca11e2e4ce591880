"""Why sustained ring batches slow down under a held snapshot: one sustained ring-batch run
(the case of `ring_vs_skiplocked.py`), with and without the transaction held open, printing the
rate every 10 s, the share of HOT updates, the ring table's growth, WAL volume, full-page images
and checkpoints over the run.

    ~/.cache/dbq/venv/bin/python bench/ring_held_snapshot.py                    # held vs not, 90 s each
    ~/.cache/dbq/venv/bin/python bench/ring_held_snapshot.py --seconds 300 --fillfactor 20 --held-only

The server's settings (shared_buffers, max_wal_size, ...) are those of the running PostgreSQL;
they are printed with the results.
"""

from __future__ import annotations

import argparse
import time

import pyodbc

from dbq.devstack import Stack
from ring_vs_skiplocked import DB, SCHEMA, admin, held_transaction, measure, prepare

DESIGN = "ring-batch"
SETTINGS = ("shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_compression", "synchronous_commit")


def wal_counters(cur: pyodbc.Cursor) -> tuple[float, float, int]:
    """Full-page images, WAL bytes, checkpoints so far."""
    fpi, wal_bytes, checkpoints = cur.execute(
        "SELECT wal_fpi, wal_bytes, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)"
        " FROM pg_stat_wal"
    ).fetchone()
    return float(fpi), float(wal_bytes), int(checkpoints)


def update_counts(cur: pyodbc.Cursor, table: str) -> tuple[int, int]:
    """Updates and HOT updates of a table so far."""
    upd, hot = cur.execute(
        f"SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = '{table}'::regclass"
    ).fetchone()
    return int(upd), int(hot)


def one_run(
    url: str,
    odbc: str,
    root: pyodbc.Cursor,
    seconds: float,
    backlog: int,
    workers: int,
    held: bool,
    fillfactor: int,
) -> None:
    queue = prepare(DESIGN, url, odbc, backlog, workers, fillfactor)
    table = f"{SCHEMA}.{queue}_ring"
    db = admin(odbc)
    size_before = db.execute(f"SELECT pg_relation_size('{table}')").fetchone()[0]
    time.sleep(1.5)  # let the backlog's statistics reach the shared counters
    updates_before = update_counts(db, table)
    before = wal_counters(root)
    holder = held_transaction(odbc) if held else None
    run = measure(DESIGN, "sustained", seconds, url, odbc, queue, workers)
    after = wal_counters(root)
    if holder is not None:
        holder.rollback()
        holder.close()
    updates, hot = (a - b for a, b in zip(update_counts(db, table), updates_before, strict=True))
    size_after = db.execute(f"SELECT pg_relation_size('{table}')").fetchone()[0]
    per = run.per_second
    tens = [sum(per[i : i + 10]) / len(per[i : i + 10]) for i in range(0, len(per), 10)]
    print(f"\nheld snapshot: {'yes' if held else 'no'}, fillfactor {fillfactor or 'dbq default'}")
    print("  per 10 s:     " + " ".join(f"{t:,.0f}" for t in tens))
    print(
        f"  rate {run.rate:,.0f} /s; first minute {run.window(True):,.0f}, last minute {run.window(False):,.0f}"
        f" (ratio {run.window(False) / max(run.window(True), 1e-9):.2f})"
    )
    print(
        f"  updates {updates:,}, HOT {hot / max(updates, 1):.1%}; ring table {size_before / 2**30:.2f} ->"
        f" {size_after / 2**30:.2f} GiB"
    )
    print(
        f"  WAL {(after[1] - before[1]) / seconds / 1e6:.1f} MB/s, full-page images"
        f" {(after[0] - before[0]) / seconds:,.0f} /s, checkpoints {after[2] - before[2]}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--backlog", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--fillfactor", type=int, default=0, help="rewrite the ring table with this fillfactor")
    p.add_argument("--held-only", action="store_true", help="skip the baseline run without the held snapshot")
    a = p.parse_args()
    pg = Stack().component("postgres")
    if not pg.ready():
        pg.start()
    root = admin(pg.odbc())
    print(", ".join(f"{name}={root.execute(f'SHOW {name}').fetchone()[0]}" for name in SETTINGS))
    root.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    root.execute(f"CREATE DATABASE {DB}")
    url, odbc = pg.url(DB), pg.odbc(DB)
    for held in (True,) if a.held_only else (False, True):
        one_run(url, odbc, root, a.seconds, a.backlog, a.workers, held, a.fillfactor)
    root.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
