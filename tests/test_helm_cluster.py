"""The operator as users meet it: installed by `helm install` of charts/dbq-operator on the
single-node cluster (`dbq dev up cluster`), with the image stack/image.sh builds here imported into
the node's containerd. Its pod reaches the API server with its ServiceAccount's token and the
stack's PostgreSQL at the node's address; Queues become Ready through it.

Then the fleet-health Spark job runs on Spark on Kubernetes against those Queues: spark-submit in
cluster mode with the Spark image built here, the ServiceAccount and RBAC of manifests/spark/,
a driver pod and an executor pod, and its Parquet report in a volume read back here.

The tests of this module run in order: install, replace the pod, upgrade, Spark, uninstall."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyodbc
import pyspark
import pytest
from kubernetes import client

from dbq.devstack.base import Paths
from dbq.devstack.cluster import NODE_IP
from dbq.devstack.kube import ADMIN_USER
from dbq.devstack.postgres import PG_PORT
from tests.manifests import queue
from tests.operator_harness import (
    IMAGE,
    ROOT,
    Cluster,
    build_image,
    build_operator_image,
    new_namespace,
    wait_for,
)

HELM = Paths.from_env().cache / "bin" / "helm"
RELEASE = "dbq"
SELECTOR = "app.kubernetes.io/name=dbq-operator"


@dataclass
class Release:
    """The operator's release namespace and the namespace of the Queues it watches."""

    kube: Any
    namespace: str
    queues: Cluster
    database: Any

    def helm(self, *args: str) -> str:
        done = subprocess.run([str(HELM), "--kubeconfig", self.kube.kubeconfig, "--namespace", self.namespace, *args],
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def install(self, verb: str = "install", *values: str) -> None:
        """`helm install` (or `upgrade`) with the image built here; returns once the pod is Ready."""
        began = time.monotonic()
        self.helm(verb, RELEASE, str(ROOT / "charts" / "dbq-operator"), "--wait", "--timeout=5m",
                  "--set", "image.repository=" + IMAGE.split(":")[0], "--set", "image.tag=" + IMAGE.split(":")[1],
                  "--set", "image.pullPolicy=Never", "--set", f"watchNamespaces={{{self.queues.ns}}}",
                  "--set", "operator.driftInterval=10", *values)  # fmt: skip
        print(f"helm {verb}: the operator's pod Ready in {time.monotonic() - began:.1f} s")

    def pods(self) -> list[Any]:
        core = client.CoreV1Api(self.kube.api)
        return list(core.list_namespaced_pod(self.namespace, label_selector=SELECTOR).items)

    def ready_pod(self, other_than: str = "") -> Any:
        """The operator's one pod once it is Ready (and is not the pod `other_than`)."""

        def ready() -> Any:
            pods = [
                p for p in self.pods() if p.metadata.uid != other_than and not p.metadata.deletion_timestamp
            ]
            ok = [
                p
                for p in pods
                if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            ]
            return ok[0] if len(pods) == 1 and ok else None

        return wait_for(ready, 180, "the operator's pod Ready")

    def database_objects(self, schema: str) -> list[tuple[str, str]]:
        """Every table, sequence, index, type and routine in `schema`."""
        with pyodbc.connect(self.database.odbc, autocommit=True) as db:
            rows = db.execute(
                "SELECT c.relkind, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = ? UNION ALL SELECT 'f', p.proname FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ? ORDER BY 1, 2",
                schema, schema,
            ).fetchall()  # fmt: skip
        return [(kind, name) for kind, name in rows]


@pytest.fixture(scope="module")
def operator_image() -> dict[str, Any]:
    return build_operator_image()


@pytest.fixture(scope="module")
def release(cluster, kube, postgres, operator_image) -> Iterator[Release]:
    cluster.import_image(IMAGE)
    core = client.CoreV1Api(kube.api)
    suffix = secrets.token_hex(3)
    operator_ns, queues_ns = f"dbq-op-{suffix}", f"shop-{suffix}"
    for name in (operator_ns, queues_ns):
        new_namespace(kube.api, name)
    # A run stopped before its `helm uninstall` leaves the release's cluster-wide RBAC behind,
    # owned by a namespace gone since; helm would refuse to adopt it.
    subprocess.run(["kubectl", "--kubeconfig", kube.kubeconfig, "delete", "clusterrole,clusterrolebinding",
                    "-l", f"app.kubernetes.io/instance={RELEASE}"], check=True, capture_output=True)  # fmt: skip
    queues = Cluster(kube.api, queues_ns)
    # The database as the pod reaches it: PostgreSQL at the node's address.
    queues.secret(
        "orders-db", {"url": postgres.url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}")}
    )
    found = Release(kube, operator_ns, queues, postgres)
    yield found
    if RELEASE in found.helm("list", "--short"):
        found.queues.force_delete_all(120)
        found.helm("uninstall", RELEASE, "--wait")
    for name in (found.namespace, found.queues.ns):
        core.delete_namespace(name)


def test_a_pod_reaches_the_api_server_postgres_and_cluster_names_but_not_the_kubelet(cluster, kube, release):
    """The in-cluster paths the operator and Spark rely on, seen from inside a pod."""
    probe = f"""
import json, socket, ssl, urllib.request, urllib.error, pyodbc
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
out = {{"kubernetes": socket.gethostbyname("kubernetes.default.svc.cluster.local")}}
def status(url, context, headers={{}}):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context, timeout=10) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
token = {{"Authorization": "Bearer " + open(sa + "/token").read()}}
out["api"] = status("https://kubernetes.default.svc/api/v1/namespaces/{release.queues.ns}/secrets",
                    ssl.create_default_context(cafile=sa + "/ca.crt"), token)
out["kubelet"] = status("https://{NODE_IP}:10250/pods", ssl._create_unverified_context())[0]
dsn = "DRIVER={{PostgreSQL Unicode}};SERVER={NODE_IP};PORT={PG_PORT};DATABASE={release.database.name};UID=dbq;PWD=" + open("/etc/db/password").read().strip()
out["postgres"] = pyodbc.connect(dsn).execute("SELECT host(inet_client_addr())").fetchval()
print(json.dumps(out))
"""
    core = client.CoreV1Api(kube.api)
    password = release.database.odbc.split("PWD=")[1].split(";")[0]
    core.create_namespaced_secret(
        release.queues.ns, {"metadata": {"name": "probe-db"}, "stringData": {"password": password}}
    )
    core.create_namespaced_pod(release.queues.ns, {
        "metadata": {"name": "probe"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "probe", "image": IMAGE, "imagePullPolicy": "Never",
                                 "command": ["python3", "-c", probe],
                                 "volumeMounts": [{"name": "db", "mountPath": "/etc/db"}]}],
                 "volumes": [{"name": "db", "secret": {"secretName": "probe-db"}}]},
    })  # fmt: skip
    phase = wait_for(lambda: core.read_namespaced_pod("probe", release.queues.ns).status.phase in ("Succeeded", "Failed")
                     and core.read_namespaced_pod("probe", release.queues.ns).status.phase, 120, "the probe pod done")  # fmt: skip
    log = core.read_namespaced_pod_log("probe", release.queues.ns)
    assert phase == "Succeeded", log
    seen = json.loads(log.strip().splitlines()[-1])
    assert seen["kubernetes"] == "10.96.0.1"  # the `kubernetes` Service, by its cluster name
    code, refusal = seen["api"]
    # Authenticated as the pod's ServiceAccount (which may not read Secrets), over verified TLS.
    assert code == 403 and f"system:serviceaccount:{release.queues.ns}:default" in refusal, seen
    assert seen["kubelet"] == 401  # only the API server's client certificate is let in
    assert seen["postgres"] == "127.0.0.1"  # PostgreSQL on loopback, reached through the node
    core.delete_namespaced_pod("probe", release.queues.ns)


