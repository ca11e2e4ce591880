"""Consumers that follow the backlog: QueueConsumers (KEDA 2.21 built here, the HPA of the local
single-node cluster) with each trigger, against one consumer that is always there.

Each round pushes N messages at once into an empty ring queue. The consumers are pods of dbq's
image running `dbq consume` as a receive-only QueueUser, 8 commands at a time, each command
`sleep 0.1` (work that waits, as most handlers do, rather than work that computes: two cores
bound what computes). Three ways to consume N, each on a queue of its own:

- postgresql: a Deployment at 0 replicas and a QueueConsumer with the product's defaults
  (pollingIntervalSeconds 10, HPA stabilization 300 s) except `--per-replica`, `--max-replicas`
  and a 30 s cooldown; KEDA's postgresql scaler reads the backlog;
- push: the same with `trigger: push`: the operator's push scaler reads it and wakes KEDA;
- fixed-1: a Deployment held at 1 replica, Running before the push.

For each: seconds from the push to the first consumer pod Running, to the first message taken,
to the queue drained (nothing waiting or leased), and back to 0 replicas. Before the rounds, a
minute with every queue empty measures what each trigger costs the database at rest: sessions,
and calls of the queue's stats routine a second (`track_functions`; the operator's own statistics
calls, the fixed queue's, are subtracted). The replicas, Running pods and depth are sampled every
second; the curve of each round is printed every 5 s (the docs' chart reads the saved results).

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
from tests.operator_harness import (
    IMAGE,
    Operator,
    build_operator_image,
    free_port,
    operator_namespace,
    wait_for,
)

SCHEMA = "bench_as"
MODES = ("postgresql", "push", "fixed-1")  # each consumes a queue and is a Deployment of its own name
SAMPLE_S, CURVE_EVERY_S, IDLE_S = 1.0, 5, 60


def queue_of(mode: str) -> str:
    return mode.replace("-", "_")


def deployment(mode: str, concurrency: int, handler_s: float) -> dict[str, Any]:
    labels = {"app": mode}
    command = ["dbq", "consume", queue_of(mode), "--schema", SCHEMA, "-c", str(concurrency), "--grace", "20",
               "--", "sleep", str(handler_s)]  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": mode},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "worker", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": command, "env": [{"name": "DBQ_URL", "valueFrom": {
                                         "secretKeyRef": {"name": "worker-db", "key": "url"}}}]}]}}},
    }  # fmt: skip


class Sampler:
    """Every second: the Deployment's replicas, its Running pods, the queue's depth and leases."""

    def __init__(self, kube: Any, namespace: str, mode: str, url: str) -> None:
        self.apps, self.core = client.AppsV1Api(kube.api), client.CoreV1Api(kube.api)
        self.namespace, self.mode, self.url = namespace, mode, url
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
        stats = f"SELECT o_depth, o_in_flight, o_acquired FROM {SCHEMA}.{queue_of(self.mode)}_stats()"
        with psycopg.connect(self.url, autocommit=True) as db:
            while not self._stop.is_set():
                t = time.monotonic() - self.start
                replicas = self.apps.read_namespaced_deployment(self.mode, self.namespace).spec.replicas or 0
                pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"app={self.mode}").items
                running = sum(
                    1 for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
                )
                depth, leased, taken = db.execute(stats).fetchone()  # type: ignore[misc]
                self.samples.append((t, replicas, running, depth, leased, taken))
                self._stop.wait(SAMPLE_S)

    def first(self, test: Any) -> float | None:
        return next((s[0] for s in self.samples if test(s)), None)


def push(url: str, queue_name: str, total: int) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        for start in range(0, total, 1000):
            bodies = [str(i).encode() for i in range(start, min(total, start + 1000))]
            db.execute(f"SELECT count(*) FROM {SCHEMA}.{queue_name}_send_batch(%s::bytea[])", (bodies,))


def one_round(kube: Any, ns: str, url: str, mode: str, total: int) -> dict[str, Any]:
    apps = client.AppsV1Api(kube.api)
    fixed = mode == "fixed-1"
    if fixed:  # the fixed consumer is up before the push
        apps.patch_namespaced_deployment_scale(mode, ns, {"spec": {"replicas": 1}})
        wait_for(lambda: (apps.read_namespaced_deployment(mode, ns).status.ready_replicas or 0) == 1, 120,
                 "the fixed consumer Ready")  # fmt: skip
    with Sampler(kube, ns, mode, url) as sampler:
        sampler.start = time.monotonic()
        push(url, queue_of(mode), total)
        empty = f"SELECT o_depth + o_in_flight FROM {SCHEMA}.{queue_of(mode)}_stats()"
        with psycopg.connect(url, autocommit=True) as db:
            wait_for(lambda: db.execute(empty).fetchone() == (0,), 3600, f"{total:,} drained", interval=0.5)
        drained = time.monotonic() - sampler.start
        if not fixed:
            wait_for(lambda: (apps.read_namespaced_deployment(mode, ns).spec.replicas or 0) == 0, 900,
                     "back to 0 replicas", interval=0.5)  # fmt: skip
        back = time.monotonic() - sampler.start
    if fixed:
        apps.patch_namespaced_deployment_scale(mode, ns, {"spec": {"replicas": 0}})
    samples = sampler.samples
    return {
        "drained": drained,
        "back": None if fixed else back,
        "first_running": sampler.first(lambda s: s[2] > 0),
        "first_taken": sampler.first(lambda s: s[5] > samples[0][5]),
        "most": max(s[1] for s in samples),
        "curve": [s for s in samples if s[0] <= drained + CURVE_EVERY_S],
    }


def curve_lines(label: str, curve: list[tuple[float, int, int, int, int, int]]) -> list[str]:
    picked = [next(s for s in curve if s[0] >= t) for t in range(0, int(curve[-1][0]) + 1, CURVE_EVERY_S)
              if any(s[0] >= t for s in curve)]  # fmt: skip
    return [f"  curve {label}, every {CURVE_EVERY_S} s: replicas " + " ".join(str(s[1]) for s in picked),
            f"  curve {label}, every {CURVE_EVERY_S} s: waiting " + " ".join(str(s[3]) for s in picked)]  # fmt: skip


def at_rest(admin_url: str, scaler_login: str) -> dict[str, tuple[float, int]]:
    """Per mode over IDLE_S with every queue empty: stats calls a second beyond the operator's
    own (the fixed queue's), and the sessions the trigger holds."""
    calls = ("SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = %s"
             " AND funcname IN ('postgresql_stats', 'push_stats', 'fixed_1_stats', 'push_wait')")  # fmt: skip
    sessions = {"postgresql": ("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (scaler_login,)),
                "push": ("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbq-push-scaler'", ()),
                "fixed-1": ("SELECT 0", ())}  # fmt: skip
    with psycopg.connect(admin_url, autocommit=True) as db:
        before = dict(db.execute(calls, (SCHEMA,)).fetchall())
        time.sleep(IDLE_S)
        db.execute("SELECT pg_stat_clear_snapshot()")
        after = dict(db.execute(calls, (SCHEMA,)).fetchall())
        rate = {f: (after.get(f, 0) - before.get(f, 0)) / IDLE_S for f in after}
        held = {mode: db.execute(q, p).fetchone()[0] for mode, (q, p) in sessions.items()}  # type: ignore[index]
    own = rate.get("fixed_1_stats", 0.0)
    out = {mode: (rate.get(f"{queue_of(mode)}_stats", 0.0) - own, held[mode]) for mode in MODES}
    out["push wait mark"] = (rate.get("push_wait", 0.0), 0)
    return out


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
        with psycopg.connect(postgres.admin_url, autocommit=True) as admin:  # counts routine calls
            admin.execute(f"ALTER DATABASE \"{postgres.name}\" SET track_functions = 'all'")
        namespaced = operator_namespace(kube, postgres, "bench-as")
        ns = namespaced.ns
        port = free_port()
        operator = Operator(kube, ns, stack.paths.state / "bench-autoscale-operator.log", drift_interval=10,
                            args=("--scaler-port", str(port)), env={"DBQ_SCALER_ADDRESS": f"127.0.0.1:{port}"})  # fmt: skip
        operator.start()
        try:
            for mode in MODES:
                namespaced.create(queue(mode, connection={"secretRef": {"name": "orders-db"}, "schema": SCHEMA},
                                        ring={"size": 32768}, timeouts={"visibility": "60s"}, deletionPolicy="Delete"))  # fmt: skip
            for mode in MODES:
                namespaced.wait_condition(mode, "Ready", "True", 120)
            users = namespaced.of("queueusers")
            users.create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser", "metadata": {"name": "worker"},
                          "spec": {"queues": [{"name": m, "rights": ["receive"]} for m in MODES]}})  # fmt: skip
            users.wait_condition("worker", "Ready", "True", 60)
            worker_url = base64.b64decode(Kube(kube.api).read_secret(ns, "dbq-user-worker")["url"]).decode()  # type: ignore[index]
            namespaced.secret(
                "worker-db", {"url": worker_url.replace(f"@127.0.0.1:{PG_PORT}", f"@{NODE_IP}:{PG_PORT}")}
            )
            for mode in MODES:
                subprocess.run(["kubectl", "--kubeconfig", kube.kubeconfig, "-n", ns, "apply", "-f", "-"],
                               input=json.dumps(deployment(mode, a.concurrency, a.handler_s)), text=True, check=True,
                               capture_output=True)  # fmt: skip
            consumers = namespaced.of("queueconsumers")
            for trigger in ("postgresql", "push"):
                consumers.create({
                    "apiVersion": "dbq.dev/v1alpha1", "kind": "QueueConsumer", "metadata": {"name": trigger},
                    "spec": {"queues": [trigger], "workload": {"name": trigger}, "trigger": trigger,
                             "messagesPerReplica": a.per_replica, "maxReplicas": a.max_replicas, "cooldownSeconds": 30}})  # fmt: skip
            for trigger in ("postgresql", "push"):
                consumers.wait_condition(trigger, "Ready", "True", 120)
            print(f"consumers: `dbq consume -c {a.concurrency} -- sleep {a.handler_s}` in pods of dbq's image;"
                  f" QueueConsumers: messagesPerReplica {a.per_replica}, maxReplicas {a.max_replicas}, polling every"
                  " 10 s, HPA stabilization 300 s, cooldown 30 s", flush=True)  # fmt: skip
            users.wait_condition("postgresql-scaler", "Ready", "True", 60)
            login = users.get("postgresql-scaler")["status"]["login"]
            time.sleep(15)  # KEDA's scalers settled
            for mode, (rate, held) in at_rest(postgres.admin_url, login).items():
                print(
                    f"  at rest, {mode:14s}: {rate:5.2f} calls a second beyond the operator's own, {held} sessions"
                )
            lines: list[str] = []
            for total in a.totals:
                rounds = {mode: one_round(kube, ns, postgres.url, mode, total) for mode in MODES}
                fixed = rounds["fixed-1"]
                for mode, r in rounds.items():
                    scaled = (
                        ""
                        if mode == "fixed-1"
                        else (
                            f"first pod Running {r['first_running']:5.1f} s, first message taken {r['first_taken']:5.1f} s, "
                        )
                    )
                    back = "" if r["back"] is None else f", back to 0 at {r['back']:6.1f} s"
                    print(f"{total:>7,} messages, {mode:10s}: {scaled}drained {r['drained']:6.1f} s, at most {r['most']}"
                          f" replicas{back}; fixed-1 / {mode} drain time {fixed['drained'] / r['drained']:.2f}x", flush=True)  # fmt: skip
                    lines += curve_lines(f"{mode} {total:,}", r["curve"])
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
