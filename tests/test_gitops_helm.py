"""The operator installed by Flux from git: helm-controller installs charts/dbq-operator (from a
chart repository served on loopback, as `helm repo index` builds one) on the single-node
cluster with the image built here, a Queue committed beside the HelmRelease becomes Ready
through the operator's pods, and a change of values committed to git rolls the Deployment."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dbq.devstack.cluster import NODE_IP
from dbq.devstack.postgres import PG_PORT
from tests.flux_harness import (
    GIT_REPOSITORY,
    HELM_RELEASE,
    HELM_REPOSITORY,
    KUSTOMIZATION,
    FluxObjects,
    Repository,
)
from tests.manifests import queue
from tests.operator_harness import IMAGE, ROOT, Cluster, build_image, free_port, new_namespace, wait_for

RELEASE = "dbq-flux"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


@pytest.fixture
def chart_repository(stack, tmp_path) -> Iterator[str]:
    """charts/dbq-operator packaged and indexed (`helm package`, `helm repo index`), served over
    HTTP on loopback; its URL."""
    helm = str(stack.paths.cache / "bin" / "helm")
    charts = tmp_path / "charts"
    charts.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    subprocess.run([helm, "package", str(ROOT / "charts" / "dbq-operator"), "-d", str(charts)], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([helm, "repo", "index", str(charts), "--url", url], check=True, capture_output=True)
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(charts)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    yield url
    server.terminate()
    server.wait(10)


def release_values(queues_ns: str, upkeep_tick: int) -> dict[str, Any]:
    repository, tag = IMAGE.split(":")
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "watchNamespaces": [queues_ns],
        "operator": {"upkeepTick": upkeep_tick},
    }


def test_flux_installs_the_operator_with_helm_and_rolls_it_when_its_values_change_in_git(
    cluster, kube, postgres, flux, chart_repository, tmp_path: Path
):
    build_image("operator")
    cluster.import_image(IMAGE)
    suffix = secrets.token_hex(3)
    operator_ns, queues_ns = f"dbq-flux-{suffix}", f"shop-flux-{suffix}"
    for name in (operator_ns, queues_ns):
        new_namespace(kube.api, name)
    queues = Cluster(kube.api, queues_ns)
    queues.secret(
        "orders-db",
        {"url": postgres.url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}"), "ca": postgres.ca},
    )
    objects = FluxObjects(kube.api, operator_ns)
    core = client.CoreV1Api(kube.api)
    repository = Repository(flux, f"platform-{suffix}", tmp_path / "work")

    def release(upkeep_tick: int) -> dict[str, Any]:
        return {
            "apiVersion": f"{HELM_RELEASE[0]}/{HELM_RELEASE[1]}", "kind": "HelmRelease",
            "metadata": {"name": RELEASE},
            "spec": {"interval": "1m", "releaseName": RELEASE, "install": {"crds": "Skip"},
                     "upgrade": {"crds": "Skip"},
                     "chart": {"spec": {"chart": "dbq-operator", "version": "*",
                                        "sourceRef": {"kind": "HelmRepository", "name": "dbq"}}},
                     "values": release_values(queues_ns, upkeep_tick)},
        }  # fmt: skip

    def operator_pods() -> list[Any]:
        return [p for p in core.list_namespaced_pod(operator_ns, label_selector=SELECTOR).items
                if not p.metadata.deletion_timestamp]  # fmt: skip

    def rolled_to(upkeep_tick: int) -> bool:
        pods = operator_pods()
        ready = [p for p in pods
                 if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
                 and {e.name: e.value for e in p.spec.containers[0].env}.get("DBQ_UPKEEP_TICK") == str(upkeep_tick)]  # fmt: skip
        return len(pods) == len(ready) == 2

    schema = f"gitops_helm_{suffix}"
    orders = queue("orders", deletionPolicy="Delete")
    orders["spec"]["connection"]["schema"] = schema
    repository.commit({"release.yaml": release(5)}, "the operator", folder="operator")
    sha = repository.commit({"orders.yaml": orders}, "a queue", folder="queues")
    objects.create(HELM_REPOSITORY, "dbq", {"url": chart_repository, "interval": "1m"})
    objects.create(
        GIT_REPOSITORY, "platform", {"url": repository.url, "ref": {"branch": "main"}, "interval": "1m"}
    )
    source = {"kind": "GitRepository", "name": "platform"}
    objects.create(KUSTOMIZATION, "operator", {"sourceRef": source, "path": "./operator", "prune": True,
                                               "wait": True, "timeout": "5m", "interval": "1m",
                                               "targetNamespace": operator_ns})  # fmt: skip
    objects.create(KUSTOMIZATION, "queues", {"sourceRef": source, "path": "./queues", "prune": True, "wait": True,
                                             "timeout": "2m", "interval": "1m", "retryInterval": "5s",
                                             "targetNamespace": queues_ns, "dependsOn": [{"name": "operator"}]})  # fmt: skip
    try:
        # The queues' Kustomization waits for the operator's (dependsOn), which waits for the
        # HelmRelease, which waits for the Deployment's pods.
        ready = objects.applied("queues", f"main@sha1:{sha}", timeout=420)
        assert ready["status"] == "True", (ready, objects.ready(HELM_RELEASE, RELEASE))
        assert queues.condition("orders", "Ready")["status"] == "True"
        assert rolled_to(5)
        assert objects.ready(HELM_RELEASE, RELEASE)["status"] == "True"
        # A change of values committed to git: helm-controller upgrades, the Deployment rolls.
        sha = repository.commit(
            {"release.yaml": release(7)}, "the operator: upkeep every 7 s", folder="operator"
        )
        objects.reconcile_now((GIT_REPOSITORY, "platform"), (KUSTOMIZATION, "operator"))
        wait_for(lambda: rolled_to(7), 300, "the operator's pods rolled to the new values")
        assert objects.applied("operator", f"main@sha1:{sha}", timeout=300)["status"] == "True"
        history = objects.get(HELM_RELEASE, RELEASE)["status"].get("history") or []
        assert [h.get("version") for h in history][:2] == [2, 1], history  # one install, one upgrade
        queues.wait_condition("orders", "Ready", "True", timeout=120)
    finally:
        queues.force_delete_all(180)  # while the operator runs: its finalizer
        objects.delete(KUSTOMIZATION, "queues")
        objects.delete(KUSTOMIZATION, "operator")  # prunes the HelmRelease: helm-controller uninstalls
        wait_for(lambda: not objects.exists(HELM_RELEASE, RELEASE), 180, "the HelmRelease uninstalled")
        for kind, name in ((GIT_REPOSITORY, "platform"), (HELM_REPOSITORY, "dbq")):
            objects.delete(kind, name)
        for name in (operator_ns, queues_ns):
            core.delete_namespace(name)
