"""Deletion (`dbq.controller.reconcile.delete`, which the kopf handler and `dbq apply --delete`
run): a database failure in the middle of it is reported in dbq's one error family, with a
reason and a Warning Event, on every design.

Before the error family was unified, a pipes queue whose client failed while deletion measured
its depth raised the client's QueueError, which the controller did not catch: kopf got an
untyped exception, with no reason and no Warning Event.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from dbq.controller.reconcile import delete, reconcile
from dbq.errors import DbqError
from tests.manifests import queue

PROVISIONED = {"conditions": [{"type": "Provisioned", "status": "True"}]}


def secret_reader(url: str) -> Any:
    data = {"url": base64.b64encode(url.encode()).decode()}
    return lambda _namespace, _name: data


def provisioned(spec: dict[str, Any], url: str) -> str:
    name = f"del-{secrets.token_hex(3)}"
    outcome = reconcile(name, "default", spec, 1, {}, secret_reader(url))
    assert outcome.ok, outcome.error
    return name


def test_a_pipes_queue_failing_while_deletion_measures_it_is_reported_with_a_reason(cassandra, stack):
    url = stack.cassandra.url()
    keyspace = f"del_{secrets.token_hex(3)}"
    spec = {
        "backend": "cassandra",
        "design": "pipes",
        "connection": {"secretRef": {"name": "s"}, "schema": keyspace},
    }
    name = provisioned(spec, url)
    # Behind dbq's back, the table the client reads the queue's state from goes away.
    cassandra.execute(f'DROP TABLE "{keyspace}"."{name.replace("-", "_")}_state"')
    try:
        outcome = delete(name, "default", spec, 1, PROVISIONED, secret_reader(url), force=False)
        assert isinstance(outcome.error, DbqError)
        assert outcome.error.reason == "DatabaseError"
        warnings = [e for e in outcome.events if e.type == "Warning"]
        assert [e.reason for e in warnings] == ["DatabaseError"]
        host, port = stack.cassandra.contact
        assert "cannot delete yet" in warnings[0].message and f"{host}:{port}" in warnings[0].message
        assert stack.cassandra.auth.password not in warnings[0].message
    finally:
        cassandra.execute(f'DROP KEYSPACE IF EXISTS "{keyspace}"')


def test_a_ring_queue_failing_while_deletion_measures_it_is_reported_with_a_reason(postgres):
    doc = queue()
    schema = f"del_{secrets.token_hex(3)}"
    spec = {**doc["spec"], "connection": {"secretRef": {"name": "s"}, "schema": schema}}
    name = provisioned(spec, postgres.url)
    cur = postgres.connect().cursor()
    cur.execute(f'DROP TABLE "{schema}"."{name.replace("-", "_")}_spill"')
    cur.commit()
    outcome = delete(name, "default", spec, 1, PROVISIONED, secret_reader(postgres.url), force=False)
    assert isinstance(outcome.error, DbqError) and outcome.error.reason == "DatabaseError"
    assert [e.reason for e in outcome.events if e.type == "Warning"] == ["DatabaseError"]
    # Forced, the same queue is dropped whatever is missing.
    forced = delete(name, "default", {**spec, "deletionPolicy": "Delete"}, 1, PROVISIONED,
                    secret_reader(postgres.url), force=True)  # fmt: skip
    assert forced.error is None and [e.reason for e in forced.events] == ["Deleted"]
    assert not cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval()


def test_a_deletion_run_again_after_it_dropped_the_queue_succeeds(postgres):
    """kopf runs the deletion handler again when it could not remove its finalizer the first
    time: the queue's objects are gone by then, and DeleteIfEmpty's look at the depth must not
    fail on them (it did, for ever: "relation ..._ring does not exist"). It drops nothing, so it
    posts no second Deleted Event, whether the schema went with the queue or a neighbour keeps it."""
    doc = queue()
    spec = {
        **doc["spec"],
        "connection": {"secretRef": {"name": "s"}, "schema": f"del_{secrets.token_hex(3)}"},
    }
    for neighbours in (0, 1):
        names = [provisioned(spec, postgres.url) for _ in range(1 + neighbours)]
        first = delete(names[0], "default", spec, 1, PROVISIONED, secret_reader(postgres.url), force=False)
        assert first.error is None and [e.reason for e in first.events] == ["Deleted"]
        again = delete(names[0], "default", spec, 1, PROVISIONED, secret_reader(postgres.url), force=False)
        assert again.error is None and again.events == []
        for name in names[1:]:
            assert (
                delete(name, "default", spec, 1, PROVISIONED, secret_reader(postgres.url), force=True).error
                is None
            )
