"""The archive of ring queues (spec.archive, schema version 9): every message acked or popped is
kept, by every path that takes one (single and batch pops and acks, redeliveries from the spill
table); the scavenger removes archived messages past the retention in bounded batches; turning
the archive on or off re-creates the routines, and off they hold no archive statement at all.
On PostgreSQL, and on SQL Server when DBQ_MSSQL_DSN is set."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from dbq.backends.odbc_ring import SCAVENGE_BATCH, OdbcRing
from dbq.backends.ring_plan import RingAction, RingStep
from dbq.client import Queue, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames
from tests.sqlserver import MSSQL_DSN, on_sqlserver

SCHEMA = f"archive_{secrets.token_hex(3)}"
LONG_AGO = datetime.now(UTC) - timedelta(days=1)


@pytest.fixture(params=["postgres", on_sqlserver("sqlserver")])
def url(request) -> str:
    return request.getfixturevalue("postgres").url if request.param == "postgres" else MSSQL_DSN


MakeQueue = Callable[..., tuple[Queue, OdbcRing]]


@pytest.fixture
def make_queue(url) -> Iterator[MakeQueue]:
    made: list[tuple[Queue, OdbcRing]] = []

    def make(archive: bool = True, retention_s: float = 3600.0) -> tuple[Queue, OdbcRing]:
        name = f"q_{secrets.token_hex(4)}"
        target = RingTarget(
            QueueNames(SCHEMA, name), 256, 100, archive=archive, archive_retention_s=retention_s
        )
        backend = OdbcRing(from_url(url), target)
        backend.apply()
        q = connect(url, name, schema=SCHEMA, pop_timeout=0.1, smart_batching=False)
        assert isinstance(q, Queue)
        made.append((q, backend))
        return q, backend

    yield make
    for q, backend in made:
        q.close()
        backend.teardown()
        backend.close()


def archive_rows(backend: OdbcRing) -> int:
    return int(backend.conn.cursor().execute(f"SELECT count(*) FROM {backend.sql.archive}").fetchval())


def test_archived_messages_equal_the_acked_and_popped_ones_by_every_path(make_queue):
    q, _ = make_queue()
    ids = q.push_many([b"m%d" % i for i in range(120)])
    taken = [q.pop() for _ in range(10)]  # single pops
    taken += q.pop_many(20)  # a batch pop
    leased = [q.acquire() for _ in range(10)]
    for m in leased:
        assert m is not None
        m.ack()  # single acks
    batch = q.acquire_many(20)
    q.ack_many(batch)  # a batch ack
    # Redeliveries come from the spill table: nacked, then acked (single and batch) or popped.
    nacked = q.acquire_many(30)
    for m in nacked:
        m.nack()
    redelivered = q.acquire_many(60)  # the 30 nacked ones and the last 30 of the ring
    q.ack_many(redelivered[:20])
    for m in redelivered[20:30]:
        m.ack()
    for m in redelivered[30:]:
        m.nack()
    taken += q.pop_many(100)
    assert q.pop() is None
    acked = [m.id for m in leased if m] + [m.id for m in batch] + [m.id for m in redelivered[:30]]
    popped = [m.id for m in taken if m is not None]
    assert sorted(acked + popped) == sorted(ids)  # every message taken exactly once
    kept = q.archived(LONG_AGO, limit=1000)
    assert sorted(m.id for m in kept) == sorted(ids)
    by_id = {m.id: m for m in kept}
    assert [by_id[m.id].attempts for m in redelivered[:30]] == [m.attempts for m in redelivered[:30]]
    assert {by_id[m.id].attempts for m in nacked} == {2}  # acquired twice, whichever way it went
    assert by_id[ids[0]].body == b"m0" and by_id[ids[0]].pushed_at <= by_id[ids[0]].acked_at
    assert [m.acked_at for m in kept] == sorted(m.acked_at for m in kept)  # oldest first
    assert q.stats().archived == 120


def test_a_queue_without_archive_keeps_nothing_and_its_routines_hold_no_archive_statement(make_queue):
    q, backend = make_queue(archive=False)
    q.push_many([b"x"] * 10)
    q.pop_many(5)
    q.ack_many(q.acquire_many(5))
    assert archive_rows(backend) == 0 and q.stats().archived == 0
    # The routines that take messages hold no archive statement (so they cost what they did).
    statements = backend.sql.render(RingStep(RingAction.CREATE_ROUTINES, "archive off"))
    for verb in ("take", "pop", "pop_many", "ack", "ack_many"):
        [routine] = [s for s in statements if f"PROCEDURE {backend.sql.fn[verb]} " in s
                     or f"FUNCTION {backend.sql.fn[verb]}(" in s]  # fmt: skip
        assert backend.sql.archive not in routine and backend.sql.count["archived"] not in routine


def test_turning_the_archive_on_and_off_recreates_the_routines(make_queue):
    q, backend = make_queue(archive=False)
    on = OdbcRing(backend.settings, replace(backend.target, archive=True))
    assert [str(s) for s in on.plan(on.observe())] == ["create_routines", "record_version", "secure"]
    on.apply()
    assert on.plan(on.observe()) == []
    first = q.push(b"kept")
    assert q.pop() is not None and [m.id for m in q.archived(LONG_AGO)] == [first]
    backend.apply()  # off again
    q.push(b"not kept")
    assert q.pop() is not None and [m.id for m in q.archived(LONG_AGO)] == [first]
    on.close()


def test_the_scavenger_removes_archived_messages_past_the_retention_in_bounded_batches(make_queue):
    q, backend = make_queue()
    q.push_many([b"old"] * 12)
    q.pop_many(12)
    assert q.scavenge_archive(retention=3600) == 0  # none is an hour old
    assert [q.scavenge_archive(retention=0, limit=5) for _ in range(4)] == [5, 5, 2, 0]
    assert archive_rows(backend) == 0 and q.stats().archived == 0
    # The operator's cleanup scavenges too, and says how many it removed.
    q.push_many([b"old"] * 7)
    q.pop_many(7)
    counts = OdbcRing(backend.settings, replace(backend.target, archive_retention_s=0.001)).cleanup(60)
    assert counts["archiveScavenged"] == 7 and SCAVENGE_BATCH > 7
    assert q.stats().archived == 0 and q.stats().popped == 19


def test_the_archive_from_a_shell(make_queue, url):
    q, _ = make_queue()
    q.push(b"hello")
    q.pop()
    out = subprocess.run(
        [sys.executable, "-m", "dbq.cli", "archive", q.names.queue, "--url", url, "--schema", SCHEMA,
         "--since", "10m", "-o", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    [kept] = json.loads(out.stdout)
    assert (kept["body"], kept["attempts"]) == ("hello", 0)
    bad = subprocess.run(
        [sys.executable, "-m", "dbq.cli", "archive", q.names.queue, "--url", url, "--schema", SCHEMA,
         "--since", "yesterday"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode != 0 and "--since" in bad.stderr and "neither a duration" in bad.stderr
