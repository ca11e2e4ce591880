"""What a fleet of ring queues costs each PostgreSQL session that keeps it up: the memory of a
session's catalog and plan caches once it has read the positions, the full statistics and the
objects (as a drift check does) of every queue, and the catalog's size.

Makes --queues ring queues of --ring-size slots over --schemas schemas in a scratch database,
then, in a new session, reads each queue's positions (four sequences), its statistics (its
`stats` routine) and its objects by name, and prints the session's CacheMemoryContext (the
catalog caches: relations, routines, types) and its whole memory after each step, against a
session that did nothing. The session logs in as the bench's superuser, because only it may
read `pg_backend_memory_contexts`; the caches hold the same entries for any login.

    ~/.cache/dbq/venv/bin/python -m bench.backend_cache --queues 1000 --schemas 10
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyodbc

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing, measure_many, positions_of
from dbq.connection import from_url
from dbq.devstack import Stack
from tests.local import scratch_database

MEMORY = """SELECT coalesce(sum(total_bytes) FILTER (WHERE name = 'CacheMemoryContext' OR parent = 'CacheMemoryContext'), 0),
  sum(total_bytes) FROM pg_backend_memory_contexts"""
CATALOG = """SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
  WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r'"""


def ring(url: str, schema: str, name: str, size: int) -> OdbcRing:
    connection = {"secretRef": {"name": "s"}, "schema": schema}
    spec = QueueSpec.model_validate(
        {"backend": "postgres", "design": "ring", "ring": {"size": size}, "connection": connection}
    )
    return open_backend(spec, name, from_url(url))  # type: ignore[return-value]


def made(backend: OdbcRing) -> OdbcRing:
    backend.apply()
    backend.close()
    return backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--schemas", type=int, default=10)
    ap.add_argument("--ring-size", type=int, default=1000)
    args = ap.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    with scratch_database(stack, "dbq_bench_cache") as db:
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            rings = list(pool.map(
                lambda i: made(ring(db.admin_url, f"cache_{i % args.schemas:03d}", f"q{i}", args.ring_size)),
                range(args.queues)))  # fmt: skip
        made_s = time.monotonic() - started
        session = pyodbc.connect(db.admin_odbc, autocommit=True)

        def memory() -> str:
            cache, total = session.execute(MEMORY).fetchone()
            return (f"catalog caches {cache / 2**20:6.1f} MiB ({cache / args.queues / 1024:5.1f} KiB a queue),"
                    f" all of the session {total / 2**20:6.1f} MiB")  # fmt: skip

        def on_session(step: Callable[[list[OdbcRing]], object]) -> None:
            for part in range(0, len(rings), 100):
                chunk = rings[part : part + 100]
                chunk[0]._conn = session  # every read in this one session (a pooled one does the same)
                try:
                    step(chunk)
                finally:
                    chunk[0]._conn = None

        def observed(chunk: list[OdbcRing]) -> None:
            for r in chunk:
                r._conn = session
                r.observe()
                r._conn = None

        print(f"{args.queues} ring queues of {args.ring_size} slots over {args.schemas} schemas, made in {made_s:.0f} s;"
              f" the catalog's tables {session.execute(CATALOG).fetchval() / 2**20:.0f} MiB")  # fmt: skip
        print(f"  a new session:                      {memory()}")
        on_session(positions_of)
        print(f"  after reading every queue's positions: {memory()}")
        on_session(measure_many)
        print(f"  ... and every queue's statistics:     {memory()}")
        on_session(observed)
        print(f"  ... and every queue's objects (drift): {memory()}")
        session.close()


if __name__ == "__main__":
    main()
