"""PGMQ 1.13 beside dbq's row contract, called as a PGMQ client calls its queue: by message id.

The real PGMQ's SQL comes from PyPI's `pgmq` package (its SQL-only install); dbq's side is a
ring queue's row routines, in the calls a PGMQ facade would make of them. Same server, same
database, same driver (psycopg), one session a line, autocommit; lines take turns in every
round (--rounds, medians). A message is one sent, read and ended.

  pgmq              send(q, msg), read(q, vt 30, 1), delete(q, id)
  rows by id        Q_send(body), Q_read(1, 30000), Q_delete(ARRAY[id])
  rows leased       Q_send(body), Q_read(1, 30000), Q_ack(id, lease)
  pgmq pop          send(q, msg), pop(q)
  rows pop          Q_send(body), Q_read(1, 0)
  ... batch         the same with 100 messages a call: send_batch, read 100, delete (or ack_many)
                    the ids read

The message is a JSON object of about 100 bytes; dbq stores its text as the body. Figures:
messages a second (wall time of the line's calls) and the CPU of the line's PostgreSQL backend
a message (/proc/<pid>/schedstat); the ratio is PGMQ's time over dbq's (above 1: dbq faster).

    ~/.cache/dbq/venv/bin/python -m bench.pgmq_rows --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import psycopg
from bench.cpu import backend_ns
from pgmq.install import get_embedded_install_sql, get_embedded_sql_version, install_pgmq_sql
from psycopg.types.json import Jsonb

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack import Stack
from dbq.names import QueueNames
from tests.local import scratch_database

BATCH = 100
SIZE = 100_000
SCHEMA, QUEUE = "bench", "rows"
PGMQ_QUEUE = "bench_pgmq"
FN = f"{SCHEMA}.{QUEUE}"


def message(i: int) -> dict[str, object]:
    return {"order": i, "customer": f"c-{i:06d}", "items": [1, 2, 3], "note": "x" * 40}


def body(i: int) -> bytes:
    return json.dumps(message(i)).encode()


Cycle = Callable[[psycopg.Cursor, int], int]


def pgmq(cur: psycopg.Cursor, i: int) -> int:
    cur.execute("SELECT * FROM pgmq.send(%s, %s)", (PGMQ_QUEUE, Jsonb(message(i))))
    [(msg_id,)] = cur.execute("SELECT msg_id FROM pgmq.read(%s, 30, 1)", (PGMQ_QUEUE,)).fetchall()
    cur.execute("SELECT pgmq.delete(%s, %s::bigint)", (PGMQ_QUEUE, msg_id))
    return 1


def rows_by_id(cur: psycopg.Cursor, i: int) -> int:
    cur.execute(f"SELECT {FN}_send(%b)", (body(i),))
    [(msg_id,)] = cur.execute(f"SELECT msg_id FROM {FN}_read(1, 30000)").fetchall()
    cur.execute(f"SELECT * FROM {FN}_delete(ARRAY[%s]::bigint[])", (msg_id,))
    return 1


def rows_leased(cur: psycopg.Cursor, i: int) -> int:
    cur.execute(f"SELECT {FN}_send(%b)", (body(i),))
    [(msg_id, lease)] = cur.execute(f"SELECT msg_id, lease FROM {FN}_read(1, 30000)").fetchall()
    cur.execute(f"SELECT {FN}_ack(%s, %s)", (msg_id, lease))
    return 1


def pgmq_pop(cur: psycopg.Cursor, i: int) -> int:
    cur.execute("SELECT * FROM pgmq.send(%s, %s)", (PGMQ_QUEUE, Jsonb(message(i))))
    return len(cur.execute("SELECT msg_id FROM pgmq.pop(%s)", (PGMQ_QUEUE,)).fetchall())


def rows_pop(cur: psycopg.Cursor, i: int) -> int:
    cur.execute(f"SELECT {FN}_send(%b)", (body(i),))
    return len(cur.execute(f"SELECT msg_id FROM {FN}_read(1, 0)").fetchall())


def pgmq_batch(cur: psycopg.Cursor, i: int) -> int:
    msgs = [Jsonb(message(i + k)) for k in range(BATCH)]
    cur.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", (PGMQ_QUEUE, msgs))
    ids = [r[0] for r in cur.execute(f"SELECT msg_id FROM pgmq.read(%s, 30, {BATCH})", (PGMQ_QUEUE,))]
    cur.execute("SELECT * FROM pgmq.delete(%s, %s::bigint[])", (PGMQ_QUEUE, ids))
    return len(ids)


def rows_batch_by_id(cur: psycopg.Cursor, i: int) -> int:
    cur.execute(f"SELECT * FROM {FN}_send_batch(%b)", ([body(i + k) for k in range(BATCH)],))
    ids = [r[0] for r in cur.execute(f"SELECT msg_id FROM {FN}_read(%s, 30000)", (BATCH,))]
    cur.execute(f"SELECT * FROM {FN}_delete(%s::bigint[])", (ids,))
    return len(ids)


def rows_batch_leased(cur: psycopg.Cursor, i: int) -> int:
    cur.execute(f"SELECT * FROM {FN}_send_batch(%b)", ([body(i + k) for k in range(BATCH)],))
    taken = cur.execute(f"SELECT msg_id, lease FROM {FN}_read(%s, 30000)", (BATCH,)).fetchall()
    ids, leases = ",".join(str(r[0]) for r in taken), ",".join(str(r[1]) for r in taken)
    cur.execute(f"SELECT {FN}_ack_many(%s, %s)", (ids, leases))
    return len(taken)


def pgmq_pop_batch(cur: psycopg.Cursor, i: int) -> int:
    msgs = [Jsonb(message(i + k)) for k in range(BATCH)]
    cur.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", (PGMQ_QUEUE, msgs))
    return len(cur.execute(f"SELECT msg_id FROM pgmq.pop(%s, {BATCH})", (PGMQ_QUEUE,)).fetchall())


def rows_pop_batch(cur: psycopg.Cursor, i: int) -> int:
    cur.execute(f"SELECT * FROM {FN}_send_batch(%b)", ([body(i + k) for k in range(BATCH)],))
    return len(cur.execute(f"SELECT msg_id FROM {FN}_read(%s, 0)", (BATCH,)).fetchall())


# (PGMQ's line, dbq's lines), each pair compared
PAIRS: list[tuple[str, list[str]]] = [
    ("pgmq", ["rows by id", "rows leased"]),
    ("pgmq pop", ["rows pop"]),
    ("pgmq batch", ["rows batch by id", "rows batch leased"]),
    ("pgmq pop batch", ["rows pop batch"]),
]
LINES: dict[str, Cycle] = {
    "pgmq": pgmq, "rows by id": rows_by_id, "rows leased": rows_leased,
    "pgmq pop": pgmq_pop, "rows pop": rows_pop,
    "pgmq batch": pgmq_batch, "rows batch by id": rows_batch_by_id, "rows batch leased": rows_batch_leased,
    "pgmq pop batch": pgmq_pop_batch, "rows pop batch": rows_pop_batch,
}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=2000, help="messages a line handles in each round")
    a = p.parse_args()
    stack = Stack()
    stack.up(("postgres",))
    with scratch_database(stack, "dbq_bench_pgmq") as db:
        OdbcRing(from_url(db.url), RingTarget(QueueNames(SCHEMA, QUEUE), SIZE, 256)).apply()
        with psycopg.connect(db.admin_url) as conn:
            install_pgmq_sql(get_embedded_install_sql(), conn=conn)
            conn.execute("SELECT pgmq.create(%s)", (PGMQ_QUEUE,))
            conn.commit()
        admin = psycopg.connect(db.admin_url, autocommit=True)
        admin.execute(f"VACUUM ANALYZE {SCHEMA}.{QUEUE}_ring")
        sessions: dict[str, tuple[psycopg.Cursor, int]] = {}
        for name in LINES:  # the operator's superuser login for both: the same rights checks
            conn = psycopg.connect(db.admin_url, autocommit=True)
            sessions[name] = (conn.cursor(), int(conn.execute("SELECT pg_backend_pid()").fetchone()[0]))  # type: ignore[index]
        rate: dict[str, list[float]] = {name: [] for name in LINES}
        cpu: dict[str, list[float]] = {name: [] for name in LINES}
        for name, cycle in LINES.items():
            for i in range(20):  # plans made, caches warm
                cycle(sessions[name][0], i)
        for r in range(a.rounds):
            for name, cycle in LINES.items():
                cur, pid = sessions[name]
                done, before, started = 0, backend_ns(pid), time.perf_counter()
                while done < a.messages:
                    done += cycle(cur, r * a.messages + done)
                wall = time.perf_counter() - started
                rate[name].append(done / wall)
                cpu[name].append((backend_ns(pid) - before) / done / 1000)
            admin.execute(f"VACUUM pgmq.q_{PGMQ_QUEUE}")
    print(f"PGMQ {get_embedded_sql_version()} (PyPI pgmq's SQL) and dbq's row routines, one session a line,"
          f" {a.messages} messages a line a round, medians of {a.rounds} rounds taken in turns; batches of {BATCH}")  # fmt: skip
    print(f"  {'line':20s} {'msgs/s':>9s} {'backend us/msg':>15s}")
    for name in LINES:
        print(f"  {name:20s} {statistics.median(rate[name]):9.0f} {statistics.median(cpu[name]):15.1f}")
    for base, ours in PAIRS:
        for name in ours:
            faster = statistics.median(rate[name]) / statistics.median(rate[base])
            cheaper = statistics.median(cpu[base]) / statistics.median(cpu[name])
            print(f"  {name} against {base}: {faster:.2f} x the rate, {cheaper:.2f} x less backend CPU")


if __name__ == "__main__":
    main()
