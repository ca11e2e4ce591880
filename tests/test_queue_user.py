"""QueueUsers end to end: the real API server's admission, the operator (with the chart's RBAC)
making logins, grants and Secrets on the real PostgreSQL, rotation, revocation and deletion."""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cassandra import Unauthorized
from kubernetes.client.rest import ApiException

from dbq.client import connect
from dbq.errors import AuthenticationFailed, DatabaseError, PermissionDenied
from dbq.names import login_role
from docgen.examples import pages_with_examples
from tests.manifests import pipes_queue
from tests.operator_harness import Operator, operator_namespace, wait_for
from tests.test_cassandra_access import CACHES_S
from tests.test_docs_examples import run
from tests.test_operator import fresh

pytestmark = [pytest.mark.kube, pytest.mark.postgres]


@pytest.fixture(scope="module")
def env(kube, own_postgres, tmp_path_factory):
    # Its own database: the Queue's status counts every client session on the operator's login
    # in the database, and other modules' sessions must not count.
    postgres = own_postgres
    cluster = operator_namespace(kube, postgres, "dbq-users")
    operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("operator") / "operator.log")
    operator.start()
    yield cluster, operator, postgres
    cluster.of("queueusers").force_delete_all(120)
    cluster.force_delete_all(180)
    operator.stop()


