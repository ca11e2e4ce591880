"""Spark on Kubernetes, as far as this machine goes without a kubelet: manifests/spark/ accepted by
the real API server (server-side dry run), its RBAC as narrow as it says, and `dbq-queues` read
through the in-cluster credential path with a service-account token the local API server issued."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.manifests import queue
from tests.operator_harness import ROOT

SPARK = ROOT / "manifests" / "spark"
SA = "system:serviceaccount:dbq-jobs:dbq-spark"


def kubectl(
    kube, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", kube.kubeconfig, *args], input=stdin, capture_output=True, text=True
    )
    assert not check or done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done


@pytest.fixture(scope="module")
def spark_rbac(kube):
    kubectl(kube, "apply", "-f", str(ROOT / "crds" / "queue.yaml"))
    kubectl(
        kube,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )
    kubectl(kube, "apply", "-f", str(SPARK / "rbac.yaml"))
    return kube


@pytest.mark.kube
def test_spark_manifests_are_accepted_by_the_api_server(spark_rbac):
    for path in sorted(SPARK.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        out = kubectl(spark_rbac, "apply", "--dry-run=server", "-f", str(path)).stdout
        assert out.count("(server dry run)") == len(docs), out


@pytest.mark.kube
@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "allowed"),
    [
        ("list", "queues.dbq.dev", "shop", True),
        ("get", "secrets/orders-db", "shop", True),
        ("get", "secrets/other-db", "shop", False),
        ("list", "secrets", "shop", False),
        ("create", "pods", "dbq-jobs", True),
        ("create", "pods", "shop", False),
        ("patch", "queues.dbq.dev", "shop", False),
    ],
)
def test_the_spark_service_account_has_only_what_the_job_needs(
    spark_rbac, verb, resource, namespace, allowed
):
    done = kubectl(spark_rbac, "auth", "can-i", verb, resource, "-n", namespace, "--as", SA, check=False)
    assert done.stdout.strip() == ("yes" if allowed else "no"), (
        verb,
        resource,
        namespace,
        done.stdout,
        done.stderr,
    )


@pytest.mark.kube
@pytest.mark.spark
def test_dbq_queues_reads_with_in_cluster_credentials(spark_rbac, stack, tmp_path: Path):
    """The reader as it runs in a pod: no kubeconfig, KUBERNETES_SERVICE_HOST/PORT set and the
    token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount (a tmpfs over /run in
    a private mount namespace of the child process only)."""
    kube = spark_rbac
    kubectl(
        kube,
        "apply",
        "-f",
        "-",
        stdin=json.dumps(queue("incluster-q") | {"metadata": {"name": "incluster-q", "namespace": "shop"}}),
    )
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(
        kubectl(kube, "create", "token", "dbq-spark", "-n", "dbq-jobs").stdout.strip()
    )
    config = yaml.safe_load(Path(kube.kubeconfig).read_text())
    (account / "ca.crt").write_text(
        Path(config["clusters"][0]["cluster"]["certificate-authority"]).read_text()
    )
    (account / "namespace").write_text("dbq-jobs")
    script = tmp_path / "read.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys
        from pyspark.sql import SparkSession
        from dbq.spark import register
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1").getOrCreate())
        register(spark)
        rows = spark.read.format("dbq-queues").option("namespace", "shop").load().collect()
        print(json.dumps(sorted(r["name"] for r in rows)))
        spark.stop()
    """)
    )
    host, port = stack.kube.url.removeprefix("https://").rsplit(":", 1)
    mounted = "/run/secrets/kubernetes.io/serviceaccount"
    shell = (
        f"mount -t tmpfs tmpfs /run && mkdir -p {mounted} && cp {account}/* {mounted}/"
        f" && exec env -u KUBECONFIG KUBERNETES_SERVICE_HOST={host} KUBERNETES_SERVICE_PORT={port}"
        f" PYSPARK_PYTHON={sys.executable} JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 {sys.executable} {script}"
    )
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "incluster-q" in json.loads(done.stdout.strip().splitlines()[-1])
    kubectl(kube, "delete", "queue", "incluster-q", "-n", "shop", "--wait=false")