def test_helm_install_runs_the_operator_as_a_ready_pod_that_brings_a_queue_to_ready(release):
    release.install()
    pod = release.ready_pod()
    container = pod.status.container_statuses[0]
    assert container.ready and container.image.endswith(IMAGE.split("/")[-1]), container
    assert pod.spec.service_account_name != "default"  # the chart's, whose RBAC is all it may use
    schema = f"helm_{secrets.token_hex(3)}"
    doc = queue("orders", deletionPolicy="Delete")
    doc["spec"]["connection"]["schema"] = schema
    release.queues.create(doc)
    kept = queue("audit", deletionPolicy="Retain")
    kept["spec"]["connection"]["schema"] = schema + "_kept"
    release.queues.create(kept)
    for name in ("orders", "audit"):
        release.queues.wait_condition(name, "Ready", "True", timeout=120)
    assert {"r", "f"} <= {kind for kind, _ in release.database_objects(schema)}  # tables and routines
    # The node reaches the database at the address the Secret names for pods, as the CLI, a local
    # Spark job or a test on it would: `dbq push`/`dbq pop` from here, by the Queue resource.
    env = {**os.environ, "KUBECONFIG": release.kube.kubeconfig}
    dbq = [sys.executable, "-m", "dbq.cli"]
    pushed = subprocess.run([*dbq, "push", "orders", "-n", release.queues.ns, "from the node"],
                            env=env, capture_output=True, text=True)  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    popped = subprocess.run([*dbq, "pop", "orders", "-n", release.queues.ns, "--timeout", "5", "-o", "json"],
                            env=env, capture_output=True, text=True)  # fmt: skip
    assert popped.returncode == 0, popped.stderr
    assert [m["body"] for m in json.loads(popped.stdout)] == ["from the node"]


