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
from dbq.controller.reconcile import dead_letters_kept_by, delete
from dbq.errors import DeadLetterQueueNotFound, InvalidSpec
from dbq.names import QueueNames
from dbq.resource import dead_letter_keeper, parse_spec
from tests.manifests import pipes_queue
from tests.manifests import queue as queue_doc
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


# --- spec.deadLetter.queue: which queue keeps the dead letters (no database needed) ------------
def test_the_dead_letter_queue_is_found_and_must_share_backend_design_and_secret():
    keeper = queue_doc("dlq", connection={"secretRef": {"name": "orders-db"}, "schema": "errors"})
    found = {("shop", "dlq"): keeper}
    user = parse_spec(queue_doc("orders", deadLetter={"maxAttempts": 3, "queue": "dlq"})["spec"])
    assert dead_letter_keeper("orders", "shop", user, lambda ns, n: found.get((ns, n))) == QueueNames(
        "errors", "dlq"
    )
    with pytest.raises(DeadLetterQueueNotFound, match="there is no Queue other/dlq: create it"):
        dead_letter_keeper("orders", "other", user, lambda ns, n: found.get((ns, n)))
    with pytest.raises(InvalidSpec, match="names this Queue itself: remove it"):
        dead_letter_keeper("dlq", "shop", parse_spec(queue_doc("dlq", deadLetter={"maxAttempts": 1, "queue": "dlq"})["spec"]),
                         lambda ns, n: found.get((ns, n)))  # fmt: skip
    elsewhere = {**keeper, "spec": {**keeper["spec"], "connection": {"secretRef": {"name": "other-db"}}}}
    with pytest.raises(
        InvalidSpec,
        match=r"has Secret other-db \(this queue: orders-db\); a dead-letter queue must have this queue.s backend, design",
    ):
        dead_letter_keeper("orders", "shop", user, lambda ns, n: elsewhere)
    pipes = pipes_queue("dlq", "events", secret="orders-db")
    with pytest.raises(
        InvalidSpec, match=r"backend cassandra \(this queue: postgres\), design pipes \(this queue: ring\)"
    ):
        dead_letter_keeper("orders", "shop", user, lambda ns, n: pipes)
    own = parse_spec(queue_doc("orders", deadLetter={"maxAttempts": 3})["spec"])
    assert dead_letter_keeper("orders", "shop", own, lambda ns, n: None) is None


def test_a_keeper_that_names_a_keeper_is_refused_so_no_chain_or_cycle_forms():
    """Two Queues naming each other used to wait for each other for ever (DeadLetterQueueNotFound)."""
    a = queue_doc("a", deadLetter={"maxAttempts": 3, "queue": "b"})
    b = queue_doc("b", deadLetter={"maxAttempts": 3, "queue": "a"})
    found = {("shop", "a"): a, ("shop", "b"): b}
    read = lambda ns, n: found.get((ns, n))  # noqa: E731
    with pytest.raises(
        InvalidSpec, match=r"Queue b sends its own dead letters on to Queue a .*\(a -> b -> a\)"
    ):
        dead_letter_keeper("a", "shop", parse_spec(a["spec"]), read)
    with pytest.raises(InvalidSpec, match=r"remove spec.deadLetter.queue from a"):
        dead_letter_keeper("b", "shop", parse_spec(b["spec"]), read)
    found[("shop", "b")] = queue_doc("b", deadLetter={"maxAttempts": 3})  # b keeps its own: a may use it
    assert dead_letter_keeper("a", "shop", parse_spec(a["spec"]), read) == QueueNames("shopq", "b")


def test_a_queue_keeping_others_dead_letters_is_not_dropped_while_they_use_it():
    queues = [
        queue_doc("a", deadLetter={"maxAttempts": 1, "queue": "dlq"}), queue_doc("b", deadLetter={"maxAttempts": 1}),
        queue_doc("c", deadLetter={"maxAttempts": 1, "queue": "dlq"}), queue_doc("dlq", deadLetter={"queue": "dlq"}),
    ]  # fmt: skip
    users = [
        q["metadata"]["name"]
        for q in queues
        if dead_letters_kept_by(q["metadata"]["name"], q["spec"]) == "dlq"
    ]
    assert users == ["a", "c"]
    spec = {**queue_doc("dlq")["spec"], "deletionPolicy": "Delete"}
    refused = delete("dlq", "shop", spec, 1, {}, lambda ns, n: None, force=True, dead_letter_users=users)
    assert refused.error is not None and "Queues a, c keep their dead letters in this queue's table" in str(
        refused.error
    )
    assert refused.status["conditions"][0]["reason"] == "DeadLetterQueueInUse"
    retained = delete("dlq", "shop", {**spec, "deletionPolicy": "Retain"}, 1, {}, lambda ns, n: None, force=False,
                      dead_letter_users=users)  # fmt: skip
    assert retained.error is None  # nothing is dropped: nothing breaks
