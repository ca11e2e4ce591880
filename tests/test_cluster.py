"""The single-node cluster (`dbq dev up cluster`): a real kubelet, scheduler and controller
manager beside the stack's API server run pods in containerd, on a bridge network."""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dbq.devstack.base import pid_alive
from dbq.devstack.cluster import BRIDGE, NODE, POD_SUBNET
from dbq.devstack.keeper import MIN_UPTIME_S
from tests.operator_harness import new_namespace, wait_for


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    core = client.CoreV1Api(kube.api)
    name = f"cluster-{secrets.token_hex(3)}"
    new_namespace(kube.api, name)
    yield name
    core.delete_namespace(name)


def pod(name: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never"}],
        },
    }


def test_a_pod_runs_on_the_node_gets_a_pod_address_and_its_log_is_read_through_the_api(
    cluster, kube, namespace
):
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_pod(namespace, pod("probe", cluster.pause_image))

    def running() -> Any:
        found = core.read_namespaced_pod("probe", namespace)
        return found if found.status.phase == "Running" else None

    found = wait_for(running, 120, "pod probe Running")
    assert found.spec.node_name == NODE
    assert ipaddress.ip_address(found.status.pod_ip) in ipaddress.ip_network(POD_SUBNET)
    log = wait_for(lambda: core.read_namespaced_pod_log("probe", namespace), 30, "the pod's log")
    assert "pause: holding the pod's namespaces" in log
    # Its containers, the sandbox's among them, by the labels the kubelet gives them.
    label = f'labels."io.kubernetes.pod.namespace"=={namespace}'
    ours = set(cluster.ctr("containers", "ls", "-q", label).stdout.split())
    assert ours, "no container of the pod found by its labels"
    core.delete_namespaced_pod("probe", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("probe", namespace)
        except client.ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, 60, "pod probe deleted")

    def running_tasks() -> list[str]:
        tasks = [line.split() for line in cluster.ctr("tasks", "ls").stdout.splitlines()[1:]]
        return [task[0] for task in tasks if task[0] in ours and "RUNNING" in task]

    # Its processes end: the API object can go a moment before containerd reports the tasks stopped.
    wait_for(lambda: not running_tasks(), 30, "the pod's tasks stopped")


def kept_process(keeper: int) -> int | None:
    """The pid of the process a keeper runs (its one child)."""
    children = Path(f"/proc/{keeper}/task/{keeper}/children").read_text().split()
    return int(children[0]) if children else None


def test_a_crashed_kubelet_is_started_again_and_the_node_and_its_pods_stay(cluster, kube, namespace):
    """The kubelet runs under a keeper: killed (as a panic ends it), it is started again, the
    node is Ready again, and a pod created after runs."""
    core = client.CoreV1Api(kube.api)
    keeper = cluster.kubelet.pid()
    assert keeper is not None and not cluster.kubelet.unkept()
    kubelet = kept_process(keeper)
    assert kubelet is not None
    # The keeper restarts a process that ran at least MIN_UPTIME_S (a sooner death failed to start).
    started = float(Path(f"/proc/{kubelet}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0]) - started / os.sysconf("SC_CLK_TCK")
    time.sleep(max(0.0, MIN_UPTIME_S + 1 - uptime))
    os.kill(kubelet, signal.SIGKILL)
    again = wait_for(lambda: (p := kept_process(keeper)) not in (None, kubelet) and p, 30, "a new kubelet")
    assert cluster.kubelet.pid() == keeper and pid_alive(again)
    wait_for(cluster.node_ready, 120, "the node Ready again")
    core.create_namespaced_pod(namespace, pod("after-crash", cluster.pause_image))
    wait_for(
        lambda: core.read_namespaced_pod("after-crash", namespace).status.phase == "Running",
        120,
        "a pod created after the crash Running",
    )
    assert "starting it again" in cluster.kubelet.log.read_text(errors="replace")


def test_stopping_it_leaves_no_process_mount_network_or_rule_and_it_starts_again(cluster, kube, namespace):
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_pod(namespace, pod("left-running", cluster.pause_image))
    wait_for(
        lambda: core.read_namespaced_pod("left-running", namespace).status.phase == "Running",
        120,
        "pod Running",
    )
    processes = [
        cluster.containerd,
        cluster.kubelet,
        cluster.scheduler,
        cluster.controller_manager,
        cluster.coredns,
    ]
    pids = [p.pid() for p in processes]
    pids += [kept_process(pid) for pid in pids if pid]  # and what their keepers run
    pod_network = [
        n for c in cluster.ctr("containers", "ls", "-q").stdout.split() for n in cluster.network_namespaces(c)
    ]
    assert pod_network  # the running pod's network namespace
    cluster.stop()  # with a pod still running: containerd's task for it is ended too
    assert all(p.pid() is None for p in processes) and not any(pid_alive(pid) for pid in pids if pid)
    assert not [line for line in Path("/proc/mounts").read_text().splitlines() if f" {cluster.dir}/" in line]
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    assert not any(Path(n).exists() for n in pod_network)
    for binary in ("iptables", "ip6tables"):
        for table in ("nat", "filter", "mangle"):
            rules = subprocess.run([binary, "-t", table, "-S"], capture_output=True, text=True).stdout
            assert 'name: \\"dbq\\"' not in rules and "KUBE-" not in rules and "DBQ-" not in rules, rules
    assert not cluster.node_ready()
    cluster.start()
    assert cluster.ready()
