"""Faults under a running operator (default drift interval, 60 s; upkeep tick 5 s): PostgreSQL
stopped and started, the API server restarted, a Queue's Secret rotated to a new password.
Each test prints what it measured.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dbq.backends.postgres.access import helper_statements
from dbq.client import connect
from tests.operator_harness import Cluster, Operator, operator_namespace, wait_for
from tests.test_operator import fresh

pytestmark = pytest.mark.serial  # it stops PostgreSQL and restarts the API server under the others

DETECT_S = 10.0  # Ready must follow the database within this, each way


@pytest.fixture(scope="module")
def faults(kube, postgres, stack, tmp_path_factory) -> Iterator[tuple[Cluster, Operator, Any]]:
    cluster = operator_namespace(kube, postgres, "dbq-faults")
    operator = Operator(
        kube, cluster.ns, tmp_path_factory.mktemp("faults") / "operator.log", drift_interval=60
    )
    operator.start()
    yield cluster, operator, postgres
    cluster.force_delete_all(60)
    operator.stop()
    client.CoreV1Api(kube.api).delete_namespace(cluster.ns)


def events(cluster: Cluster, name: str, reason: str, since: float) -> list[Any]:
    """Events of `reason` for Queue `name` last seen after `since` (epoch seconds)."""
    found = []
    for e in cluster.events(name):
        at = e.last_timestamp or e.event_time or e.first_timestamp
        if e.reason == reason and at is not None and at.timestamp() >= since - 1:
            found.append(e)
    return found


def ready_is(cluster: Cluster, name: str, status: str, reason: str | None = None) -> bool:
    c = cluster.condition(name, "Ready")
    return c.get("status") == status and (reason is None or c.get("reason") == reason)


def test_postgres_outage_turns_ready_false_and_back_with_one_event_each_way(faults, stack):
    cluster, operator, postgres = faults
    doc, schema = fresh("outage-q", ring={"size": 1000})
    cluster.create(doc)
    cluster.wait_condition("outage-q", "Ready", "True", timeout=60)
    with connect(postgres.url, "outage-q", schema=schema) as q:
        ids = q.push_many([b"%d" % i for i in range(100)])
    pid = operator.proc.pid if operator.proc else None

    stopped = time.time()
    stack.postgres.stop()
    try:
        wait_for(lambda: ready_is(cluster, "outage-q", "False", "DatabaseUnreachable"), 30, "Ready=False")
        detected = time.time() - stopped
        time.sleep(12)  # more failing ticks: still one Warning
        warnings = events(cluster, "outage-q", "DatabaseUnreachable", stopped)
        message = cluster.condition("outage-q", "Ready")["message"]
    finally:
        stack.postgres.start()
    started = time.time()
    wait_for(lambda: ready_is(cluster, "outage-q", "True"), 30, "Ready=True")
    recovered = time.time() - started
    time.sleep(6)
    ready_events = events(cluster, "outage-q", "Ready", started)
    print(f"outage: Ready=False {detected:.1f}s after PostgreSQL stopped, Ready=True {recovered:.1f}s after it"
          f" started; Warning events {len(warnings)}, Ready events {len(ready_events)}")  # fmt: skip
    assert detected <= DETECT_S and recovered <= DETECT_S
    assert len(warnings) == 1 and len(ready_events) == 1
    assert postgres.url.split(":")[2].split("@")[0] not in message  # no password in the condition
    with connect(postgres.url, "outage-q", schema=schema) as q:
        got = q.pop_many(200)
    assert sorted(m.id for m in got) == sorted(ids)  # nothing lost
    assert operator.proc is not None and operator.proc.pid == pid and operator.proc.poll() is None


def test_the_operator_resumes_watching_after_the_api_server_restarts(faults, stack):
    cluster, operator, _ = faults
    stack.kube.apiserver.stop()
    down = time.time()
    time.sleep(3)
    stack.kube.start()
    back = time.time()
    doc, _ = fresh("after-restart-q")
    wait_for(lambda: cluster.create(doc), 30, "the API server accepts a Queue")
    cluster.wait_condition("after-restart-q", "Ready", "True", timeout=90)
    print(f"API server down {back - down:.1f}s; a Queue created after it came back was Ready"
          f" {time.time() - back:.1f}s after its return")  # fmt: skip
    assert operator.proc is not None and operator.proc.poll() is None


def test_a_rotated_secret_is_followed_without_a_restart(faults):
    cluster, operator, postgres = faults
    role = f"rot_{secrets.token_hex(3)}"
    first, second = secrets.token_hex(12), secrets.token_hex(12)
    admin = postgres.admin()  # a DBA makes another operator login, as for dbq_operator
    admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{first}'")
    admin.execute(f'GRANT CREATE, CONNECT ON DATABASE "{postgres.name}" TO {role}')
    for statement in helper_statements(role):
        admin.execute(statement)
    host_part = postgres.url.split("@", 1)[1]
    cluster.secret("rotating-db", {"url": f"postgresql://{role}:{first}@{host_part}"})
    doc, _ = fresh("rotated-q", connection={"secretRef": {"name": "rotating-db"}})
    cluster.create(doc)
    cluster.wait_condition("rotated-q", "Ready", "True", timeout=60)
    pid = operator.proc.pid if operator.proc else None

    admin.execute(f"ALTER ROLE {role} PASSWORD '{second}'")
    changed = time.time()
    wait_for(
        lambda: ready_is(cluster, "rotated-q", "False", "AuthenticationFailed"), 30, "AuthenticationFailed"
    )
    noticed = time.time() - changed
    cluster.secret("rotating-db", {"url": f"postgresql://{role}:{second}@{host_part}"})
    rotated = time.time()
    wait_for(lambda: ready_is(cluster, "rotated-q", "True"), 30, "Ready again with the new password")
    followed = time.time() - rotated
    print(f"rotation: AuthenticationFailed {noticed:.1f}s after the password changed, Ready {followed:.1f}s"
          " after the Secret did")  # fmt: skip
    assert noticed <= DETECT_S and followed <= DETECT_S
    text = operator.log_text() + "".join(e.message or "" for e in cluster.events("rotated-q"))
    assert first not in text and second not in text
    assert operator.proc is not None and operator.proc.pid == pid and operator.proc.poll() is None