def test_a_deleted_operator_pod_is_replaced_and_the_replacement_converges_without_duplicates(kube, release):
    schema = release.queues.get("orders")["spec"]["connection"]["schema"]
    before = release.database_objects(schema)
    old = release.ready_pod()
    client.CoreV1Api(kube.api).delete_namespaced_pod(old.metadata.name, release.namespace)
    new = release.ready_pod(other_than=old.metadata.uid)
    assert new.metadata.name != old.metadata.name
    # The replacement reconciles: a spec change made now is observed and applied.
    generation = release.queues.patch("orders", {"spec": {"timeouts": {"visibility": "45s"}}})["metadata"][
        "generation"
    ]
    wait_for(lambda: release.queues.get("orders").get("status", {}).get("observedGeneration") == generation
             and release.queues.condition("orders", "Ready").get("status") == "True", 120, "orders at its new spec")  # fmt: skip
    after = release.database_objects(schema)
    assert len(after) == len(set(after))
    assert {name for _, name in after} == {name for _, name in before}, (before, after)


def container_pid(cluster: Any, pod: Any) -> int:
    """The host pid of the pod's first container, from containerd."""
    container = pod.status.container_statuses[0].container_id.split("://")[-1]
    for line in cluster.ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container:
            return int(pid)
    raise AssertionError(f"no containerd task for container {container}")


def test_force_deleted_operator_pods_are_replaced_while_the_node_stays_ready(kube, cluster, release):
    """`kubectl delete pod --force` three times over, each time of a pod whose process is frozen
    (SIGSTOP). The kubelet of Kubernetes 1.33, with
    in-place pod resize on (its default) and this node's cgroupsPerQOS false, crashed on it (a
    nil pointer in doPodResizeAction): the node went NotReady and the replacement never started."""
    core = client.CoreV1Api(kube.api)
    not_ready: list[str] = []
    watching = threading.Event()
    watching.set()

    def watch_node() -> None:
        while watching.is_set():
            for node in core.list_node().items:
                ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
                if ready is None or ready.status != "True":
                    not_ready.append(f"{node.metadata.name}: {ready and ready.reason}")
            time.sleep(0.5)

    watcher = threading.Thread(target=watch_node)
    watcher.start()
    try:
        old = release.ready_pod()
        for _ in range(3):
            os.kill(container_pid(cluster, old), signal.SIGSTOP)  # frozen, as a hung process looks
            core.delete_namespaced_pod(old.metadata.name, release.namespace, grace_period_seconds=0)
            new = release.ready_pod(other_than=old.metadata.uid)
            assert new.status.phase == "Running"
            old = new
        time.sleep(2)  # a kubelet that crashed late still shows
    finally:
        watching.clear()
        watcher.join()
    assert not not_ready, not_ready[:5]


def test_helm_upgrade_with_a_changed_value_rolls_the_operator(release):
    old = release.ready_pod()
    release.install("upgrade", "--set", "operator.upkeepTick=7")
    new = release.ready_pod(other_than=old.metadata.uid)
    env = {e.name: e.value for e in new.spec.containers[0].env}
    assert env["DBQ_UPKEEP_TICK"] == "7" and new.metadata.uid != old.metadata.uid
    release.queues.wait_condition("orders", "Ready", "True", timeout=120)


SPARK_IMAGE = IMAGE.replace("dbq-operator", "dbq-spark")
JOBS = "dbq-jobs"  # the Spark job's namespace in manifests/spark/rbac.yaml


