"""A single-node cluster beside the stack's API server, so pods really run: containerd (Debian's),
the kubelet, kube-scheduler and kube-controller-manager (built from Go modules by
stack/build-kube.sh), a bridge network with host-local addresses on POD_SUBNET (the CNI plugins
from Debian), and a pause image built here, as no image registry is reachable. Pods use images
imported into containerd (`import_image`) with `imagePullPolicy: Never`.

Inside a container two settings are needed: containerd keeps a container's OOM score at or above
its own (`restrict_oom_score_adj`; lowering it is refused here), and the kubelet runs on cgroup v1
with cgroupfs, without QoS cgroups and with swap tolerated. No cluster DNS runs yet: pods resolve
names as the host does (the kubelet warns MissingClusterDNS).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from dbq.devstack.base import ManagedProcess, Paths, StackError, log_tail, wait_until
from dbq.devstack.kube import ADMIN_USER, KUBE_VERSION, Kube

NODE = "dbq-node"
POD_SUBNET = "10.244.0.0/24"
BRIDGE = "dbq0"
# The bridge's address: the pods' gateway and the node's address, where the kubelet serves (the
# API server reaches it there for logs and exec; a loopback node address is refused).
NODE_IP = "10.244.0.1"
BUILDAH_ENV = {"STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


class Cluster:
    name = "cluster"

    def __init__(self, paths: Paths, kube: Kube) -> None:
        self.paths = paths
        self.kube = kube
        self.dir = paths.state / "cluster"
        self.socket = self.dir / "containerd.sock"
        self.containerd = ManagedProcess("containerd", paths.state, marker=str(self.dir / "containerd.toml"))
        self.kubelet = ManagedProcess("kubelet", paths.state, marker=f"kubelet-{KUBE_VERSION}")
        self.scheduler = ManagedProcess(
            "kube-scheduler", paths.state, marker=f"kube-scheduler-{KUBE_VERSION}"
        )
        self.controller_manager = ManagedProcess(
            "kube-controller-manager", paths.state, marker=f"kube-controller-manager-{KUBE_VERSION}"
        )
        self.started_in = self.dir / "started-in"  # seconds the last start took

    @functools.cached_property
    def pause_image(self) -> str:
        """The pod sandbox's image, named by its binary's digest: a rebuilt pause is a new image."""
        digest = hashlib.sha256(self.kube.binary("pause").read_bytes()).hexdigest()[:12]
        return f"localhost/pause:{digest}"

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        began = time.monotonic()
        self.kube.start()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.containerd.pid() is None:
            self._write_containerd_config()
            self.containerd.start(["containerd", "--config", str(self.dir / "containerd.toml")])
        wait_until(
            lambda: self.socket.exists() and self.ctr("version", check=False).returncode == 0,
            timeout=60, what="containerd", log=self.containerd.log, alive=self.containerd.running,
        )  # fmt: skip
        if self.pause_image not in self.images():
            self._build_pause()
        admin = str(self.kube.kubeconfig)
        pki = self.kube.pki
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            for command in (["link", "add", BRIDGE, "type", "bridge"], ["addr", "add", f"{NODE_IP}/24", "dev", BRIDGE],
                            ["link", "set", BRIDGE, "up"]):  # fmt: skip
                subprocess.run(["ip", *command], capture_output=True, check=True)
        if self.kubelet.pid() is None:
            self._write_kubelet_config()
            self.kubelet.start([
                str(self.kube.binary("kubelet")), f"--config={self.dir / 'kubelet.yaml'}", f"--kubeconfig={admin}",
                f"--root-dir={self.dir / 'kubelet'}", f"--hostname-override={NODE}", f"--node-ip={NODE_IP}",
            ])  # fmt: skip
        if self.scheduler.pid() is None:
            self.scheduler.start([
                str(self.kube.binary("kube-scheduler")), f"--kubeconfig={admin}", f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}", "--leader-elect=false", "--bind-address=127.0.0.1",
                "--secure-port=10259",
            ])  # fmt: skip
        if self.controller_manager.pid() is None:
            self.controller_manager.start([
                str(self.kube.binary("kube-controller-manager")), f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}", f"--authorization-kubeconfig={admin}", "--leader-elect=false",
                "--bind-address=127.0.0.1", "--secure-port=10257", f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'apiserver.crt'}", "--use-service-account-credentials=false",
            ])  # fmt: skip
        for process in (self.scheduler, self.controller_manager):
            if not process.running():
                raise StackError(f"{process.name} exited during start-up:\n{log_tail(process.log)}")
        wait_until(self.node_ready, timeout=120, what=f"node {NODE} Ready", log=self.kubelet.log,
                   alive=self.kubelet.running)  # fmt: skip
        self.started_in.write_text(f"{time.monotonic() - began:.1f}")

    def stop(self) -> None:
        for process in (self.controller_manager, self.scheduler, self.kubelet):
            process.stop()
        if self.containerd.pid() is not None:
            # The pods' processes are containerd's tasks (run by its shims), not ours: ended
            # through it, so none outlives the cluster.
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
                self.ctr("tasks", "delete", "-f", task, check=False)
            for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("containers", "rm", container, check=False)
        self.containerd.stop()
        # What the kubelet and containerd mounted under the cluster's directory, innermost first.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{self.dir}/")), reverse=True):
            subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        _forget_masquerading()
        shutil.rmtree(self.dir / "cni-ipam", ignore_errors=True)  # addresses of pods that are gone
        if self.kube.ready():
            self._api("DELETE", f"/api/v1/nodes/{NODE}")  # a stopped node is not left NotReady

    def ready(self) -> bool:
        return self.kubelet.pid() is not None and self.kube.ready() and self.node_ready()

    def describe(self) -> str:
        took = self.started_in.read_text() if self.started_in.exists() else "?"
        return f"node {NODE} (pods on {POD_SUBNET}, containerd {self.socket}); started in {took}s"

    # --- images ----------------------------------------------------------------------
    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's own client, in the namespace the kubelet uses."""
        done = subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        if check and done.returncode != 0:
            raise StackError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def images(self) -> set[str]:
        return set(self.ctr("images", "ls", "-q").stdout.split())

    def import_image(self, image: str) -> None:
        """Copy `image` from buildah's store (stack/image.sh builds there) into containerd."""
        with tempfile.TemporaryDirectory(dir=self.dir) as work:
            archive = Path(work) / "image.tar"
            _buildah("push", "--quiet", image, f"oci-archive:{archive}:{image}")
            self.ctr("images", "import", str(archive))

    def _build_pause(self) -> None:
        container = _buildah("from", "scratch").strip()
        try:
            _buildah("copy", container, str(self.kube.binary("pause")), "/pause")
            _buildah("config", "--entrypoint", '["/pause"]', container)
            _buildah("commit", "--quiet", container, self.pause_image)
        finally:
            _buildah("rm", container)
        self.import_image(self.pause_image)

    # --- details ---------------------------------------------------------------------
    def node_ready(self) -> bool:
        try:
            node = self._api("GET", f"/api/v1/nodes/{NODE}")
        except OSError:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _api(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.kube.url}{path}", method=method,
            headers={"Authorization": f"Bearer {self.kube.token(ADMIN_USER)}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, context=self.kube.ssl_context(), timeout=10) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return {}
            raise

    def _write_containerd_config(self) -> None:
        cni = self.dir / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-dbq.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "dbq",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.dir / "cni-ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=1))  # fmt: skip
        (self.dir / "containerd.toml").write_text(f"""version = 2
root = "{self.dir / "containerd-root"}"
state = "{self.dir / "containerd-state"}"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.pause_image}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")

    def _write_kubelet_config(self) -> None:
        # Serves on the bridge only, to this machine and its pods, and trusts whoever reaches it
        # (the API server has no client certificate for it yet).
        (self.dir / "kubelet.yaml").write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}}
imageGCHighThresholdPercent: 100
containerRuntimeEndpoint: unix://{self.socket}
serializeImagePulls: false
""")


def _buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **BUILDAH_ENV})  # fmt: skip
    if done.returncode != 0:
        raise StackError(f"buildah {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _forget_masquerading() -> None:
    """Remove the NAT rules and chains the bridge plugin made for pods (its comment names the
    network): a pod ended through containerd, not the kubelet, never had them removed."""
    listed = subprocess.run(["iptables", "-t", "nat", "-S", "POSTROUTING"], capture_output=True, text=True)
    for rule in listed.stdout.splitlines():
        words = shlex.split(rule)
        if words[:2] != ["-A", "POSTROUTING"] or not any(w.startswith('name: "dbq"') for w in words):
            continue
        subprocess.run(["iptables", "-t", "nat", "-D", *words[1:]], capture_output=True, check=False)
        chain = words[words.index("-j") + 1] if "-j" in words else ""
        if chain.startswith("CNI-"):
            for flag in ("-F", "-X"):
                subprocess.run(["iptables", "-t", "nat", flag, chain], capture_output=True, check=False)
