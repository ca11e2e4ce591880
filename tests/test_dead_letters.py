"""Broker semantics of ring queues (schema version 8): dead letters after `deadLetter.maxAttempts`,
redrive and purge, delayed delivery, lease extension, and the upgrade of a version 7 queue in
place. On PostgreSQL, and on SQL Server when DBQ_MSSQL_DSN is set."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import LeaseLost, Queue, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames
from tests.sqlserver import MSSQL_DSN, on_sqlserver

SCHEMA = f"dead_{secrets.token_hex(3)}"


@pytest.fixture(params=["postgres", on_sqlserver("sqlserver")])
def url(request) -> str:
    return request.getfixturevalue("postgres").url if request.param == "postgres" else MSSQL_DSN


@pytest.fixture
def queue(url) -> Iterator[tuple[Queue, OdbcRing]]:
    """A ring queue whose messages are dead-lettered at their third failed delivery."""
    name = f"q_{secrets.token_hex(4)}"
    backend = OdbcRing(from_url(url), RingTarget(QueueNames(SCHEMA, name), 64, 100, max_attempts=3))
    backend.apply()
    q = connect(url, name, schema=SCHEMA, pop_timeout=0.1, smart_batching=False)
    assert isinstance(q, Queue)
    yield q, backend
    q.close()
    backend.teardown()
    backend.close()


def test_a_message_nacked_max_attempts_times_is_dead_lettered_once_with_its_error(queue):
    q, _ = queue
    msg_id = q.push(b"bad")
    for attempt in (1, 2):
        m = q.acquire(timeout=1)
        assert m is not None and (m.id, m.attempts) == (msg_id, attempt)
        assert m.nack(error=f"failure {attempt}") is False  # delivered again
    m = q.acquire(timeout=1)
    assert m is not None and m.attempts == 3
    assert m.nack(error="failure 3") is True  # the third: dead-lettered
    assert q.acquire(timeout=0.3) is None
    [dead] = q.dead_letters()
    assert (dead.id, dead.attempts, dead.error, dead.body) == (msg_id, 3, "failure 3", b"bad")
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.dead) == (0, 0, 1)
    with pytest.raises(LeaseLost):
        m.nack()  # settled already: nothing moves twice


def test_redrive_brings_a_dead_letter_back_with_its_id_and_attempts_from_zero_and_purge_deletes(queue):
    q, _ = queue
    ids = q.push_many([b"a", b"b"])
    for _ in range(3):
        for m in q.acquire_many(2):
            m.nack(error="boom")
    assert sorted(d.id for d in q.dead_letters()) == sorted(ids)
    assert q.redrive([ids[0]]) == 1
    m = q.acquire(timeout=1)
    assert m is not None and (m.id, m.attempts, m.body) == (ids[0], 1, b"a")
    m.ack()
    assert q.purge_dead_letters() == 1
    assert q.dead_letters() == []
    stats = q.stats()
    assert (stats.depth, stats.dead, stats.pushed, stats.popped) == (0, 0, 2, 1)
    with pytest.raises(ValueError, match="a message id is a whole number"):
        q.redrive(["1; DROP TABLE x"])  # type: ignore[list-item]


def test_an_expired_lease_counts_as_an_attempt_and_repair_dead_letters_it(queue):
    q, _ = queue
    msg_id = q.push(b"slow")
    for _ in range(3):
        m = q.acquire(timeout=1, visibility=0.2)
        assert m is not None
        time.sleep(0.3)
        q.repair(orphan_grace=60)
    [dead] = q.dead_letters()
    assert (dead.id, dead.attempts) == (msg_id, 3)
    assert dead.error and "lease expired" in dead.error
    assert q.stats().dead == 1


def test_a_delayed_message_waits_aside_and_is_not_delivered_early(queue):
    q, _ = queue
    pushed_at = time.monotonic()
    [later] = q.push_many([b"later"], delay=1.0)
    now = q.push(b"now")
    assert later < now  # ids in push order
    stats = q.stats()
    assert (stats.depth, stats.delayed) == (1, 1)
    first = q.pop(timeout=0.2)
    assert first is not None and first.body == b"now"  # the head never waits for the delayed one
    assert q.pop(timeout=0.2) is None
    got = None
    while got is None and time.monotonic() - pushed_at < 5:
        got = q.pop(timeout=0.1)
    assert got is not None and got.id == later
    assert time.monotonic() - pushed_at >= 1.0
    assert q.stats().pushed == 2


def test_a_long_handler_extends_its_lease(queue):
    q, _ = queue
    q.push(b"long")
    m = q.acquire(timeout=1, visibility=0.5)
    assert m is not None
    m.extend(5)
    time.sleep(0.7)
    assert q.repair(orphan_grace=60).expired_leases == 0
    m.ack()
    with pytest.raises(LeaseLost):
        m.extend(5)


def test_dead_letters_from_a_shell_list_redrive_and_purge(queue, url):
    """`dbq dead-letters list|redrive|purge`."""
    import json
    import subprocess
    import sys

    q, _ = queue
    ids = q.push_many([b"x", b"y"])
    for _ in range(3):
        for m in q.acquire_many(2):
            m.nack(error="handler said no")

    def dbq(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "dbq.cli", "dead-letters", *args, q.names.queue, "--url", url,
                               "--schema", SCHEMA, "-o", "json"], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(dbq("list"))
    assert [(d["id"], d["attempts"], d["error"], d["body"]) for d in listed] == [
        (ids[0], 3, "handler said no", "x"), (ids[1], 3, "handler said no", "y")
    ]  # fmt: skip
    assert json.loads(dbq("redrive", "--id", str(ids[1]))) == {"redriven": 1}
    assert json.loads(dbq("purge")) == {"purged": 1}
    assert q.dead_letters() == []
    m = q.acquire(timeout=1)
    assert m is not None and (m.id, m.attempts) == (ids[1], 1)
