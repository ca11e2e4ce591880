"""The operator as users meet it: installed by `helm install` of charts/dbq-operator on the
single-node cluster (`dbq dev up cluster`), with the image stack/image.sh builds here imported into
the node's containerd. Its pod reaches the API server with its ServiceAccount's token and the
stack's PostgreSQL at the node's address; Queues become Ready through it.

Then the fleet-health Spark job runs on Spark on Kubernetes against those Queues: spark-submit in
cluster mode with the Spark image built here, the ServiceAccount and RBAC of manifests/spark/,
a driver pod and an executor pod, and its Parquet report in a volume read back here.

The chart's defaults are installed: two replicas that elect a leader on a Lease (15 s / 10 s /
2 s). The tests of this module run in order: install, replace the leader's pod, force-delete
frozen pods, a frozen leader, a leader killed while it provisions, upgrade, Spark, uninstall."""

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
from datetime import UTC, datetime
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
from dbq.devstack.postgres import OPERATOR_USER, PG_PORT
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
LEASE = f"{RELEASE}-dbq-operator"  # named after the release, in its namespace
LEASE_DURATION, RETRY_PERIOD = 15, 2  # the chart's defaults
TICK = "upkeep tick of queue"  # the operator's DEBUG line for each upkeep tick with work due


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
                  "--set", "operator.driftInterval=10", "--set", "operator.verbose=true", *values)  # fmt: skip
        print(f"helm {verb}: the operator's pods Ready in {time.monotonic() - began:.1f} s")

    def pods(self) -> list[Any]:
        core = client.CoreV1Api(self.kube.api)
        return list(core.list_namespaced_pod(self.namespace, label_selector=SELECTOR).items)

    def ready_pods(self, other_than: str = "") -> list[Any]:
        """The operator's two pods once both are Ready, none of them terminating (nor the pod
        whose uid is `other_than`)."""

        def ready() -> list[Any] | None:
            pods = [p for p in self.pods() if not p.metadata.deletion_timestamp]
            ok = [p for p in pods if p.metadata.uid != other_than and is_ready(p)]
            return ok if len(pods) == len(ok) == 2 else None

        found = wait_for(ready, 180, "the operator's two pods Ready")
        assert found is not None
        return found

    def holder(self) -> str | None:
        try:
            spec = client.CoordinationV1Api(self.kube.api).read_namespaced_lease(LEASE, self.namespace).spec
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return str(spec.holder_identity) if spec.holder_identity else None

    def leader(self, other_than: str = "") -> Any:
        """The Ready pod holding the Lease (and whose name is not `other_than`), once there is one.
        A terminating pod is not it: during a rollout the old leader still holds the Lease, and is
        still Ready, until it releases the Lease on SIGTERM."""

        def held() -> Any:
            name = self.holder()
            return next(
                (
                    p
                    for p in self.pods()
                    if p.metadata.name == name != other_than
                    and is_ready(p)
                    and not p.metadata.deletion_timestamp
                ),
                None,
            )

        return wait_for(held, 180, "a Ready operator pod holding the Lease")

    def log(self, pod: str, previous: bool = False) -> str:
        core = client.CoreV1Api(self.kube.api)
        return str(core.read_namespaced_pod_log(pod, self.namespace, previous=previous))

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


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def leads(pod: Any) -> float | None:
    """The pod's dbq_leader gauge; None when its metrics do not answer (it is gone)."""
    try:
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9090/metrics", timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return None
    return float(next(x for x in text.splitlines() if x.startswith("dbq_leader ")).split()[1])


