"""Queues that share a schema (PostgreSQL) or keyspace (Cassandra), provisioned and deleted at
the same moment, as an operator's handlers do when several Queues are applied or deleted
together: every one succeeds at the first try, and the last one out drops the schema.

Before provisioning locked the schema (not only the queue), concurrent CREATE SCHEMA raced
(`duplicate key ... pg_namespace_nspname_index`), and concurrent deletions could each see the
others' queues and leave an empty schema behind.
"""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Callable
from typing import Any

import pytest

from dbq.controller.reconcile import Outcome, delete, reconcile
from tests.manifests import queue

QUEUES = 5
ROUNDS = 3
PROVISIONED = {"conditions": [{"type": "Provisioned", "status": "True"}]}


def at_once(calls: list[Callable[[], Outcome]]) -> list[Outcome]:
    """Run the calls in threads released together by a barrier."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def round_trip(spec: dict[str, Any], url: str) -> None:
    data = {"url": base64.b64encode(url.encode()).decode()}

    def secret(_namespace: str, _name: str) -> dict[str, Any]:
        return data

    names = [f"shared-{i}" for i in range(QUEUES)]
    made = at_once([lambda n=n: reconcile(n, "default", spec, 1, {}, secret) for n in names])
    assert [(o.error, [e.reason for e in o.events if e.type == "Warning"]) for o in made] == [
        (None, [])
    ] * QUEUES
    gone = at_once(
        [lambda n=n: delete(n, "default", spec, 1, PROVISIONED, secret, force=False) for n in names]
    )
    assert [o.error for o in gone] == [None] * QUEUES


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_postgres_queues_of_one_schema_come_and_go_together(own_postgres, round_):
    # Its own database: other modules' clients on the operator's login would raise
    # AdminSecretInUse Warnings here.
    postgres = own_postgres
    schema = f"shared_{secrets.token_hex(3)}"
    spec = {**queue()["spec"], "connection": {"secretRef": {"name": "s"}, "schema": schema}}
    round_trip(spec, postgres.url)
    cur = postgres.connect().cursor()
    assert not cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval()


def test_cassandra_queues_of_one_keyspace_come_and_go_together(cassandra, stack):
    keyspace = f"shared_{secrets.token_hex(3)}"
    spec = {
        "backend": "cassandra",
        "design": "pipes",
        "connection": {"secretRef": {"name": "s"}, "schema": keyspace},
    }
    try:
        round_trip(spec, stack.cassandra.url())
        assert not list(cassandra.execute("SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
                                          (keyspace,)))  # fmt: skip
    finally:
        cassandra.execute(f'DROP KEYSPACE IF EXISTS "{keyspace}"')
