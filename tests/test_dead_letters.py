"""Broker semantics of ring queues (schema version 8) beyond the contract suite's dead-letter tests
and delayed delivery (`test_contract.py`): redrive and purge by id, lease extension. On PostgreSQL,
and on SQL Server when DBQ_MSSQL_DSN is set."""

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
