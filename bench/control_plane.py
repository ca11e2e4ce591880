"""Control-plane benchmark on the local stack (real API server, real PostgreSQL).

Prints: apply-to-Ready p50/p95 for one queue at a time and for N queues applied together,
the operator's RSS with N queues, and Kubernetes API writes per queue per minute at steady
state (the operator must not hot-loop). The baseline in the same run is an idle window before
any queue exists, so the API's own background writes are not counted against dbq.

    ~/.cache/dbq/venv/bin/python bench/control_plane.py --queues 200 --steady 90
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from dbq.devstack import Stack
from dbq.devstack.kube import ADMIN_USER

ROOT = Path(__file__).resolve().parent.parent
G, V, P = "dbq.dev", "v1alpha1", "queues"


def log_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def api_writes(stack: Stack) -> float:
    """Write requests the API server has served so far (all clients), from its /metrics."""
    request = urllib.request.Request(
        f"{stack.kube.url}/metrics", headers={"Authorization": f"Bearer {stack.kube.token(ADMIN_USER)}"}
    )
    with urllib.request.urlopen(request, context=stack.kube.ssl_context(), timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and re.search(r'verb="(POST|PUT|PATCH|DELETE)"', line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def queue(name: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}", "kind": "Queue", "metadata": {"name": name, "namespace": ns},
        "spec": {"backend": "postgres", "design": "ring", "ring": {"size": 64}, "deletionPolicy": "Delete",
                 "connection": {"secretRef": {"name": "bench-db"}, "schema": f"bench_{name.replace('-', '_')}"}},
    }  # fmt: skip


def ready_times(
    custom: client.CustomObjectsApi, ns: str, names: set[str], timeout: float
) -> dict[str, float]:
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(names) and time.monotonic() < deadline:
        for item in custom.list_namespaced_custom_object(G, V, ns, P)["items"]:
            name = item["metadata"]["name"]
            conds = (item.get("status") or {}).get("conditions") or []
            if (
                name in names
                and name not in seen
                and any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
            ):
                seen[name] = time.monotonic()
        time.sleep(0.05)
    if len(seen) < len(names):
        raise SystemExit(f"only {len(seen)} of {len(names)} queues became Ready within {timeout}s")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=200)
    ap.add_argument("--singles", type=int, default=10)
    ap.add_argument("--steady", type=float, default=90, help="seconds of steady state to count API writes")
    args = ap.parse_args()

    stack = Stack()
    stack.up(("kube", "postgres"))
    api = config.new_client_from_config(config_file=str(stack.kube.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    subprocess.run(["kubectl", "--kubeconfig", str(stack.kube.kubeconfig), "apply", "-f", str(ROOT / "crds/queue.yaml")],
                   check=True, capture_output=True)  # fmt: skip
    ns = f"bench-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_secret(
        ns,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="bench-db"), string_data={"url": stack.postgres.url()}
        ),
    )
    log = open(stack.paths.state / "bench-operator.log", "wb")  # noqa: SIM115
    env = {**os.environ, "KUBECONFIG": str(stack.kube.kubeconfig)}
    op = subprocess.Popen([sys.executable, "-m", "dbq.cli", "run", "-n", ns, "--metrics-port", "0", "--liveness", ""],
                          env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        time.sleep(3)
        base_start, t0 = api_writes(stack), time.monotonic()
        time.sleep(20)
        baseline = (api_writes(stack) - base_start) / (time.monotonic() - t0) * 60

        singles = []
        for i in range(args.singles):
            name = f"single-{i}"
            start = time.monotonic()
            custom.create_namespaced_custom_object(G, V, ns, P, queue(name, ns))
            singles.append(ready_times(custom, ns, {name}, 60)[name] - start)

        names = {f"q-{i:03d}" for i in range(args.queues)}
        created: dict[str, float] = {}
        for name in sorted(names):
            created[name] = time.monotonic()
            custom.create_namespaced_custom_object(G, V, ns, P, queue(name, ns))
        ready = ready_times(custom, ns, names, 600)
        many = [ready[n] - created[n] for n in names]
        rss = rss_mib(op.pid)

        time.sleep(5)
        w0, lines0, t0 = api_writes(stack), log_lines(log.name), time.monotonic()
        time.sleep(args.steady)
        minutes = (time.monotonic() - t0) / 60
        steady = (api_writes(stack) - w0) / minutes
        log_rate = (log_lines(log.name) - lines0) / minutes
        total_queues = args.queues + args.singles
        rss_after = rss_mib(op.pid)

        print(
            f"apply-to-Ready, one queue at a time (n={len(singles)}): p50 {pct(singles, 0.5):.3f}s  p95 {pct(singles, 0.95):.3f}s"
        )
        print(f"apply-to-Ready, {args.queues} queues at once:         p50 {pct(many, .5):.3f}s  p95 {pct(many, .95):.3f}s"
              f"  (all Ready after {max(ready.values()) - min(created.values()):.1f}s)")  # fmt: skip
        print(
            f"operator RSS with {total_queues} queues: {rss:.0f} MiB after apply, {rss_after:.0f} MiB after steady state"
        )
        print(f"API writes at steady state ({args.steady:.0f}s, drift timer every 60s): {steady:.1f}/min in all, "
              f"{(steady - baseline) / total_queues:.3f} per queue per minute (idle baseline {baseline:.1f}/min)")  # fmt: skip
        print(f"operator log lines at steady state: {log_rate:.1f}/min with {total_queues} idle queues")
        print(f"mean apply-to-Ready, one queue at a time: {statistics.mean(singles):.3f}s per single queue")
    finally:
        for item in custom.list_namespaced_custom_object(G, V, ns, P)["items"]:
            with contextlib.suppress(ApiException):
                custom.delete_namespaced_custom_object(G, V, ns, P, item["metadata"]["name"])
        deadline = time.monotonic() + 300
        while custom.list_namespaced_custom_object(G, V, ns, P)["items"] and time.monotonic() < deadline:
            time.sleep(1)
        op.send_signal(signal.SIGTERM)
        op.wait(timeout=30)


if __name__ == "__main__":
    main()
