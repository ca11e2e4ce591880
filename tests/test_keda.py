"""KEDA on the single-node cluster (`dbq dev up keda`): KEDA's own operator and metrics adapter,
built from its Go module, scale a Deployment on a ring queue's depth, read with KEDA's postgresql
scaler as a login that holds only the `monitor` right. From zero to the replicas the depth asks
for, through the HPA and the aggregation layer, and back to zero."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from kubernetes import client

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.devstack.cluster import NODE_IP
from dbq.devstack.postgres import PG_PORT
from dbq.kube import Kube
from dbq.names import QueueNames
from docgen.examples import in_namespace, pages_with_examples
from tests.conftest import for_this_module
from tests.manifests import queue
from tests.operator_harness import (
    IMAGE,
    Operator,
    build_operator_image,
    free_port,
    new_namespace,
    operator_namespace,
    wait_for,
)
from tests.test_access import Accounts
from tests.test_docs_examples import DEMO_QUEUE, run

SCHEMA, QUEUE = "keda_q", "jobs"


@pytest.fixture(scope="module")
def keda(stack, cluster) -> Iterator[Any]:
    yield from for_this_module(stack, "keda")


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    name = f"keda-{secrets.token_hex(3)}"
    new_namespace(kube.api, name)
    yield name
    client.CoreV1Api(kube.api).delete_namespace(name)


@pytest.fixture
def monitored(postgres) -> Iterator[tuple[str, str]]:
    """A ring queue, and the name and url of a login that may only monitor it, whose calls of
    functions the server counts (track_functions)."""
    ring = OdbcRing(from_url(postgres.url), RingTarget(QueueNames(SCHEMA, QUEUE), 1000, 256))
    ring.apply()
    accounts = Accounts(postgres)
    name, url = accounts.login({QUEUE: ("monitor",)}, schema=SCHEMA)
    with psycopg.connect(postgres.admin_url, autocommit=True) as admin:
        admin.execute(f"ALTER ROLE \"{name}\" SET track_functions = 'all'")
    yield name, url
    accounts.close()
    ring.teardown()
    ring.close()


def apply(kubeconfig: str, namespace: str, *docs: dict[str, Any]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "-n", namespace, "apply", "-f", "-"],
                   input=manifest, text=True, check=True, capture_output=True)  # fmt: skip


def workload(name: str, image: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never"}]}}},
    }  # fmt: skip


def scaled_on_depth(name: str, per_replica: int) -> list[dict[str, Any]]:
    """A ScaledObject on the queue's depth (its stats routine, the monitor right's), polled every
    2 s; scale-down stabilization and cooldown short, for the test's sake."""
    return [
        {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication", "metadata": {"name": name},
         "spec": {"secretTargetRef": [{"parameter": "connection", "name": name, "key": "url"}]}},
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
         "spec": {"scaleTargetRef": {"name": name}, "pollingInterval": 2, "cooldownPeriod": 5,
                  "minReplicaCount": 0, "maxReplicaCount": 3,
                  "advanced": {"horizontalPodAutoscalerConfig": {
                      "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}},
                  "triggers": [{"type": "postgresql", "authenticationRef": {"name": name}, "metadata": {
                      "query": f"SELECT o_depth FROM {SCHEMA}.{QUEUE}_stats()",
                      "targetQueryValue": str(per_replica), "activationTargetQueryValue": "0"}}]}},
    ]  # fmt: skip


def test_a_deployment_scales_from_zero_on_a_queue_s_depth_and_back(
    keda, cluster, kube, namespace, monitored, postgres
):
    login, url = monitored
    apps, core = client.AppsV1Api(kube.api), client.CoreV1Api(kube.api)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "workers"}, "stringData": {"url": url}})
    apply(
        kube.kubeconfig, namespace, workload("workers", cluster.pause_image), *scaled_on_depth("workers", 100)
    )

    def replicas() -> int:
        return apps.read_namespaced_deployment("workers", namespace).spec.replicas or 0

    def ready(scaled: str) -> bool:
        found = client.CustomObjectsApi(kube.api).get_namespaced_custom_object(
            "keda.sh", "v1alpha1", namespace, "scaledobjects", scaled
        )
        conditions = found.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(lambda: ready("workers"), 60, "ScaledObject workers Ready")
    assert replicas() == 0  # an empty queue: nothing to scale
    second = {**scaled_on_depth("workers", 50)[1], "metadata": {"name": "second"}}
    with pytest.raises(
        subprocess.CalledProcessError
    ) as refused:  # by KEDA's webhook, reached at its endpoint
        apply(kube.kubeconfig, namespace, second)
    # by the ScaledObject, or by the HPA it made, whichever KEDA's webhook meets first
    said = refused.value.stderr
    assert 'admission webhook "vscaledobject.kb.io" denied' in said and "'workers'" in said
    assert (
        "is already managed by the ScaledObject 'workers'" in said or "is already managed by the hpa" in said
    )
    with psycopg.connect(postgres.url, autocommit=True) as db:  # a producer
        db.execute(f"SELECT count(*) FROM {SCHEMA}.{QUEUE}_send_batch(%s::bytea[])", ([b"job"] * 250,))
    wait_for(lambda: replicas() == 3, 120, "3 replicas for 250 messages at 100 a replica")
    # What scaling costs the database: the scaler's connections, and its calls of the stats
    # routine a second (KEDA's poll every 2 s, and the HPA's read every 15 s), over 30 s.
    calls = f"SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = '{QUEUE}_stats'"
    with psycopg.connect(postgres.admin_url, autocommit=True) as admin:
        before = admin.execute(calls).fetchone()[0]  # type: ignore[index]
        time.sleep(30)
        admin.execute("SELECT pg_stat_clear_snapshot()")
        rate = (admin.execute(calls).fetchone()[0] - before) / 30  # type: ignore[index]
        sessions = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (login,)
        ).fetchone()
    print(f"KEDA's postgresql scaler: {sessions[0]} connections, {rate:.2f} stats calls a second")  # type: ignore[index]
    # KEDA's pool: one connection in some runs, two in others
    assert sessions in ((1,), (2,)) and 0.25 <= rate <= 1.2, (sessions, rate)
    hpa = client.AutoscalingV2Api(kube.api).read_namespaced_horizontal_pod_autoscaler(
        "keda-hpa-workers", namespace
    )
    metric = hpa.spec.metrics[0].external.metric.name
    raw = subprocess.run(
        ["kubectl", "--kubeconfig", kube.kubeconfig, "get", "--raw",
         f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}"
         "?labelSelector=scaledobject.keda.sh%2Fname%3Dworkers"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert [int(float(item["value"])) for item in json.loads(raw.stdout)["items"]] == [
        250
    ]  # through the adapter
    with psycopg.connect(postgres.url, autocommit=True) as db:
        db.execute(f"SELECT {SCHEMA}.{QUEUE}_purge()")
    wait_for(lambda: replicas() == 0, 120, "back to 0 replicas once the queue is empty")


def test_the_autoscaling_guide_runs_as_written(keda, cluster, kube, postgres, tmp_path_factory):
    """The docs' `<!-- runnable: keda -->` examples, with an operator and the Queue `orders` of
    `make demo` in this test's namespace, and the pause image as the consumers'."""
    examples = [e for page in pages_with_examples("keda").values() for e in page]
    assert examples, "the autoscaling guide lost its example"
    namespaced = operator_namespace(kube, postgres, "keda-docs")
    operator = Operator(kube, namespaced.ns, tmp_path_factory.mktemp("operator") / "operator.log")
    operator.start()
    try:
        namespaced.create(yaml.safe_load(in_namespace(DEMO_QUEUE.read_text(), namespaced.ns)))
        namespaced.wait_condition("orders", "Ready", "True", 120)
        shell = {**os.environ, "KUBECONFIG": kube.kubeconfig, "WORKER_IMAGE": cluster.pause_image,
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
        for example in examples:
            run(example, namespaced.ns, shell)
    finally:
        namespaced.of("queueconsumers").force_delete_all(120)
        namespaced.of("queueusers").force_delete_all(120)
        namespaced.force_delete_all(180)
        operator.stop()


# --- QueueConsumer: the operator writes the KEDA objects -----------------------------------------
CONSUMER_SCHEMA = "keda_c"


@pytest.fixture
def consumers(kube, postgres, tmp_path) -> Iterator[Any]:
    """A namespace with the CRDs, the chart's namespaced RBAC and an operator running as its
    service account, serving the push scaler on loopback (where KEDA's host processes dial it);
    what the test made there is deleted through the operator."""
    namespaced = operator_namespace(kube, postgres, "keda-qc")
    port = free_port()
    operator = Operator(kube, namespaced.ns, tmp_path / "operator.log", args=("--scaler-port", str(port)),
                        env={"DBQ_SCALER_ADDRESS": f"127.0.0.1:{port}"})  # fmt: skip
    operator.start()
    namespaced.operator = operator  # type: ignore[attr-defined]
    try:
        yield namespaced
    finally:
        namespaced.of("queueconsumers").force_delete_all(120)
        namespaced.of("queueusers").force_delete_all(120)
        namespaced.force_delete_all(180)
        operator.stop()
        print(operator.log_text()[-3000:])


def ring_queue(cluster: Any, name: str, size: int = 4096, **spec: Any) -> None:
    cluster.create(queue(name, connection={"secretRef": {"name": "orders-db"}, "schema": CONSUMER_SCHEMA},
                         ring={"size": size}, deletionPolicy="Delete", **spec))  # fmt: skip


def consumer(name: str, queues: list[str], workload_name: str, **spec: Any) -> dict[str, Any]:
    """A QueueConsumer with the test's short timings: KEDA polls every 2 s, and the last replica
    goes 5 s after the backlog, with no HPA stabilization."""
    return {"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueConsumer", "metadata": {"name": name},
            "spec": {"queues": queues, "workload": {"name": workload_name}, "pollingIntervalSeconds": 2,
                     "cooldownSeconds": 5, "scaleDownStabilizationSeconds": 0, **spec}}  # fmt: skip


def push(postgres: Any, queue_name: str, count: int) -> None:
    """Messages "0", "1", ... "count - 1", in one batch."""
    with psycopg.connect(postgres.url, autocommit=True) as db:
        db.execute(f"SELECT count(*) FROM {CONSUMER_SCHEMA}.{queue_name}_send_batch(%s::bytea[])",
                   ([str(i).encode() for i in range(count)],))  # fmt: skip


def first_pod_after(kube: Any, namespace: str, app: str, act: Callable[[], None]) -> float:
    """Seconds from `act()` (a push) to the first Running pod labelled app=`app`."""
    core = client.CoreV1Api(kube.api)

    def running() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        return any(p.status.phase == "Running" for p in pods)

    started = time.monotonic()
    act()
    wait_for(running, 60, f"a {app} pod Running")
    return time.monotonic() - started


def deployment_replicas(kube: Any, namespace: str, name: str) -> int:
    return client.AppsV1Api(kube.api).read_namespaced_deployment(name, namespace).spec.replicas or 0


def scaled_object(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    return Kube(kube.api).find_object("keda.sh/v1alpha1", "scaledobjects", namespace, name)


def test_a_queue_consumer_scales_its_workload_from_zero_through_2000_messages_and_back(
    keda, cluster, kube, consumers, postgres
):
    ns = consumers.ns
    ring_queue(consumers, "jobs")
    consumers.wait_condition("jobs", "Ready", "True", 120)
    apply(kube.kubeconfig, ns, workload("workers", cluster.pause_image))
    scaling = consumers.of("queueconsumers")
    scaling.create(consumer("workers", ["jobs"], "workers", messagesPerReplica=500, maxReplicas=4))
    ready = scaling.wait_condition("workers", "Ready", "True", 90)
    assert ready["reason"] == "Scaling", ready
    status = scaling.get("workers")["status"]
    assert status["queueUser"] == "workers-scaler" and status["queues"] == ["jobs"]
    assert status["query"] == f'SELECT (SELECT o_depth FROM "{CONSUMER_SCHEMA}"."jobs_stats"())'
    consumers.of("queueusers").wait_condition("workers-scaler", "Ready", "True", 60)
    assert deployment_replicas(kube, ns, "workers") == 0
    pushed_at = time.monotonic()
    first = first_pod_after(kube, ns, "workers", lambda: push(postgres, "jobs", 2000))
    wait_for(
        lambda: deployment_replicas(kube, ns, "workers") == 4, 120, "4 replicas: 2,000 messages at 500 each"
    )
    print(f"first consumer pod Running {first:.1f} s after the push; 4 replicas after"
          f" {time.monotonic() - pushed_at:.1f} s")  # fmt: skip
    assert first <= 20, f"the first consumer ran {first:.1f} s after the first push (at most 20)"
    scaling.wait_condition("workers", "Active", "True", 30)
    wait_for(lambda: scaling.get("workers")["status"].get("replicas") == 4, 30, "status.replicas 4")
    with psycopg.connect(
        postgres.url, autocommit=True
    ) as db:  # the queue emptied (these consumers are pause containers)
        db.execute(f"SELECT {CONSUMER_SCHEMA}.jobs_purge()")
    wait_for(lambda: deployment_replicas(kube, ns, "workers") == 0, 120, "back to 0 after the cooldown")
    scaling.wait_condition("workers", "Active", "False", 30)
    reasons = {e.reason for e in scaling.events("workers")}
    assert {"Written", "Activated", "Scaled"} <= reasons, reasons


def test_one_scaled_object_adds_up_two_queues_and_follows_their_deletion(
    keda, cluster, kube, consumers, postgres
):
    ns = consumers.ns
    for name in ("left", "right"):
        ring_queue(consumers, name)
    for name in ("left", "right"):
        consumers.wait_condition(name, "Ready", "True", 120)
    apply(kube.kubeconfig, ns, workload("both", cluster.pause_image))
    scaling = consumers.of("queueconsumers")
    scaling.create(consumer("both", ["left", "right"], "both", messagesPerReplica=100, maxReplicas=5))
    scaling.wait_condition("both", "Ready", "True", 90)
    push(postgres, "left", 150)
    push(postgres, "right", 150)  # 300 together: 3 replicas; either alone would give 2
    wait_for(lambda: deployment_replicas(kube, ns, "both") == 3, 120, "3 replicas for 150 + 150 messages")
    found = scaled_object(kube, ns, "both")
    assert found is not None and len(found["spec"]["triggers"]) == 1  # one query, one connection pool
    consumers.delete("right")
    wait_for(
        lambda: scaling.get("both")["status"].get("queues") == ["left"], 90, "status.queues without right"
    )
    query = scaled_object(kube, ns, "both")["spec"]["triggers"][0]["metadata"]["query"]  # type: ignore[index]
    assert "right_stats" not in query and "left_stats" in query, query
    wait_for(lambda: deployment_replicas(kube, ns, "both") == 2, 120, "2 replicas for the 150 left")
    users = consumers.of("queueusers")
    assert users.get("both-scaler")["spec"]["queues"] == [{"name": "left", "rights": ["monitor"]}]
    consumers.delete("left")
    scaling.wait_condition("both", "Ready", "False", 90, reason="NoQueueReady")
    wait_for(
        lambda: scaled_object(kube, ns, "both") is None, 60, "the ScaledObject removed with the last Queue"
    )
    wait_for(lambda: not users.exists("both-scaler"), 60, "the monitor QueueUser removed")
    assert "Removed" in {e.reason for e in scaling.events("both")}


def test_a_queue_consumer_refuses_what_it_cannot_scale(keda, cluster, kube, consumers):
    ns = consumers.ns
    ring_queue(consumers, "refused", size=64)
    consumers.wait_condition("refused", "Ready", "True", 120)
    scaling = consumers.of("queueconsumers")
    # Admission: the API server's rules name the field
    for spec, said in (({"minReplicas": 3, "maxReplicas": 2}, "spec.maxReplicas must be at least spec.minReplicas"),
                       ({"messagesPerReplica": 0}, "spec.messagesPerReplica: Invalid value: 0"),
                       ({"maxReplicas": 0}, "spec.maxReplicas: Invalid value: 0")):  # fmt: skip
        with pytest.raises(client.ApiException) as refused:
            scaling.create(consumer("bad", ["refused"], "nowhere", **{"messagesPerReplica": 10, **spec}))
        assert refused.value.status == 422 and said in refused.value.body, refused.value.body
    assert not scaling.exists("bad")
    # A workload that does not exist: nothing scaled, the reason in the condition
    scaling.create(consumer("ghost", ["refused"], "nowhere", messagesPerReplica=10))
    stuck = scaling.wait_condition("ghost", "Ready", "False", 60, reason="WorkloadNotFound")
    assert "spec.workload: there is no Deployment nowhere" in stuck["message"]
    assert scaled_object(kube, ns, "ghost") is None and not consumers.of("queueusers").exists("ghost-scaler")
    # A workload another ScaledObject already scales: refused, that one named
    apply(kube.kubeconfig, ns, workload("taken", cluster.pause_image), *scaled_on_depth("taken", 100)[1:])
    scaling.create(consumer("taker", ["refused"], "taken", messagesPerReplica=10))
    stuck = scaling.wait_condition("taker", "Ready", "False", 60, reason="WorkloadTaken")
    assert "already scaled by ScaledObject taken" in stuck["message"], stuck
    assert scaled_object(kube, ns, "taker") is None
    # A name another object holds: left alone, named in the condition
    consumers.of("queueusers").create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser",
                                       "metadata": {"name": "clash-scaler"},
                                       "spec": {"queues": [{"name": "refused", "rights": ["send"]}]}})  # fmt: skip
    apply(kube.kubeconfig, ns, workload("clash", cluster.pause_image))
    scaling.create(consumer("clash", ["refused"], "clash", messagesPerReplica=10))
    stuck = scaling.wait_condition("clash", "Ready", "False", 60, reason="InvalidQueueConsumer")
    assert "QueueUser clash-scaler exists and was not written by this QueueConsumer" in stuck["message"], (
        stuck
    )
    assert consumers.of("queueusers").get("clash-scaler")["spec"]["queues"][0]["rights"] == ["send"]
    assert scaled_object(kube, ns, "clash") is None
    # A kind the cluster does not serve reads as KEDA missing (KedaNotInstalled), not as an error
    assert Kube(kube.api).list_objects("keda.sh/v1alpha1", "nosuchobjects", ns) is None


def consumer_pod(queue_name: str, results: Path, *options: str, handler_s: int = 2) -> dict[str, Any]:
    """A pod spec of dbq's image running `dbq consume OPTIONS` as a QueueUser that may only
    receive (the Secret `worker-db`): each message's handler takes `handler_s`, then appends the
    body to a file of the host (`results`), one line a message handled."""
    handler = ["sh", "-c", f'body=$(cat); sleep {handler_s}; echo "$body" >> /results/handled']
    command = ["dbq", "consume", queue_name, "--schema", CONSUMER_SCHEMA, *options, "--", *handler]
    return {"automountServiceAccountToken": False,
            "volumes": [{"name": "results", "hostPath": {"path": str(results)}}],
            "containers": [{"name": "worker", "image": IMAGE, "imagePullPolicy": "Never", "command": command,
                            "env": [{"name": "DBQ_URL", "valueFrom": {"secretKeyRef": {"name": "worker-db",
                                                                                       "key": "url"}}}],
                            "volumeMounts": [{"name": "results", "mountPath": "/results"}]}]}  # fmt: skip


def consumer_workload(name: str, queue_name: str, results: Path, at_most_once: bool) -> dict[str, Any]:
    """A Deployment of `consumer_pod`s, four handlers at a time; SIGTERM leaves them 20 s of the
    pod's 30 to finish."""
    labels = {"app": name}
    options = ["-c", "4", "--grace", "20", *(["--at-most-once"] if at_most_once else [])]
    pod = {**consumer_pod(queue_name, results, *options), "terminationGracePeriodSeconds": 30}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}  # fmt: skip


