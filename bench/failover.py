"""Failover of the operator on the local single-node cluster: two replicas installed by Helm with
leader election at the chart's timings (lease 15 s, renew deadline 10 s, retry period 2 s).

- graceful: a plain `kubectl delete pod` of the leader (it stops kopf and releases the Lease):
  seconds from the delete to another pod holding the Lease;
- crash: the leader's process SIGKILLed on the node (its pid from containerd): seconds from the
  kill to a live process renewing the Lease (the killed container restarted in its pod under the
  same name, or the standby once the Lease stood still for its duration);
- frozen: the leader's process stopped (SIGSTOP, as a hung node looks): seconds until the standby
  holds the Lease (it waits the Lease out); then SIGCONT, and the old leader exits.
Each round creates a Queue at the delete, kill or freeze and times it to Ready (the first
reconcile after the failover), and measures the gap in statistics writes across it: a Queue
sampled every 5 s runs throughout, and the gap is between its last sample before the failover
and its first after (read from the queue's history table). --rounds of each (at least 10 for the
figures to mean something); p50 and max.

    ~/.cache/dbq/venv/bin/python -m bench.failover --rounds 10
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyodbc
from kubernetes import client

from dbq.devstack import Stack
from dbq.devstack.cluster import NODE_IP
from dbq.devstack.postgres import PG_PORT
from tests.local import kube_handle, scratch_database
from tests.manifests import queue
from tests.operator_harness import Cluster, new_namespace, wait_for

ROOT = Path(__file__).resolve().parent.parent
RELEASE = "dbq"
LEASE = f"{RELEASE}-dbq-operator"


def version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return next(line.split('"')[1] for line in text.splitlines() if line.startswith("version = "))


class Replicas:
    def __init__(self, kube: Any, cluster: Any, namespace: str) -> None:
        self.kube, self.cluster, self.namespace = kube, cluster, namespace
        self.core = client.CoreV1Api(kube.api)
        self.leases = client.CoordinationV1Api(kube.api)

    def lease(self) -> client.V1LeaseSpec | None:
        try:
            return self.leases.read_namespaced_lease(LEASE, self.namespace).spec
        except client.ApiException:
            return None

    def ready(self) -> list[Any]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector="app.kubernetes.io/name=dbq-operator"
        )
        return [
            p for p in pods.items
            if not p.metadata.deletion_timestamp
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]  # fmt: skip

    def settled(self) -> str:
        """The leader's name, once two pods are Ready and one of them holds the Lease."""

        def check() -> str | None:
            spec, names = self.lease(), {p.metadata.name for p in self.ready()}
            return (
                spec.holder_identity if spec and len(names) == 2 and spec.holder_identity in names else None
            )

        return str(wait_for(check, 300, "two Ready replicas, one holding the Lease", interval=0.5))

    def pid(self, pod_name: str) -> int:
        pod = self.core.read_namespaced_pod(pod_name, self.namespace)
        container = pod.status.container_statuses[0].container_id.split("://")[-1]
        for line in self.cluster.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == container:
                return int(pid)
        raise RuntimeError(f"no containerd task for {pod_name}")


STEADY, STEADY_SCHEMA = "steady", f"failover_steady_{secrets.token_hex(3)}"  # sampled every 5 s


def samples_gap(db: Any, at: datetime) -> float | None:
    """Seconds between the steady queue's last statistics sample before `at` and its first after
    (None until there is one after)."""
    gap = db.execute(
        f"SELECT extract(epoch FROM (SELECT min(at) FROM {STEADY_SCHEMA}.dbq_stats_history WHERE at >= to_timestamp(?))"
        f" - (SELECT max(at) FROM {STEADY_SCHEMA}.dbq_stats_history WHERE at < to_timestamp(?)))",
        at.timestamp(), at.timestamp(),
    ).fetchval()  # fmt: skip
    return None if gap is None else float(gap)