def user(name: str, queues: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body = {"queues": queues or [], **spec}
    return {"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser", "metadata": {"name": name}, "spec": body}


def secret_data(cluster, name: str) -> dict[str, str] | None:
    try:
        found = cluster.core.read_namespaced_secret(f"dbq-user-{name}", cluster.ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}


def login_exists(postgres, login: str) -> bool:
    with psycopg.connect(postgres.admin_url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (login,)).fetchone() == (1,)


@pytest.fixture(scope="module")
def orders(env) -> tuple[str, str]:
    """A Ready queue of the namespace: its name and schema."""
    cluster, _, _ = env
    doc, schema = fresh("orders")
    cluster.create(doc)
    cluster.wait_condition("orders", "Ready", "True", timeout=120)
    return "orders", schema


# Refused by the API server, naming the field: nothing reaches the operator.
REFUSED = [
    ("unknown-right", user("u1", [{"name": "orders", "rights": ["send", "delete"]}]), "spec.queues[0].rights[1]"),
    ("topic-right-on-a-queue", user("u2", [{"name": "orders", "rights": ["publish"]}]), "spec.queues[0].rights[0]"),
    ("queue-of-another-namespace", user("u3", [{"name": "other/orders", "rights": ["send"]}]), "spec.queues[0].name"),
    ("no-rights", user("u4", [{"name": "orders", "rights": []}]), "spec.queues[0].rights"),
    ("nothing-named", user("u5"), "at least one queue"),
    ("named-twice", user("u6", [{"name": "orders", "rights": ["send"]}, {"name": "orders", "rights": ["peek"]}]),
     "each name once"),
    ("zero-connections", user("u7", [{"name": "orders", "rights": ["send"]}], connectionLimit=0),
     "spec.connectionLimit"),
    ("negative-connections", user("u8", [{"name": "orders", "rights": ["send"]}], connectionLimit=-5),
     "spec.connectionLimit"),
    ("name-not-a-role", user("x" * 45, [{"name": "orders", "rights": ["send"]}]), "names its login"),
    ("name-with-a-dot", user("app.users", [{"name": "orders", "rights": ["send"]}]), "names its login"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "doc", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_bad_queue_user_is_refused_at_admission_naming_the_field(env, case, doc, words):
    cluster, _, postgres = env
    with pytest.raises(ApiException) as err:
        cluster.of("queueusers").create(doc)
    assert err.value.status == 422, err.value.body
    assert words in err.value.body, err.value.body
    assert not login_exists(postgres, login_role(cluster.ns, doc["metadata"]["name"]))


def test_a_queue_user_gets_a_login_its_rights_and_a_secret_and_nothing_more(env, orders):
    cluster, operator, postgres = env
    users = cluster.of("queueusers")
    queue, schema = orders
    users.create(user("producer", [{"name": queue, "rights": ["send"]}], connectionLimit=5))
    users.wait_condition("producer", "Ready", "True", timeout=60, reason="Granted")
    status = users.get("producer")["status"]
    login = login_role(cluster.ns, "producer")
    assert status["login"] == login and status["secretName"] == "dbq-user-producer"
    assert status["granted"] == [{"kind": "queue", "name": queue, "rights": ["send"]}]
    data = secret_data(cluster, "producer")
    assert data is not None and data["username"] == login
    assert json.loads(data["queues"]) == {queue: {"schema": schema, "name": queue, "rights": ["send"]}}
    with connect(data["url"], queue, schema=schema, smart_batching=False) as q:
        assert q.push(b"from the producer") > 0
        with pytest.raises(PermissionDenied) as refused:
            q.pop(timeout=0)
        assert refused.value.right == "receive"
    with psycopg.connect(postgres.admin_url, autocommit=True) as conn:
        limit = conn.execute("SELECT rolconnlimit, rolsuper, rolcreaterole FROM pg_roles WHERE rolname = %s",
                             (login,)).fetchone()  # fmt: skip
        assert limit == (5, False, False)
    reasons = {e.reason for e in users.events("producer")}
    assert {"Granted", "Rotated"} <= reasons
    # Nowhere but in the Secret: not in the operator's log, an Event or the status.
    password = data["password"]
    assert password not in operator.log_text()
    assert all(password not in (e.message or "") for e in users.events("producer"))
    assert password not in json.dumps(users.get("producer"))


def test_a_right_removed_from_the_spec_is_refused_at_the_next_call(env, orders):
    cluster, _, _ = env
    users = cluster.of("queueusers")
    queue, schema = orders
    users.create(user("worker", [{"name": queue, "rights": ["receive", "monitor"]}]))
    users.wait_condition("worker", "Ready", "True", timeout=60)
    data = secret_data(cluster, "worker")
    assert data is not None
    with connect(data["url"], queue, schema=schema, smart_batching=False, pool_size=1) as q:
        assert q.stats() is not None
        users.patch("worker", {"spec": {"queues": [{"name": queue, "rights": ["receive"]}]}})
        wait_for(lambda: users.get("worker")["status"].get("granted") == [
            {"kind": "queue", "name": queue, "rights": ["receive"]}], 60, "monitor revoked")  # fmt: skip
        with pytest.raises(PermissionDenied):
            q.stats()  # the same session
        q.pop(timeout=0)  # receive kept
    assert "Revoked" in {e.reason for e in users.events("worker")}


def test_rotation_by_annotation_and_by_a_deleted_secret(env, orders):
    cluster, _, _ = env
    users = cluster.of("queueusers")
    queue, schema = orders
    users.create(user("rotating", [{"name": queue, "rights": ["send"]}]))
    users.wait_condition("rotating", "Ready", "True", timeout=60)
    first = secret_data(cluster, "rotating")
    assert first is not None
    with psycopg.connect(first["url"], autocommit=True) as open_before:
        users.patch("rotating", {"metadata": {"annotations": {"dbq.dev/rotate": "1"}}})
        second = wait_for(lambda: (d := secret_data(cluster, "rotating")) and d["password"] != first["password"]
                          and d, 60, "a new password")  # fmt: skip
        with pytest.raises(AuthenticationFailed):
            connect(first["url"], queue, schema=schema)
        with connect(second["url"], queue, schema=schema, smart_batching=False) as q:
            assert q.push(b"after rotation") > 0
        assert open_before.execute("SELECT 1").fetchone() == (1,)  # checked at connect only
    assert users.get("rotating")["status"]["rotation"] == "1"
    cluster.core.delete_namespaced_secret("dbq-user-rotating", cluster.ns)
    third = wait_for(lambda: secret_data(cluster, "rotating"), 90, "the Secret made again")
    assert third["password"] != second["password"]
    with connect(third["url"], queue, schema=schema, smart_batching=False) as q:
        assert q.push(b"with the new Secret") > 0


@pytest.mark.parametrize(
    ("case", "queues", "topics", "words"),
    [
        ("no-such-queue", [{"name": "ghost", "rights": ["send"]}], [], "there is no Queue ghost"),
        ("topic-as-queue", [{"name": "events", "rights": ["send"]}], [], "events is a Topic: list it under spec.topics"),
        ("queue-as-topic", [], [{"name": "orders", "rights": ["publish"]}], "orders is a Queue: list it under spec.queues"),
        ("two-databases", [{"name": "orders", "rights": ["send"]}, {"name": "elsewhere", "rights": ["send"]}], [],
         "one QueueUser is one login on one database"),
    ],
)  # fmt: skip
def test_what_admission_cannot_know_is_reported_in_status_and_makes_nothing(
    env, orders, case, queues, topics, words
):
    cluster, _, postgres = env
    users = cluster.of("queueusers")
    if case == "topic-as-queue" and not cluster.of("topics").exists("events"):
        cluster.of("topics").create({
            "apiVersion": "dbq.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "events"},
            "spec": {"backend": "postgres", "connection": {"secretRef": {"name": "orders-db"}, "schema": orders[1]}},
        })  # fmt: skip
    if case == "two-databases" and not cluster.exists("elsewhere"):
        cluster.secret("other-db", {"url": postgres.url.rsplit("/", 1)[0] + "/postgres"})
        doc, _ = fresh("elsewhere", connection={"secretRef": {"name": "other-db"}})
        cluster.create(doc)
    name = f"bad-{case}"
    users.create(user(name, queues, topics=topics))
    ready = users.wait_condition(name, "Ready", "False", timeout=60, reason="InvalidQueueUser")
    assert words in ready["message"]
    assert users.condition(name, "Stalled").get("status") == "True"
    assert not login_exists(postgres, login_role(cluster.ns, name))
    assert secret_data(cluster, name) is None
    users.delete(name)


def test_a_deleted_queue_user_loses_its_open_sessions_within_10_s_and_its_login(env, orders):
    cluster, _, postgres = env
    users = cluster.of("queueusers")
    queue, _ = orders
    users.create(user("leaving", [{"name": queue, "rights": ["send"]}]))
    users.wait_condition("leaving", "Ready", "True", timeout=60)
    data = secret_data(cluster, "leaving")
    assert data is not None
    login = data["username"]
    # The Secret is the QueueUser's: a cluster's garbage collector deletes it with it (the local
    # API server runs no controller manager, so only the reference is checked here).
    owners = cluster.core.read_namespaced_secret("dbq-user-leaving", cluster.ns).metadata.owner_references
    assert [(o.kind, o.name, o.controller) for o in owners] == [("QueueUser", "leaving", True)]
    with psycopg.connect(data["url"], autocommit=True) as session:
        deleted = time.monotonic()
        users.delete("leaving")

        def ended() -> bool:
            try:
                session.execute("SELECT 1")
            except psycopg.OperationalError:
                return True
            return False

        wait_for(ended, 10, "the open session ended")
        assert time.monotonic() - deleted < 10
    wait_for(lambda: not login_exists(postgres, login), 30, "the login dropped")
    assert "Deleted" in {e.reason for e in users.events("leaving")}
    assert login == login_role(cluster.ns, "leaving")


def test_applications_on_the_queues_own_secret_are_counted_and_warned_of(env, orders):
    """The Queue's Secret is the operator's login: sessions of dbq's client on it show in the
    Queue's status and raise one AdminSecretInUse Warning, so a platform team finds them."""
    cluster, _, postgres = env
    queue, schema = orders
    with connect(postgres.url, queue, schema=schema, smart_batching=False) as q:
        q.push(b"as the operator")
        wait_for(lambda: (cluster.get(queue)["status"].get("operatorLoginSessions") or 0) >= 1, 60,
                 "the session counted")  # fmt: skip
        wait_for(
            lambda: any(e.reason == "AdminSecretInUse" for e in cluster.events(queue)), 30, "the Warning"
        )
        assert q.pop(timeout=0) is not None
    wait_for(lambda: cluster.get(queue)["status"].get("operatorLoginSessions") == 0, 60, "no session left")


@pytest.mark.cassandra
def test_queue_users_on_a_pipes_queue_get_cassandra_roles_and_lose_them_with_the_queue_user(
    env, stack, cassandra
):
    """A sender pushes and cannot take; a receiver takes and acks and cannot drop a table; a
    deleted QueueUser's role is gone, and its open connection is refused within the caches' delay."""
    cluster, operator, _ = env
    users = cluster.of("queueusers")
    cluster.secret("events-db", {"url": stack.cassandra.url()})
    keyspace = f"e2e_{secrets.token_hex(4)}"
    cluster.create(pipes_queue("events", keyspace))
    cluster.wait_condition("events", "Ready", "True", timeout=90)
    users.create(user("events-sender", [{"name": "events", "rights": ["send"]}]))
    users.create(user("events-worker", [{"name": "events", "rights": ["receive"]}]))
    for name in ("events-sender", "events-worker"):
        users.wait_condition(name, "Ready", "True", timeout=60, reason="Granted")
    sender, worker = secret_data(cluster, "events-sender"), secret_data(cluster, "events-worker")
    assert sender is not None and worker is not None
    assert sender["url"].startswith(f"cassandra://{login_role(cluster.ns, 'events-sender')}:")
    assert sender["password"] not in operator.log_text()
    with connect(sender["url"], "events", schema=keyspace, smart_batching=False) as q:
        q.push(b"from the sender")
        with pytest.raises(PermissionDenied) as refused:
            q.acquire(timeout=0)
        assert refused.value.right == "receive"
    with connect(worker["url"], "events", schema=keyspace, smart_batching=False) as q:
        m = q.acquire(timeout=5)
        assert m is not None and m.body == b"from the sender"
        m.ack()
        with pytest.raises(Unauthorized):
            q.session.execute(f'DROP TABLE "{keyspace}"."events_waiting"')
        roles = {r[0] for r in cassandra.execute("LIST ROLES")}
        assert login_role(cluster.ns, "events-worker") in roles
        users.delete("events-worker")
        wait_for(lambda: login_role(cluster.ns, "events-worker") not in {r[0] for r in cassandra.execute("LIST ROLES")},
                 30, "the role dropped")  # fmt: skip
        dropped = time.monotonic()

        def refused_now() -> bool:
            try:
                q.pop(timeout=0)
            except (PermissionDenied, AuthenticationFailed, DatabaseError):
                return True
            return False

        wait_for(refused_now, CACHES_S, "the open connection refused")
        assert time.monotonic() - dropped < CACHES_S
    assert "Deleted" in {e.reason for e in users.events("events-worker")}


@pytest.mark.cassandra
def test_the_cassandra_security_guide_runs_as_written(env, stack, kube):
    """The docs' `<!-- runnable: cassandra -->` examples, in this module's namespace, with the
    Secret `events-cassandra` of manifests/examples/queue-cassandra.yaml (the stack's url and CA)."""
    cluster, _, _ = env
    cluster.secret("events-cassandra", {"url": stack.cassandra.url(), "ca": stack.postgres.tls.ca_pem()})
    examples = [e for page in pages_with_examples("cassandra").values() for e in page]
    assert examples, "the security guide lost its Cassandra example"
    shell = {
        **os.environ,
        "KUBECONFIG": kube.kubeconfig,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    shown = "".join(run(example, cluster.ns, shell) for example in examples)
    assert "button 7" in shown and "refused: tracker may only send" in shown
