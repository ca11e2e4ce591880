"""The operator image: its size, and how long the operator inside it takes from the container's
start to a Queue Ready, against the same operator started from the development virtualenv in the
same run (the baseline: what the image itself adds).

Each round makes a new namespace with one Queue (ring on the local PostgreSQL), then starts the
operator: the image under runc as the chart's pod runs it (uid 10001, read-only root, no
capabilities, host network), or `dbq run` from the virtualenv.

    ~/.cache/dbq/venv/bin/python -m bench.image_startup --rounds 5   (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client

from dbq.devstack import Stack
from tests.local import KubeHandle, PgDatabase, kube_handle, scratch_database
from tests.manifests import queue
from tests.operator_harness import ROOT, Operator, free_port, operator_namespace
from tests.test_image import IMAGE, Container, buildah, standalone_kubeconfig


def one_round(kube: KubeHandle, postgres: PgDatabase, image: dict, in_image: bool) -> float:
    cluster = operator_namespace(kube, postgres, "dbq-bench-image")
    doc = queue("start-q", ring={"size": 64})
    doc["spec"]["connection"] = {
        "secretRef": {"name": "orders-db"},
        "schema": f"bench_{secrets.token_hex(3)}",
    }
    cluster.create(doc)
    work = Path(tempfile.mkdtemp(prefix="dbq-bench-image-"))
    if in_image:
        args = ["run", f"--namespace={cluster.ns}", f"--liveness=http://127.0.0.1:{free_port()}/healthz",
                f"--metrics-port={free_port()}"]  # fmt: skip
        kubeconfig = standalone_kubeconfig(Path(kube.operator_kubeconfig), work / "kubeconfig")
        runner: Container | Operator = Container(image, args, kubeconfig, work)
    else:
        runner = Operator(kube, cluster.ns, work / "operator.log")
    started = time.monotonic()
    runner.start()
    try:
        cluster.wait_condition("start-q", "Ready", "True", timeout=120)
        return time.monotonic() - started
    finally:
        cluster.force_delete_all(120)
        runner.stop()
        client.CoreV1Api(kube.api).delete_namespace(cluster.ns)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    stack = Stack()
    stack.up(("kube", "postgres"))
    built = subprocess.run(
        ["bash", str(ROOT / "stack" / "image.sh")], capture_output=True, text=True, check=True
    )
    size_line = built.stdout.strip().splitlines()[-1]
    image = json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"]
    kube = kube_handle(stack)
    times: dict[str, list[float]] = {"virtualenv (baseline)": [], "image under runc": []}
    with scratch_database(stack, "dbq_bench") as postgres:
        for _ in range(opts.rounds):  # alternate, so drift on the machine hits both alike
            times["virtualenv (baseline)"].append(one_round(kube, postgres, image, in_image=False))
            times["image under runc"].append(one_round(kube, postgres, image, in_image=True))
    print(f"image: {size_line}   (target: under 250 MB)")
    print(f"start of the operator to Queue Ready, {opts.rounds} rounds each:")
    for label, values in times.items():
        print(f"  {label:24s} p50 {statistics.median(values):5.2f} s   max {max(values):5.2f} s   "
              f"all {' '.join(f'{v:.2f}' for v in values)}")  # fmt: skip
    ratio = statistics.median(times["image under runc"]) / statistics.median(times["virtualenv (baseline)"])
    print(f"  image / baseline p50: {ratio:.2f}   (target: Ready within 10 s of start)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