def one_round(
    kind: str, replicas: Replicas, queues: Cluster, db: Any, index: int
) -> tuple[float, float, float]:
    leader = replicas.settled()
    pid = replicas.pid(leader)
    started, began = time.monotonic(), datetime.now(UTC)
    if kind == "graceful":
        replicas.core.delete_namespaced_pod(leader, replicas.namespace)
    else:
        os.kill(pid, signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
    name = f"{kind}-{index}"
    queues.create(queue(name))

    def handed_over() -> bool:
        spec = replicas.lease()
        if spec is None or spec.renew_time is None:
            return False
        if kind == "crash":
            return spec.holder_identity is not None and spec.renew_time > began
        return spec.holder_identity not in (None, leader)

    try:
        wait_for(handed_over, 120, f"the Lease held again after the {kind} round", interval=0.1)
    finally:
        if kind == "frozen":
            os.kill(pid, signal.SIGCONT)  # it finds its Lease lapsed and exits
    holder_s = time.monotonic() - started
    queues.wait_condition(name, "Ready", "True", timeout=120)
    ready_s = time.monotonic() - started
    queues.delete(name)
    gap = wait_for(lambda: samples_gap(db, began), 60, "a statistics sample after the failover")
    return holder_s, ready_s, float(gap)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args()
    stack = Stack()
    stack.up(("kube", "postgres", "cluster"))
    subprocess.run(["bash", str(ROOT / "stack" / "image.sh")], check=True, capture_output=True)
    image = f"localhost/dbq-operator:{version()}"
    cluster = stack.component("cluster")
    cluster.import_image(image)  # type: ignore[attr-defined]
    kube = kube_handle(stack)
    suffix = secrets.token_hex(3)
    operator_ns, queues_ns = f"dbq-failover-{suffix}", f"shop-failover-{suffix}"
    for name in (operator_ns, queues_ns):
        new_namespace(kube.api, name)
    helm = [
        str(stack.paths.cache / "bin" / "helm"),
        "--kubeconfig",
        kube.kubeconfig,
        "--namespace",
        operator_ns,
    ]
    queues = Cluster(kube.api, queues_ns)
    results: dict[str, list[tuple[float, float, float]]] = {"graceful": [], "crash": [], "frozen": []}
    with (
        scratch_database(stack, "dbq_failover") as postgres,
        pyodbc.connect(postgres.odbc, autocommit=True) as db,
    ):
        queues.secret(
            "orders-db", {"url": postgres.url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}")}
        )
        subprocess.run([*helm, "install", RELEASE, str(ROOT / "charts" / "dbq-operator"), "--wait", "--timeout=5m",
                        "--set", f"image.repository={image.split(':')[0]}", "--set", f"image.tag={version()}",
                        "--set", "image.pullPolicy=Never", "--set", f"watchNamespaces={{{queues_ns}}}"],
                       check=True, capture_output=True)  # fmt: skip
        steady = queue(STEADY, stats={"interval": "5s"})
        steady["spec"]["connection"]["schema"] = STEADY_SCHEMA
        queues.create(steady)
        queues.wait_condition(STEADY, "Ready", "True", timeout=120)
        try:
            for i in range(a.rounds):
                for kind in results:
                    results[kind].append(one_round(kind, Replicas(kube, cluster, operator_ns), queues, db, i))
                    holder_s, ready_s, gap_s = results[kind][-1]
                    print(f"  round {i + 1:2d} {kind:8s} Lease held again after {holder_s:5.1f} s, a Queue created"
                          f" then Ready after {ready_s:5.1f} s, statistics gap {gap_s:5.1f} s", flush=True)  # fmt: skip
            gaps = [float(row[0]) for row in db.execute(
                f"SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at)) FROM {STEADY_SCHEMA}.dbq_stats_history"
            ).fetchall() if row[0] is not None]  # fmt: skip
            queues.delete(STEADY)
            wait_for(lambda: not queues.names(), 120, "the rounds' Queues deleted")
        finally:
            subprocess.run([*helm, "uninstall", RELEASE, "--wait"], capture_output=True)
            for name in (operator_ns, queues_ns):
                client.CoreV1Api(kube.api).delete_namespace(name)
    print(f"two replicas, lease 15 s / renew deadline 10 s / retry period 2 s, {a.rounds} rounds of each;"
          f" statistics every 5 s, consecutive samples {statistics.median(gaps):.1f} s apart at p50 over the run:")  # fmt: skip
    for kind, rows in results.items():
        held, ready, gap = ([r[i] for r in rows] for i in range(3))
        print(f"  {kind:8s} Lease held again: p50 {statistics.median(held):5.1f} s, max {max(held):5.1f} s;"
              f" Queue Ready: p50 {statistics.median(ready):5.1f} s, max {max(ready):5.1f} s;"
              f" statistics gap: p50 {statistics.median(gap):5.1f} s, max {max(gap):5.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