def test_the_fleet_health_job_runs_on_spark_on_kubernetes_and_writes_its_report_to_a_volume(
    cluster, kube, release, tmp_path
):
    build_image("spark")
    cluster.import_image(SPARK_IMAGE)
    core = client.CoreV1Api(kube.api)
    kubectl = ["kubectl", "--kubeconfig", kube.kubeconfig]
    # manifests/spark/rbac.yaml as a user applies it, for the Queues' namespace in place of `shop`.
    rbac = (ROOT / "manifests" / "spark" / "rbac.yaml").read_text()
    rbac = rbac.replace("namespace: shop", f"namespace: {release.queues.ns}")
    subprocess.run([*kubectl, "apply", "-f", "-"], input=rbac, text=True, check=True, capture_output=True)
    wait_for(lambda: core.list_namespaced_service_account(JOBS).items, 30, f"the ServiceAccounts of {JOBS}")
    reports = tmp_path / "reports"
    reports.mkdir()
    reports.chmod(0o777)  # written by the pods' user, 10001
    token = tmp_path / "token"
    token.write_text(cluster.kube.token(ADMIN_USER))
    volume = "spark.kubernetes.{}.volumes.hostPath.reports.{}"
    confs = {
        "spark.kubernetes.namespace": JOBS,
        "spark.kubernetes.container.image": SPARK_IMAGE,
        "spark.kubernetes.container.image.pullPolicy": "Never",
        "spark.kubernetes.authenticate.driver.serviceAccountName": "dbq-spark",
        "spark.kubernetes.authenticate.submission.caCertFile": str(cluster.kube.pki / "apiserver.crt"),
        "spark.kubernetes.authenticate.submission.oauthTokenFile": str(token),
        "spark.executor.instances": "1",
        "spark.pyspark.python": "/opt/dbq/bin/python",  # the image's interpreter, for driver and executors
        # Two cores in all on this node, shared with the operator.
        "spark.kubernetes.driver.request.cores": "0.4", "spark.kubernetes.executor.request.cores": "0.4",
        "spark.driver.memory": "768m", "spark.executor.memory": "768m",
        "spark.kubernetes.executor.deleteOnTermination": "false",  # inspected below, then deleted
        **{volume.format(role, key): value for role in ("driver", "executor")
           for key, value in (("mount.path", "/reports"), ("options.path", str(reports)))},
    }  # fmt: skip
    submit = [str(Path(sys.executable).parent / "spark-submit"), f"--master=k8s://{cluster.kube.url}", "--deploy-mode=cluster",
              "--name=dbq-fleet-health", *(f"--conf={k}={v}" for k, v in confs.items()),
              "local:///opt/dbq/lib/python3.11/site-packages/dbq/spark/health.py",
              f"--namespace={release.queues.ns}", "--window=1h", "--output=/reports/dbq-health"]  # fmt: skip
    try:
        # spark-submit of the virtualenv's pyspark (SPARK_HOME), on this machine's Java 17.
        env = {
            **os.environ,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
            "PYSPARK_PYTHON": sys.executable,
        }
        began = time.monotonic()
        done = subprocess.run(submit, capture_output=True, text=True, timeout=900, env=env)
        print(f"spark-submit --deploy-mode cluster: the job ended in {time.monotonic() - began:.1f} s")
        pods = core.list_namespaced_pod(JOBS).items
        roles = {p.metadata.labels.get("spark-role"): p for p in pods}
        driver_log = (
            core.read_namespaced_pod_log(roles["driver"].metadata.name, JOBS) if "driver" in roles else ""
        )
        assert done.returncode == 0, f"spark-submit:\n{done.stderr[-3000:]}\ndriver:\n{driver_log[-5000:]}"
        assert roles["driver"].status.phase == "Succeeded", driver_log[-5000:]
        executor_log = core.read_namespaced_pod_log(roles["executor"].metadata.name, JOBS)
        assert "Finished task" in executor_log  # the work ran in the executor pod
    finally:  # in one call: deleting the driver pod also deletes its executor (owner reference)
        core.delete_collection_namespaced_pod(JOBS)
    report = pq.read_table(reports / "dbq-health").to_pylist()
    assert sorted(row["name"] for row in report) == ["audit", "orders"], report
    assert all(row["namespace"] == release.queues.ns and row["ready"] for row in report), report