def receiving(consumers: Any, kube: Any, queue_name: str, tmp_path: Path) -> Path:
    """A QueueUser that may only receive from Queue `queue_name`, its url as the pods reach
    PostgreSQL in the Secret `worker-db`, and the host directory the pods write to."""
    users = consumers.of("queueusers")
    users.create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser", "metadata": {"name": "worker"},
                  "spec": {"queues": [{"name": queue_name, "rights": ["receive"]}]}})  # fmt: skip
    users.wait_condition("worker", "Ready", "True", 60)
    url = base64.b64decode(Kube(kube.api).read_secret(consumers.ns, "dbq-user-worker")["url"]).decode()  # type: ignore[index]
    consumers.secret("worker-db", {"url": url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}")})
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)  # written by the image's user, 10001
    return results


@pytest.fixture(scope="module")
def consumer_image(cluster) -> str:
    build_operator_image()
    cluster.import_image(IMAGE)
    return IMAGE


TOTAL = 240


@pytest.mark.parametrize("at_most_once", [True, False], ids=["at-most-once", "leased"])
def test_scaling_in_while_messages_are_in_flight_loses_and_duplicates_nothing(
    keda, cluster, kube, consumers, postgres, consumer_image, tmp_path, at_most_once
):
    """4 consumer pods, then 1 while they handle messages: the 3 stopped finish what they hold
    (at-most-once: stop popping first; leased: ack what finished), so each of 240 messages is
    handled exactly once. Leases (60 s) outlast a handler (2 s) and the grace (20 s), so no
    lease expires and no message may come twice."""
    ns, queue_name = consumers.ns, "drain_once" if at_most_once else "drain_leased"
    ring_queue(consumers, queue_name.replace("_", "-"), timeouts={"visibility": "60s"})
    consumers.wait_condition(queue_name.replace("_", "-"), "Ready", "True", 120)
    results = receiving(consumers, kube, queue_name.replace("_", "-"), tmp_path)
    handled = results / "handled"
    apply(kube.kubeconfig, ns, consumer_workload("drainers", queue_name, results, at_most_once))
    scaling = consumers.of("queueconsumers")
    scaling.create(
        consumer("drainers", [queue_name.replace("_", "-")], "drainers", messagesPerReplica=10, maxReplicas=4)
    )
    scaling.wait_condition("drainers", "Ready", "True", 90)
    push(postgres, queue_name, TOTAL)

    def lines() -> list[str]:
        return handled.read_text().split() if handled.exists() else []

    wait_for(lambda: deployment_replicas(kube, ns, "drainers") == 4, 120, "4 consumers")
    wait_for(lambda: len(lines()) >= 30, 120, "30 messages handled by the 4")
    stats = f"SELECT o_depth, o_in_flight FROM {CONSUMER_SCHEMA}.{queue_name}_stats()"
    with psycopg.connect(postgres.url, autocommit=True) as db:
        depth, in_flight = db.execute(stats).fetchone()  # type: ignore[misc]
    scaling.patch("drainers", {"spec": {"maxReplicas": 1}})  # KEDA's HPA: 4 -> 1 while they work
    wait_for(lambda: deployment_replicas(kube, ns, "drainers") == 1, 60, "1 consumer")
    with psycopg.connect(postgres.url, autocommit=True) as db:
        left = db.execute(stats).fetchone()[0]  # type: ignore[index]
    print(f"scaled in from {depth} waiting, {in_flight} leased; {left} waiting once at 1 replica")
    assert left > 0 and (at_most_once or in_flight > 0), (depth, in_flight, left)
    wait_for(lambda: len(lines()) >= TOTAL, 240, f"all {TOTAL} handled")
    with psycopg.connect(postgres.url, autocommit=True) as db:
        wait_for(lambda: db.execute(stats).fetchone() == (0, 0), 60, "nothing left waiting or leased")
    time.sleep(3)  # a late duplicate would land now
    seen = Counter(lines())
    lost = sorted(set(map(str, range(TOTAL))) - set(seen))
    twice = sorted(body for body, n in seen.items() if n > 1)
    print(f"{'at-most-once' if at_most_once else 'leased'}: {len(seen)} handled, lost {lost}, twice {twice}")
    assert not lost and not twice, (lost, twice)


