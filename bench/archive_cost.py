"""What the archive (spec.archive) costs the ring on the local PostgreSQL: single-cycle and batch
rates with the archive off and on, beside the commit ceiling, all measured in this run.

Off, the routines hold no archive statement (`-- if archive` blocks are dropped when they are
rendered), so off must equal the ring without an archive within the noise of the machine; on,
every message taken also writes a row to the archive table (and its index). The designs take
turns for --rounds rounds, so a change in the machine's pace shows in each alike; the median counts.

    ~/.cache/dbq/venv/bin/python -m bench.archive_cost                    # 3 rounds of 10 s
    ~/.cache/dbq/venv/bin/python -m bench.archive_cost --rounds 5 --seconds 20

Writes nothing but its report (tee it to bench/results/archive_cost.txt).
"""

from __future__ import annotations

import argparse
import statistics

from bench.ring_vs_skiplocked import BODY, DB, SCHEMA, admin, bench_database, measure, prepare

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames

CYCLES = ("ring-amo", "ring-lease", "ring-batch")  # push + pop; push + acquire + ack; 100 + 100


def prepare_ring(url: str, odbc: str, archive: bool, message_bytes: int = len(BODY)) -> str:
    """A fresh ring queue with the archive off or on; its name."""
    cur = admin(odbc)
    cur.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    queue = "benchq"
    OdbcRing(
        from_url(url), RingTarget(QueueNames(SCHEMA, queue), 16_384, message_bytes, archive=archive)
    ).apply()
    cur.execute(f"VACUUM ANALYZE {SCHEMA}.{queue}_ring")
    return queue


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of each run")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, taking turns")
    a = p.parse_args()
    pg, url, odbc = bench_database()
    rates: dict[str, list[float]] = {}
    configs = [("ceiling", None)] + [(cycle, archive) for cycle in CYCLES for archive in (False, True)]
    for round_ in range(1, a.rounds + 1):
        for cycle, archive in configs:
            label = cycle if archive is None else f"{cycle} archive {'on' if archive else 'off'}"
            queue = (
                prepare(cycle, url, odbc, 0, a.workers)
                if archive is None
                else prepare_ring(url, odbc, archive)
            )
            run = measure(cycle, "short", a.seconds, url, odbc, queue, a.workers)
            rates.setdefault(label, []).append(run.rate)
            line = f"{label:26} #{round_}  {run.rate:10,.0f} /s"
            if archive:
                kept = admin(odbc).execute(f"SELECT count(*) FROM {SCHEMA}.{queue}_archive").fetchval()
                line += f"  ({kept:,} archived)"
            print(line, flush=True)
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    median = {label: statistics.median(values) for label, values in rates.items()}
    ceiling = median["ceiling"]
    print(
        f"\nworkers={a.workers} body={len(BODY)} B, {a.seconds:g} s x {a.rounds} rounds (median), messages/s"
    )
    print(f"{'cycle':12}{'archive off':>13}{'archive on':>12}{'on / off':>10}{'off / ceiling':>15}")
    for cycle in CYCLES:
        off, on = median[f"{cycle} archive off"], median[f"{cycle} archive on"]
        print(f"{cycle:12}{off:13,.0f}{on:12,.0f}{on / off:10.2f}{off / ceiling:15.2f}")
    print(f"{'ceiling':12}{ceiling:13,.0f}   (one single-row UPDATE per commit)")
    spread = {
        cycle: (min(rates[f"{cycle} archive off"]), max(rates[f"{cycle} archive off"])) for cycle in CYCLES
    }
    print("\nround-to-round spread of archive off (the noise the comparison is read against):")
    for cycle, (low, high) in spread.items():
        print(f"  {cycle:12} {low:10,.0f} .. {high:,.0f}  ({(high - low) / high:.0%})")


if __name__ == "__main__":
    main()
