"""The operator image, built here from the Dockerfile by stack/image.sh, run by runc the way the
chart's pod runs it: uid 10001, read-only root filesystem, every capability dropped, no privilege
escalation, a tmpfs on /tmp. On the host's network it reconciles a Queue to Ready against the
local API server and PostgreSQL, and its liveness and metrics endpoints answer."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests import queue
from tests.operator_harness import (
    IMAGE,
    Cluster,
    build_operator_image,
    buildah,
    free_port,
    operator_namespace,
)


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    return build_operator_image()


def standalone_kubeconfig(path: Path, out: Path) -> Path:
    """The kubeconfig with its CA inlined, readable by the container's user."""
    config = yaml.safe_load(path.read_text())
    for cluster in config["clusters"]:
        ca = cluster["cluster"].pop("certificate-authority")
        cluster["cluster"]["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    out.write_text(yaml.safe_dump(config))
    out.chmod(0o644)
    return out


def bundle_config(rootfs: str, image: dict[str, Any], args: list[str], kubeconfig: Path) -> dict[str, Any]:
    """An OCI runtime config with the restricted pod's settings and the host's network."""
    tmpfs = {"type": "tmpfs", "source": "tmpfs"}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 10001, "gid": 10001},
            "args": image["Entrypoint"] + args,
            "env": [*image["Env"], "KUBECONFIG=/etc/dbq/kubeconfig"],
            "cwd": "/",
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": "dbq-operator",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", **tmpfs, "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/shm", **tmpfs, "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", **tmpfs, "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/etc/dbq/kubeconfig", "type": "bind", "source": str(kubeconfig), "options": ["rbind", "ro"]},
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],  # no network namespace
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }  # fmt: skip


class Container:
    """One runc container from the image, started and stopped by this test only."""

    def __init__(self, image: dict[str, Any], args: list[str], kubeconfig: Path, work: Path) -> None:
        self.id = f"dbq-image-test-{secrets.token_hex(3)}"
        self.work = work
        self.ctr = buildah("from", "--pull=false", IMAGE)
        rootfs = buildah("mount", self.ctr)
        (work / "config.json").write_text(json.dumps(bundle_config(rootfs, image, args, kubeconfig)))
        self.log = work / "container.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(["runc", "run", "--bundle", str(self.work), self.id],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def init_pid(self) -> int:
        state = subprocess.run(["runc", "state", self.id], capture_output=True, text=True, check=True).stdout
        return int(json.loads(state)["pid"])

    def stop(self) -> None:
        subprocess.run(["runc", "kill", self.id, "TERM"], capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                subprocess.run(["runc", "kill", self.id, "KILL"], capture_output=True)
                self.proc.wait(timeout=20)
        subprocess.run(["runc", "delete", "--force", self.id], capture_output=True)
        buildah("umount", self.ctr)
        buildah("rm", self.ctr)


@pytest.fixture
def container_env(
    kube, postgres, image, tmp_path
) -> Iterator[tuple[Cluster, Container, dict[str, int], str]]:
    cluster = operator_namespace(kube, postgres, "dbq-image")
    ns = cluster.ns
    ports = {"health": free_port(), "metrics": free_port()}
    args = ["run", f"--namespace={ns}", f"--liveness=http://127.0.0.1:{ports['health']}/healthz",
            f"--metrics-port={ports['metrics']}"]  # fmt: skip
    kubeconfig = standalone_kubeconfig(Path(kube.operator_kubeconfig), tmp_path / "kubeconfig")
    container = Container(image, args, kubeconfig, tmp_path)
    yield cluster, container, ports, ns
    try:
        cluster.force_delete_all(60)
    finally:
        container.stop()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.kube
@pytest.mark.postgres
def test_the_image_runs_restricted_and_brings_a_queue_to_ready(container_env):
    cluster, container, ports, _ = container_env
    doc = queue("image-q", ring={"size": 64})
    doc["spec"]["connection"] = {"secretRef": {"name": "orders-db"}, "schema": f"img_{secrets.token_hex(3)}"}
    cluster.create(doc)
    started = time.monotonic()
    container.start()
    cluster.wait_condition("image-q", "Ready", "True", timeout=60)
    ready_after = time.monotonic() - started
    print(f"operator image: Queue Ready {ready_after:.1f} s after the container started")
    status = Path(f"/proc/{container.init_pid()}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split()[:2] == ["10001", "10001"] and fields["CapEff"].strip() == "0" * 16
    assert fields["NoNewPrivs"].strip() == "1"
    assert get(f"http://127.0.0.1:{ports['health']}/healthz")
    metrics = get(f"http://127.0.0.1:{ports['metrics']}/metrics")
    assert 'dbq_queue_ready{namespace="' in metrics and "dbq_reconciles_total" in metrics
    log = container.log.read_text(errors="replace")
    assert "Read-only file system" not in log and "Traceback" not in log, log[-3000:]