def test_the_push_trigger_wakes_the_first_consumer_without_waiting_for_the_poll(
    keda, cluster, kube, consumers, postgres
):
    """KEDA polls every 30 s here, but the operator's push scaler listens: the first message
    makes the workload active at once. Switching a QueueConsumer from postgresql to push takes
    its monitor login away; the scaler holds two sessions of the operator's login."""
    ns = consumers.ns
    ring_queue(consumers, "pushed")
    consumers.wait_condition("pushed", "Ready", "True", 120)
    apply(kube.kubeconfig, ns, workload("pushed", cluster.pause_image))
    scaling, users = consumers.of("queueconsumers"), consumers.of("queueusers")
    scaling.create(consumer("pushed", ["pushed"], "pushed", messagesPerReplica=100, maxReplicas=3,
                            pollingIntervalSeconds=30))  # fmt: skip
    scaling.wait_condition("pushed", "Ready", "True", 90)
    users.wait_condition("pushed-scaler", "Ready", "True", 60)
    scaling.patch("pushed", {"spec": {"trigger": "push"}})
    wait_for(lambda: not users.exists("pushed-scaler"), 60, "the monitor QueueUser removed")

    def trigger() -> dict[str, Any]:
        return scaled_object(kube, ns, "pushed")["spec"]["triggers"][0]  # type: ignore[index]

    wait_for(lambda: trigger()["type"] == "external-push", 60, "an external-push trigger")
    assert trigger()["metadata"] == {"scalerAddress": consumers.operator.env["DBQ_SCALER_ADDRESS"]}
    scaling.wait_condition("pushed", "Ready", "True", 90)
    wait_for(
        lambda: "push scaler: " + ns + "/pushed idle" in consumers.operator.log_text(),
        60,
        "KEDA's stream open",
    )
    assert "queueUser" not in scaling.get("pushed")["status"]  # removed from status
    first = first_pod_after(kube, ns, "pushed", lambda: push(postgres, "pushed", 250))
    wait_for(
        lambda: deployment_replicas(kube, ns, "pushed") == 3,
        120,
        "3 replicas for 250 messages, from GetMetrics",
    )
    with psycopg.connect(postgres.admin_url, autocommit=True) as admin:
        sessions = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbq-push-scaler'"
        ).fetchone()[0]  # type: ignore[index]
    print(f"push trigger: first consumer pod Running {first:.1f} s after the push (KEDA polls every 30 s);"
          f" {sessions} sessions of the push scaler")  # fmt: skip
    assert first < 10, f"the first consumer ran {first:.1f} s after the push: the push scaler did not push"
    assert sessions == 2, sessions  # one for the queries, one listening
    with psycopg.connect(postgres.url, autocommit=True) as db:
        db.execute(f"SELECT {CONSUMER_SCHEMA}.pushed_purge()")
    wait_for(lambda: deployment_replicas(kube, ns, "pushed") == 0, 120, "back to 0 once the stream says idle")


