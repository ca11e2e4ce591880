"""Service Broker queues on a real SQL Server: the tests a DBA runs first against a staging server.

    DBQ_MSSQL_DSN='mssql://user:password@host:1433/db?driver=ODBC Driver 18 for SQL Server&TrustServerCertificate=yes' \\
      pytest tests/test_service_broker.py

SQL Server cannot run on this machine, so here they are reported as skipped, with why. Each test
provisions a queue in a schema of its own and drops it afterwards. The login needs CREATE
SCHEMA/QUEUE/SERVICE/CONTRACT/MESSAGE TYPE in the database (db_owner does), and VIEW SERVER
STATE for the queue monitor check.
"""

from __future__ import annotations

import base64
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dbq.backends import open_backend
from dbq.backends.sqlserver.broker import ServiceBrokerQueue
from dbq.client import BrokerQueue, connect
from dbq.connection import from_url
from dbq.controller.reconcile import delete
from dbq.resource import parse_spec
from tests.sqlserver import MSSQL_DSN

pytestmark = pytest.mark.skipif(not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here")


def spec_of(schema: str, **service_broker: Any) -> dict[str, Any]:
    return {
        "backend": "sqlserver",
        "design": "servicebroker",
        "queueName": "orders",
        "connection": {"secretRef": {"name": "db"}, "schema": schema},
        "serviceBroker": service_broker,
    }


@pytest.fixture
def provisioned() -> Iterator[tuple[ServiceBrokerQueue, dict[str, Any]]]:
    spec = spec_of(f"sb_{secrets.token_hex(3)}")
    backend = open_backend(parse_spec(spec), "orders", from_url(MSSQL_DSN))
    assert isinstance(backend, ServiceBrokerQueue)
    assert backend.apply().created  # a fresh schema: its first cleanup waits one interval
    yield backend, spec
    backend.teardown()
    backend.close()


def client(spec: dict[str, Any], **options: Any) -> BrokerQueue:
    q = connect(MSSQL_DSN, "orders", schema=spec["connection"]["schema"], design="servicebroker", **options)
    assert isinstance(q, BrokerQueue)
    return q


def test_setup_run_twice_changes_nothing_the_second_time(provisioned):
    backend, _ = provisioned
    again = backend.apply()
    assert list(again.steps) == [] and not again.created
    assert list(again.findings) == []
    assert backend.plan(backend.observe()) == []


def test_a_tracer_token_makes_the_round_trip(provisioned):
    _, spec = provisioned
    with client(spec) as q:
        ms = q.trace(timeout=5)
    assert 0 <= ms < 5000


def test_ten_thousand_messages_from_four_senders_to_four_receivers_each_once(provisioned):
    backend, spec = provisioned
    total, senders = 10_000, 4
    bodies = [f"m{i}".encode() for i in range(total)]
    got: list[bytes] = []
    lock = threading.Lock()
    done_sending = threading.Event()

    def send(part: list[bytes]) -> None:
        with client(spec) as q:
            for start in range(0, len(part), 250):
                q.push_many(part[start : start + 250])

    def receive(leased: bool) -> None:
        with client(spec) as q:
            while True:
                if leased:
                    m = q.acquire(timeout=0.5)
                    batch = [m] if m else []
                    for message in batch:
                        message.ack()
                else:
                    batch = q.pop_many(50, timeout=0.5)
                with lock:
                    got.extend(m.body for m in batch)
                    if done_sending.is_set() and not batch and len(got) >= total:
                        return
                if done_sending.is_set() and not batch and q.stats().depth == 0:
                    return

    pushers = [threading.Thread(target=send, args=(bodies[i::senders],)) for i in range(senders)]
    takers = [threading.Thread(target=receive, args=(i % 2 == 0,)) for i in range(4)]
    for t in pushers + takers:
        t.start()
    for t in pushers:
        t.join()
    done_sending.set()
    for t in takers:
        t.join(timeout=300)
    counts = Counter(got)
    assert len(got) == total and set(counts) == set(bodies) and max(counts.values()) == 1
    stats = backend.measure()
    assert (stats.pushed, stats.popped + stats.acquired, stats.in_flight) == (total, total, 0)


def test_a_stalled_conversation_is_ended_by_cleanup(provisioned):
    backend, spec = provisioned
    q = client(spec)
    q.push(b"from a sender that dies")
    assert q._sender is not None
    q._sender.close()  # gone without ending its conversation
    q._sender = q._conversation = None
    with client(spec) as reader:
        assert [m.body for m in reader.pop_many(10, timeout=5)] == [b"from a sender that dies"]
    assert backend.observe().open_conversations >= 1
    time.sleep(2)
    ended = backend.cleanup(stalled_after_s=1)
    assert ended["stalledConversations"] >= 1
    with client(spec) as reader:
        reader.pop_many(10, timeout=1)  # the end-of-conversation message, which ends the queue's side
    time.sleep(2)
    backend.cleanup(stalled_after_s=1)
    assert backend.observe().open_conversations == 0


def test_nacks_of_one_message_never_disable_a_queue_its_clients_consume(provisioned):
    """A nack rolls the RECEIVE back; without an activation procedure poison-message handling
    is off, so six in a row leave the queue enabled and the message deliverable."""
    backend, spec = provisioned
    with client(spec) as q:
        q.push(b"fails six times")
        for _ in range(6):
            m = q.acquire(timeout=5)
            assert m is not None and m.body == b"fails six times"
            m.nack()
        m = q.acquire(timeout=5)
        assert m is not None
        m.ack()
    assert backend.checks() == []
    assert not backend.observe().queues["orders"].poison_handling


def test_a_queue_disabled_by_poison_message_detection_is_reported_and_re_enabled_on_opt_in(provisioned):
    backend, spec = provisioned
    with backend.conn.cursor() as cur:  # what poison-message detection does to a queue
        cur.execute(f"ALTER QUEUE [{spec['connection']['schema']}].[orders] WITH STATUS = OFF")
    [finding] = backend.checks()
    assert finding.check == "QueueDisabled"
    opted_in = open_backend(parse_spec(spec_of(spec["connection"]["schema"], reEnableOnPoison=True)), "orders",
                            from_url(MSSQL_DSN))  # fmt: skip
    try:
        result = opted_in.apply()
        assert [str(s) for s in result.steps] == ["enable_queue"]
        assert list(result.findings) == []
    finally:
        opted_in.close()


def test_teardown_is_refused_with_the_counts_then_forced(provisioned):
    backend, spec = provisioned
    with client(spec) as q:
        q.push_many([b"a", b"b"])
    secret = {"url": base64.b64encode(MSSQL_DSN.encode()).decode()}
    status = {"conditions": [{"type": "Provisioned", "status": "True"}]}
    refused = delete("orders", "default", spec, 1, status, lambda _ns, _name: secret, force=False)
    assert refused.error is not None
    assert "2 ready" in str(refused.error) and "open conversations" in str(refused.error)
    forced = delete("orders", "default", spec, 1, status, lambda _ns, _name: secret, force=True)
    assert forced.error is None
    gone = backend.observe()
    assert gone.queues == {} and gone.services == {} and gone.contract_messages is None
