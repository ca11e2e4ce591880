"""Consumers that follow the backlog: a QueueConsumer (KEDA 2.21 built here, the HPA of the local
single-node cluster) against one consumer that is always there.

Each round pushes N messages at once into an empty ring queue. The consumers are pods of dbq's
image running `dbq consume` as a receive-only QueueUser, 8 commands at a time, each command
`sleep 0.1` (work that waits, as most handlers do, rather than work that computes: two cores
bound what computes). Two ways to consume the same N:

- autoscaled: a Deployment at 0 replicas and a QueueConsumer with the product's defaults
  (pollingIntervalSeconds 10, HPA stabilization 300 s) except `--per-replica`, `--max-replicas`
  and a 30 s cooldown: seconds from the push to the first consumer pod Running, to the first
  message taken, to the queue drained (nothing waiting or leased), and back to 0 replicas;
- fixed-1: the same Deployment held at 1 replica, Running before the push: seconds to drained.

The replicas, Running pods and depth are sampled every second; the curve of each round is printed
every 5 s (the docs' chart reads it from the saved results).

    ~/.cache/dbq/venv/bin/python -m bench.autoscale --totals 2000 20000
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
from kubernetes import client

from dbq.devstack import Stack
from dbq.devstack.cluster import NODE_IP
from dbq.devstack.postgres import PG_PORT
from dbq.kube import Kube
from tests.local import kube_handle, scratch_database
from tests.manifests import queue
from tests.operator_harness import IMAGE, Operator, build_operator_image, operator_namespace, wait_for

SCHEMA, QUEUE = "bench_as", "work"
SAMPLE_S, CURVE_EVERY_S = 1.0, 5


def deployment(name: str, replicas: int, concurrency: int, handler_s: float) -> dict[str, Any]:
    labels = {"app": name}
    command = ["dbq", "consume", QUEUE, "--schema", SCHEMA, "-c", str(concurrency), "--grace", "20", "--",
               "sleep", str(handler_s)]  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "worker", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": command, "env": [{"name": "DBQ_URL", "valueFrom": {
                                         "secretKeyRef": {"name": "worker-db", "key": "url"}}}]}]}}},
    }  # fmt: skip


class Sampler:
    """Every second: the Deployment's replicas, its Running pods, the queue's depth and leases."""

    def __init__(self, kube: Any, namespace: str, name: str, url: str) -> None:
        self.apps, self.core = client.AppsV1Api(kube.api), client.CoreV1Api(kube.api)
        self.namespace, self.name, self.url = namespace, name, url
        self.samples: list[
            tuple[float, int, int, int, int, int]
        ] = []  # t, replicas, running, depth, leased, taken
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        stats = f"SELECT o_depth, o_in_flight, o_acquired FROM {SCHEMA}.{QUEUE}_stats()"
        with psycopg.connect(self.url, autocommit=True) as db:
            while not self._stop.is_set():
                t = time.monotonic() - self.start
                replicas = self.apps.read_namespaced_deployment(self.name, self.namespace).spec.replicas or 0
                pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"app={self.name}").items
                running = sum(
                    1 for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
                )
                depth, leased, taken = db.execute(stats).fetchone()  # type: ignore[misc]
                self.samples.append((t, replicas, running, depth, leased, taken))
                self._stop.wait(SAMPLE_S)

    def first(self, test: Any) -> float | None:
        return next((s[0] for s in self.samples if test(s)), None)


def push(url: str, total: int) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        for start in range(0, total, 1000):
            bodies = [str(i).encode() for i in range(start, min(total, start + 1000))]
            db.execute(f"SELECT count(*) FROM {SCHEMA}.{QUEUE}_send_batch(%s::bytea[])", (bodies,))


def one_round(kube: Any, ns: str, url: str, name: str, total: int, autoscaled: bool) -> dict[str, Any]:
    apps = client.AppsV1Api(kube.api)
    if not autoscaled:  # the fixed consumer is up before the push
        apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 1}})
        wait_for(lambda: (apps.read_namespaced_deployment(name, ns).status.ready_replicas or 0) == 1, 120,
                 "the fixed consumer Ready")  # fmt: skip
    with Sampler(kube, ns, name, url) as sampler:
        sampler.start = time.monotonic()
        push(url, total)
        empty = f"SELECT o_depth + o_in_flight FROM {SCHEMA}.{QUEUE}_stats()"
        with psycopg.connect(url, autocommit=True) as db:
            wait_for(lambda: db.execute(empty).fetchone() == (0,), 3600, f"{total:,} drained", interval=0.5)
        drained = time.monotonic() - sampler.start
        if autoscaled:
            wait_for(lambda: (apps.read_namespaced_deployment(name, ns).spec.replicas or 0) == 0, 900,
                     "back to 0 replicas", interval=0.5)  # fmt: skip
        back = time.monotonic() - sampler.start
    if not autoscaled:
        apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 0}})
    samples = sampler.samples
    return {
        "drained": drained,
        "back": back if autoscaled else None,
        "first_running": sampler.first(lambda s: s[2] > 0),
        "first_taken": sampler.first(lambda s: s[5] > samples[0][5]),
        "most": max(s[1] for s in samples),
        "curve": [s for s in samples if s[0] <= drained + CURVE_EVERY_S],
    }


def curve_lines(label: str, curve: list[tuple[float, int, int, int, int, int]]) -> list[str]:
    picked = [next(s for s in curve if s[0] >= t) for t in range(0, int(curve[-1][0]) + 1, CURVE_EVERY_S)
              if any(s[0] >= t for s in curve)]  # fmt: skip
    return [f"  curve {label}, every {CURVE_EVERY_S} s: replicas " + " ".join(str(s[1]) for s in picked),
            f"  curve {label}, every {CURVE_EVERY_S} s: running " + " ".join(str(s[2]) for s in picked),
            f"  curve {label}, every {CURVE_EVERY_S} s: waiting " + " ".join(str(s[3]) for s in picked)]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--totals", type=int, nargs="+", default=[2000, 20000])
    p.add_argument("--per-replica", type=int, default=500, help="messagesPerReplica")
    p.add_argument("--max-replicas", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=8, help="commands each consumer runs at once")
    p.add_argument("--handler-s", type=float, default=0.1, help="seconds each command takes")
    a = p.parse_args()
    stack = Stack()
    stack.up(("kube", "postgres", "cluster", "keda"))
    build_operator_image()
    cluster = stack.component("cluster")
    cluster.import_image(IMAGE)  # type: ignore[attr-defined]
    kube = kube_handle(stack)
    with scratch_database(stack, "dbq_autoscale") as postgres:
        namespaced = operator_namespace(kube, postgres, "bench-as")
        ns = namespaced.ns
        operator = Operator(kube, ns, stack.paths.state / "bench-autoscale-operator.log", drift_interval=10)
        operator.start()
        try:
            namespaced.create(queue(QUEUE, connection={"secretRef": {"name": "orders-db"}, "schema": SCHEMA},
                                    ring={"size": 32768}, timeouts={"visibility": "60s"}, deletionPolicy="Delete"))  # fmt: skip
            namespaced.wait_condition(QUEUE, "Ready", "True", 120)
            users = namespaced.of("queueusers")
            users.create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser", "metadata": {"name": "worker"},
                          "spec": {"queues": [{"name": QUEUE, "rights": ["receive"]}]}})  # fmt: skip
            users.wait_condition("worker", "Ready", "True", 60)
            worker_url = base64.b64decode(Kube(kube.api).read_secret(ns, "dbq-user-worker")["url"]).decode()  # type: ignore[index]
            namespaced.secret(
                "worker-db", {"url": worker_url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}")}
            )
            for name in ("autoscaled", "fixed"):
                body = deployment(name, 0, a.concurrency, a.handler_s)
                subprocess.run(["kubectl", "--kubeconfig", kube.kubeconfig, "-n", ns, "apply", "-f", "-"],
                               input=json.dumps(body), text=True, check=True, capture_output=True)  # fmt: skip
            namespaced.of("queueconsumers").create({
                "apiVersion": "dbq.dev/v1alpha1", "kind": "QueueConsumer", "metadata": {"name": "autoscaled"},
                "spec": {"queues": [QUEUE], "workload": {"name": "autoscaled"}, "messagesPerReplica": a.per_replica,
                         "maxReplicas": a.max_replicas, "cooldownSeconds": 30}})  # fmt: skip
            namespaced.of("queueconsumers").wait_condition("autoscaled", "Ready", "True", 120)
            print(f"consumers: `dbq consume -c {a.concurrency} -- sleep {a.handler_s}` in pods of dbq's image;"
                  f" QueueConsumer messagesPerReplica {a.per_replica}, maxReplicas {a.max_replicas}, polling every"
                  " 10 s, HPA stabilization 300 s, cooldown 30 s", flush=True)  # fmt: skip
            lines: list[str] = []
            for total in a.totals:
                auto = one_round(kube, ns, postgres.url, "autoscaled", total, True)
                fixed = one_round(kube, ns, postgres.url, "fixed", total, False)
                print(f"{total:>7,} messages: autoscaled: first pod Running {auto['first_running']:5.1f} s, first"
                      f" message taken {auto['first_taken']:5.1f} s, drained {auto['drained']:6.1f} s, at most"
                      f" {auto['most']} replicas, back to 0 at {auto['back']:6.1f} s; fixed-1: drained"
                      f" {fixed['drained']:6.1f} s; fixed-1 / autoscaled drain time"
                      f" {fixed['drained'] / auto['drained']:.2f}x", flush=True)  # fmt: skip
                lines += curve_lines(f"autoscaled {total:,}", auto["curve"])
                lines += curve_lines(f"fixed-1 {total:,}", fixed["curve"])
            print("\n".join(lines))
        finally:
            namespaced.of("queueconsumers").force_delete_all(120)
            namespaced.of("queueusers").force_delete_all(120)
            namespaced.force_delete_all(180)
            operator.stop()
            client.CoreV1Api(kube.api).delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