def test_a_queue_consumer_with_a_job_starts_jobs_that_take_the_backlog_and_end(
    keda, cluster, kube, consumers, postgres, consumer_image, tmp_path
):
    """Long tasks: spec.job makes a ScaledJob. KEDA starts Jobs for the backlog (10 messages a
    Job, at most 3 at once); each runs `dbq consume --until-empty` and ends when nothing is left;
    each of 60 messages is handled once."""
    ns = consumers.ns
    ring_queue(consumers, "tasks", timeouts={"visibility": "60s"})
    consumers.wait_condition("tasks", "Ready", "True", 120)
    results = receiving(consumers, kube, "tasks", tmp_path)
    pod = {
        **consumer_pod("tasks", results, "-c", "2", "--until-empty", handler_s=1),
        "restartPolicy": "Never",
    }
    scaling = consumers.of("queueconsumers")
    scaling.create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueConsumer", "metadata": {"name": "tasks"},
                    "spec": {"queues": ["tasks"], "job": {"template": {"spec": pod}, "backoffLimit": 0},
                             "messagesPerReplica": 10, "maxReplicas": 3, "pollingIntervalSeconds": 2}})  # fmt: skip
    scaling.wait_condition("tasks", "Ready", "True", 90)
    found = Kube(kube.api).find_object("keda.sh/v1alpha1", "scaledjobs", ns, "tasks")
    assert found is not None and found["spec"]["maxReplicaCount"] == 3
    push(postgres, "tasks", 60)
    handled = results / "handled"

    def lines() -> list[str]:
        return handled.read_text().split() if handled.exists() else []

    batch = client.BatchV1Api(kube.api)
    wait_for(lambda: len(lines()) >= 60, 240, "60 messages handled by the Jobs")
    jobs = batch.list_namespaced_job(ns, label_selector="scaledjob.keda.sh/name=tasks").items
    wait_for(lambda: all((j.status.succeeded or 0) == 1 for j in
                         batch.list_namespaced_job(ns, label_selector="scaledjob.keda.sh/name=tasks").items),
             120, "every Job ended, succeeded")  # fmt: skip
    time.sleep(3)  # a late duplicate would land now
    seen = Counter(lines())
    print(f"ScaledJob: {len(jobs)} Jobs started, {len(seen)} messages handled")
    assert set(seen) == set(map(str, range(60))) and max(seen.values()) == 1, seen
    assert len(jobs) >= 2, jobs  # the backlog took more than one Job
    with psycopg.connect(postgres.url, autocommit=True) as db:
        assert db.execute(f"SELECT o_depth, o_in_flight FROM {CONSUMER_SCHEMA}.tasks_stats()").fetchone() == (
            0,
            0,
        )
