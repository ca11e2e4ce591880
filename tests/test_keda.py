"""KEDA on the single-node cluster (`dbq dev up keda`): KEDA's own operator and metrics adapter,
built from its Go module, scale a Deployment on a ring queue's depth, read with KEDA's postgresql
scaler as a login that holds only the `monitor` right. From zero to the replicas the depth asks
for, through the HPA and the aggregation layer, and back to zero."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from kubernetes import client

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames
from docgen.examples import in_namespace, pages_with_examples
from tests.conftest import for_this_module
from tests.operator_harness import Operator, new_namespace, operator_namespace, wait_for
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
        namespaced.of("queueusers").force_delete_all(120)
        namespaced.force_delete_all(180)
        operator.stop()