class LeaseWatch:
    """Reads the Lease every 0.2 s from a thread: every change of holder, when it was seen, and
    the dbq_leader gauge of the holder it replaced, scraped right then (it must no longer act)."""

    def __init__(self, release: Release) -> None:
        self.release = release
        self.changes: list[tuple[float, str | None]] = []
        self.old_holder_leads: list[tuple[str, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self.changes.append((time.monotonic(), self.release.holder()))
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        pods = {p.metadata.name: p for p in self.release.pods()}
        last_holder = self.changes[-1][1]
        while True:
            stopping = self._stop.wait(0.2)  # and a last look once told to stop
            holder = self.release.holder()
            if holder != self.changes[-1][1]:
                self.changes.append((time.monotonic(), holder))
                pods.update({p.metadata.name: p for p in self.release.pods()})
                if holder and last_holder and holder != last_holder and last_holder in pods:
                    self.old_holder_leads.append((last_holder, leads(pods[last_holder])))
                last_holder = holder or last_holder
            if stopping:
                return

    def handovers(self) -> list[float]:
        """For each new holder: seconds from when the Lease left the one before (released, or
        taken from it) until the new one held it."""
        gaps, left_at, previous = [], None, self.changes[0][1]
        for at, holder in self.changes[1:]:
            if holder == previous:  # taken back by the same holder
                left_at = None
                continue
            left_at = at if left_at is None else left_at
            if holder is not None:
                gaps.append(at - left_at)
                left_at, previous = None, holder
        return gaps

    def taken_after(self, started: float, other_than: str) -> float:
        """Seconds from `started` until a holder other than `other_than` was seen."""
        return next(t for t, h in self.changes if t >= started and h not in (None, other_than)) - started


def ticks(log: str) -> list[str]:
    """The timestamps of the upkeep ticks a pod's log shows."""
    return [" ".join(line.split()[:2]) for line in log.splitlines() if TICK in line]


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
        "orders-db",
        {"url": postgres.url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}"), "ca": postgres.ca},
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
dsn = "DRIVER={{PostgreSQL Unicode}};SERVER={NODE_IP};PORT={PG_PORT};DATABASE={release.database.name};UID={OPERATOR_USER};PWD=" + open("/etc/db/password").read().strip()
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


def test_helm_install_runs_two_ready_replicas_one_leader_that_brings_a_queue_to_ready(release):
    release.install()
    pods = release.ready_pods()
    for pod in pods:
        container = pod.status.container_statuses[0]
        assert container.ready and container.image.endswith(IMAGE.split("/")[-1]), container
        assert pod.spec.service_account_name != "default"  # the chart's, whose RBAC is all it may use
    leader = release.leader()
    # One holder, and only it says so; the standby is Ready all the same.
    assert {p.metadata.name: leads(p) for p in pods} == {
        p.metadata.name: (1.0 if p.metadata.name == leader.metadata.name else 0.0) for p in pods
    }
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


def test_a_deleted_leader_hands_the_lease_over_and_the_new_leader_converges_without_duplicates(kube, release):
    """A plain `kubectl delete pod` of the leader: it stops its handlers and releases the Lease
    on SIGTERM, and the standby takes it within retryPeriod + 3 s."""
    schema = release.queues.get("orders")["spec"]["connection"]["schema"]
    before = release.database_objects(schema)
    old = release.leader()
    with LeaseWatch(release) as watch:
        deleted_at = time.monotonic()
        client.CoreV1Api(kube.api).delete_namespaced_pod(old.metadata.name, release.namespace)
        new = release.leader(other_than=old.metadata.name)
    handover = watch.taken_after(deleted_at, old.metadata.name)
    released = next((t - deleted_at for t, h in watch.changes if t >= deleted_at and h is None), None)
    print(f"graceful handover: the Lease changed hands {handover:.1f} s after the leader's pod was deleted"
          f" (released after {released if released is None else round(released, 1)} s)")  # fmt: skip
    assert handover < RETRY_PERIOD + 3, watch.changes
    assert all(value in (0.0, None) for _, value in watch.old_holder_leads), watch.old_holder_leads
    assert new.metadata.name != old.metadata.name
    # The new leader reconciles: a spec change made now is observed and applied.
    generation = release.queues.patch("orders", {"spec": {"timeouts": {"visibility": "45s"}}})["metadata"][
        "generation"
    ]
    wait_for(lambda: release.queues.get("orders").get("status", {}).get("observedGeneration") == generation
             and release.queues.condition("orders", "Ready").get("status") == "True", 120, "orders at its new spec")  # fmt: skip
    after = release.database_objects(schema)
    assert len(after) == len(set(after))
    assert {name for _, name in after} == {name for _, name in before}, (before, after)
    release.ready_pods()  # the Deployment's replacement stands by


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
        for _ in range(3):
            old = release.leader()
            os.kill(container_pid(cluster, old), signal.SIGSTOP)  # frozen, as a hung process looks
            core.delete_namespaced_pod(old.metadata.name, release.namespace, grace_period_seconds=0)
            assert all(p.status.phase == "Running" for p in release.ready_pods(other_than=old.metadata.uid))
        release.leader()  # the frozen leader's Lease waited out, and taken
        time.sleep(2)  # a kubelet that crashed late still shows
    finally:
        watching.clear()
        watcher.join()
    assert not not_ready, not_ready[:5]


def restarted(release: Release, pod: Any) -> Any:
    """The pod's container status once the kubelet restarted it (its last run ended)."""
    core, before = client.CoreV1Api(release.kube.api), pod.status.container_statuses[0].restart_count

    def ended() -> Any:
        found = core.read_namespaced_pod(pod.metadata.name, release.namespace).status.container_statuses[0]
        return found if found.restart_count > before and found.last_state.terminated else None

    return wait_for(ended, 120, f"{pod.metadata.name} restarted")


@pytest.fixture
def fleeting(release) -> Iterator[list[str]]:
    """Names of Queues a test creates: deleted after it, passed or failed (the tests after it
    count the release's Queues)."""
    names: list[str] = []
    yield names
    for name in names:
        release.queues.delete(name)
    wait_for(lambda: not set(names) & set(release.queues.names()), 180, f"{names} deleted")


def with_schema(name: str) -> dict[str, Any]:
    doc = queue(name, deletionPolicy="Delete")
    doc["spec"]["connection"]["schema"] = f"{name.replace('-', '_')}_{secrets.token_hex(3)}"
    return doc


def test_a_frozen_leader_is_waited_out_by_the_standby_and_exits_when_it_wakes(cluster, release, fleeting):
    """The leader's process frozen (SIGSTOP, as a hung node or process looks; before leader
    election a Queue then had no status for minutes): the standby holds the Lease within
    leaseDuration + retryPeriod + 2 s, and a Queue created a second after the freeze is Ready
    within 30 s of its creation. Woken (SIGCONT), the old leader finds its Lease lapsed and exits
    with code 1 before it acts: its last upkeep tick precedes the new leader's first."""
    old = release.leader()
    wait_for(lambda: ticks(release.log(old.metadata.name)), 60, "an upkeep tick of the leader")
    pid = container_pid(cluster, old)
    with LeaseWatch(release) as watch:
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            time.sleep(1)
            fleeting.append("after-freeze")
            release.queues.create(with_schema("after-freeze"))
            created_at = time.monotonic()
            new = release.leader(other_than=old.metadata.name)
            release.queues.wait_condition("after-freeze", "Ready", "True", timeout=30)
            ready_after = time.monotonic() - created_at
        finally:
            os.kill(pid, signal.SIGCONT)
    taken = watch.taken_after(frozen_at, old.metadata.name)
    print(f"frozen leader: the standby held the Lease {taken:.1f} s after the freeze; a Queue created 1 s"
          f" after it Ready {ready_after:.1f} s after its creation")  # fmt: skip
    assert taken < LEASE_DURATION + RETRY_PERIOD + 2, watch.changes
    assert all(value in (0.0, None) for _, value in watch.old_holder_leads), watch.old_holder_leads
    assert restarted(release, old).last_state.terminated.exit_code == 1
    old_log = release.log(old.metadata.name, previous=True)
    assert "lost the Lease" in old_log.splitlines()[-1], old_log[-2000:]
    new_ticks = wait_for(
        lambda: ticks(release.log(new.metadata.name)), 60, "an upkeep tick of the new leader"
    )
    assert max(ticks(old_log)) < min(new_ticks), (ticks(old_log)[-3:], new_ticks[:3])
    release.ready_pods()


def test_queues_created_as_the_leader_is_killed_are_each_provisioned_once(cluster, release, fleeting):
    """Twenty Queues created at once, and the leader's process killed on the node (SIGKILL)
    while it provisions them: the kubelet restarts its container, a holder acts again within
    leaseDuration + retryPeriod + 2 s, and every Queue is Ready, its objects made by one
    transaction and announced by one Event at most; the old leader's upkeep ticks all precede the
    new leader's first."""
    old = release.leader()
    wait_for(lambda: ticks(release.log(old.metadata.name)), 60, "an upkeep tick of the leader")
    docs = [with_schema(f"burst-{i:02d}") for i in range(20)]
    names = [doc["metadata"]["name"] for doc in docs]
    fleeting += names
    for doc in docs:
        release.queues.create(doc)

    def ready() -> int:
        return sum(release.queues.condition(n, "Ready").get("status") == "True" for n in names)

    # Killed as soon as it has seen the first Queue (it writes Ready=Unknown at first sight).
    wait_for(lambda: release.queues.condition(names[0], "Ready"), 60, "the leader at work on the Queues")
    leases = client.CoordinationV1Api(release.kube.api)

    def renewed_since(wall: datetime) -> bool:  # by a live process: the killed one renews no more
        spec = leases.read_namespaced_lease(LEASE, release.namespace).spec
        return bool(spec.holder_identity) and spec.renew_time > wall

    os.kill(container_pid(cluster, old), signal.SIGKILL)
    killed_at, killed_wall, ready_then = time.monotonic(), datetime.now(UTC), ready()
    wait_for(lambda: renewed_since(killed_wall), 60, "the Lease renewed after the kill")
    acting = time.monotonic() - killed_at
    new = release.leader()
    for name in names:
        release.queues.wait_condition(name, "Ready", "True", timeout=180)
    all_ready = time.monotonic() - killed_at
    print(f"leader killed with {ready_then} of 20 Queues Ready: the Lease renewed by {new.metadata.name}"
          f" ({'the restarted pod' if new.metadata.name == old.metadata.name else 'the standby'})"
          f" {acting:.1f} s after the kill, all 20 Ready after {all_ready:.1f} s")  # fmt: skip
    assert acting < LEASE_DURATION + RETRY_PERIOD + 2
    assert restarted(release, old).last_state.terminated.exit_code != 0
    with pyodbc.connect(release.database.odbc, autocommit=True) as db:
        for doc in docs:
            transactions = db.execute(
                "SELECT count(DISTINCT x) FROM (SELECT c.xmin::text AS x FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = ? UNION ALL SELECT p.xmin::text FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ?) made",
                doc["spec"]["connection"]["schema"], doc["spec"]["connection"]["schema"],
            ).fetchval()  # fmt: skip
            assert transactions == 1, (doc["metadata"]["name"], transactions)
    # Never announced twice. A leader killed after writing a queue's status and before posting
    # its Event (the same moment, seen from outside) leaves that one queue unannounced.
    announced = {
        name: [e for e in release.queues.events(name) if e.reason in ("Provisioned", "Ready")]
        for name in names
    }
    twice = {
        n: [(e.reason, e.message) for e in found]
        for n, found in announced.items()
        if sum(e.count or 1 for e in found) > 1
    }
    assert not twice, twice
    print(f"creation Events: one for {sum(1 for f in announced.values() if f)} Queues, none for"
          f" {[n for n, f in announced.items() if not f]}")  # fmt: skip
    old_ticks = ticks(release.log(old.metadata.name, previous=True))
    new_ticks = wait_for(
        lambda: ticks(release.log(new.metadata.name)), 60, "an upkeep tick of the new leader"
    )
    assert old_ticks and max(old_ticks) < min(new_ticks), (old_ticks[-3:], new_ticks[:3])
    release.ready_pods()


def test_helm_upgrade_with_a_changed_value_rolls_the_replicas_and_hands_the_lease_over(release):
    """Both pods are replaced one at a time (maxUnavailable 0), and each handover of the Lease
    takes at most retryPeriod + 3 s: the leader releases it on SIGTERM."""
    old = {p.metadata.uid for p in release.pods()}
    with LeaseWatch(release) as watch:
        release.install("upgrade", "--set", "operator.upkeepTick=7")
        pods = wait_for(lambda: (ps := release.ready_pods()) and not old & {p.metadata.uid for p in ps} and ps,
                        180, "two new pods Ready")  # fmt: skip
        leader = release.leader()
    for pod in pods:
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["DBQ_UPKEEP_TICK"] == "7"
    assert leader.metadata.uid not in old
    gaps = watch.handovers()
    print(
        f"helm upgrade: Lease holders {[h for _, h in watch.changes]}, handovers {[round(g, 1) for g in gaps]} s"
    )
    assert gaps and all(gap < RETRY_PERIOD + 3 for gap in gaps), watch.changes
    assert all(value in (0.0, None) for _, value in watch.old_holder_leads), watch.old_holder_leads
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