def test_two_replicas_elect_one_leader_and_fail_over(kube, cluster, release):
    """`replicas=2` with leader election: one pod holds the Lease and alone reports dbq_leader 1;
    a plain `kubectl delete pod` of the leader hands the Lease over within retryPeriod + 3 s (it
    releases it on SIGTERM); after the leader's process is killed on the node (SIGKILL), a Queue
    created a second later is reconciled within 30 s, by the standby or by the killed container
    restarted under the same name."""
    release.install("upgrade", "--set", "replicas=2", "--set", "leaderElection.enabled=true",
                    "--set", "leaderElection.leaseDuration=6s", "--set", "leaderElection.renewDeadline=4s",
                    "--set", "leaderElection.retryPeriod=1s")  # fmt: skip
    leases, core = client.CoordinationV1Api(kube.api), client.CoreV1Api(kube.api)

    def holder() -> str | None:
        try:
            return leases.read_namespaced_lease(
                f"{RELEASE}-dbq-operator", release.namespace
            ).spec.holder_identity
        except client.ApiException:
            return None

    def ready() -> list[Any]:
        return [
            p for p in release.pods()
            if not p.metadata.deletion_timestamp
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]  # fmt: skip

    def leads(pod: Any) -> float:
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9090/metrics", timeout=5) as response:
            text = response.read().decode()
        return float(next(x for x in text.splitlines() if x.startswith("dbq_leader ")).split()[1])

    try:
        wait_for(lambda: len(ready()) == 2 and holder() in {p.metadata.name for p in ready()}, 180,
                 "two Ready replicas, one of them holding the Lease")  # fmt: skip
        leader = holder()
        assert {p.metadata.name: leads(p) for p in ready()} == {
            p.metadata.name: (1.0 if p.metadata.name == leader else 0.0) for p in ready()
        }
        deleted_at = time.monotonic()
        core.delete_namespaced_pod(leader, release.namespace)
        successor = wait_for(
            lambda: (h := holder()) not in (None, leader) and h, 30, "another replica holding the Lease"
        )
        handover = time.monotonic() - deleted_at
        print(
            f"graceful handover: the Lease changed hands {handover:.1f} s after the leader's pod was deleted"
        )
        assert handover < 1 + 3, handover
        release.queues.create(queue("after-handover"))
        release.queues.wait_condition("after-handover", "Ready", "True", timeout=30)
        # A crash: the leader's process killed on the node; its Lease is left to expire.
        wait_for(lambda: len(ready()) == 2, 120, "the Deployment's replacement standing by")
        victim = next(p for p in ready() if p.metadata.name == successor)
        os.kill(container_pid(cluster, victim), signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(1)
        release.queues.create(queue("after-crash"))
        created_at = time.monotonic()
        release.queues.wait_condition("after-crash", "Ready", "True", timeout=30)
        ready_after = time.monotonic() - created_at
        # The kubelet restarts the killed container in its pod, under the same name: either it
        # takes its own Lease back at once, or the standby waits the Lease out; one holder.
        restarts = {p.metadata.name: p.status.container_statuses[0].restart_count for p in release.pods()}
        now_holder = holder()
        print(f"crash failover: a Queue created 1 s after the leader was killed Ready {ready_after:.1f} s after"
              f" its creation; Lease held by {'the restarted pod' if now_holder == successor else 'the standby'}"
              f" {time.monotonic() - killed_at:.1f} s after the kill (restarts {restarts})")  # fmt: skip
        assert now_holder in restarts  # one of the release's pods (the restarted one may not be Ready yet)
        for name in ("after-handover", "after-crash"):
            release.queues.delete(name)
            wait_for(lambda name=name: not release.queues.exists(name), 60, f"{name} deleted by the leader")
    finally:
        release.install("upgrade")  # back to one replica for the tests after this one


def test_helm_uninstall_leaves_the_queues_and_a_reinstalled_operator_deletes_them_per_their_policy(
    kube, release
):
    orders = release.queues.get("orders")["spec"]["connection"]["schema"]
    audit = release.queues.get("audit")["spec"]["connection"]["schema"]
    release.helm("uninstall", RELEASE, "--wait")
    wait_for(lambda: not release.pods(), 120, "the operator's pod gone")
    # The CRD (from the chart's crds/) and the Queues stay, and so does what they made.
    assert sorted(release.queues.names()) == ["audit", "orders"]
    assert release.database_objects(orders) and release.database_objects(audit)
    release.queues.delete("orders")
    release.queues.delete("audit")
    assert release.queues.exists("orders")  # its finalizer waits for an operator
    release.install()
    wait_for(lambda: not release.queues.names(), 120, "queues deleted by the reinstalled operator")
    assert release.database_objects(orders) == []  # deletionPolicy: Delete
    assert release.database_objects(audit)  # deletionPolicy: Retain
