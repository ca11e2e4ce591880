"""A single-node cluster beside the stack's API server, so pods really run: containerd (Debian's),
the kubelet, kube-scheduler and kube-controller-manager (built from Go modules by
stack/build-kube.sh), a bridge network with host-local addresses on POD_SUBNET (the CNI plugins
from Debian), CoreDNS for in-cluster names, and a pause image built here, as no image registry is
reachable. Pods use images imported into containerd (`import_image`) with `imagePullPolicy: Never`.

Pods reach the stack's services, which listen on loopback only, through NAT rules on the bridge:
the API server as the `kubernetes` Service (KUBERNETES_SERVICE_IP:443, as in-cluster clients
expect) and PostgreSQL at NODE_IP:PG_PORT; they arrive from 127.0.0.1. No kube-proxy runs: other
ClusterIP Services are not routed, while headless Services resolve to pod addresses in CoreDNS.

Inside a container two settings are needed: containerd keeps a container's OOM score at or above
its own (`restrict_oom_score_adj`; lowering it is refused here), and the kubelet runs on cgroup v1
with cgroupfs, without QoS cgroups and with swap tolerated.
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

from dbq.devstack.base import NODE_IP, ManagedProcess, Paths, StackError, log_tail, wait_until
from dbq.devstack.kube import ADMIN_USER, APISERVER_PORT, KUBE_VERSION, KUBERNETES_SERVICE_IP, Kube
from dbq.devstack.postgres import PG_PORT

NODE = "dbq-node"
POD_SUBNET = "10.244.0.0/24"
BRIDGE = "dbq0"
CLUSTER_DOMAIN = "cluster.local"
COREDNS_READY_PORT = 18181  # CoreDNS's `ready` endpoint, on loopback
# (address, port) a pod dials -> the loopback port it reaches.
HOST_SERVICES = {(KUBERNETES_SERVICE_IP, 443): APISERVER_PORT, (NODE_IP, PG_PORT): PG_PORT}
# Our NAT chains: pods' connections to HOST_SERVICES are sent to loopback, and arrive from there.
TO_LOOPBACK, FROM_LOOPBACK = "DBQ-TO-LOOPBACK", "DBQ-FROM-LOOPBACK"
# The chains the kubelet makes for itself (in iptables and ip6tables), removed when it stops.
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
BUILDAH_ENV = {"STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


class Cluster:
    name = "cluster"

    def __init__(self, paths: Paths, kube: Kube) -> None:
        self.paths = paths
        self.kube = kube
        self.dir = paths.state / "cluster"
        self.socket = self.dir / "containerd.sock"
        # Each under a keeper, which starts it again if it crashes: the node stays up.
        self.containerd = ManagedProcess(
            "containerd", paths.state, marker=str(self.dir / "containerd.toml"), kept=True
        )
        self.kubelet = ManagedProcess("kubelet", paths.state, marker=f"kubelet-{KUBE_VERSION}", kept=True)
        self.scheduler = ManagedProcess(
            "kube-scheduler", paths.state, marker=f"kube-scheduler-{KUBE_VERSION}", kept=True
        )
        self.controller_manager = ManagedProcess(
            "kube-controller-manager",
            paths.state,
            marker=f"kube-controller-manager-{KUBE_VERSION}",
            kept=True,
        )
        self.coredns = ManagedProcess("coredns", paths.state, marker=str(self.dir / "Corefile"), kept=True)
        self.started_in = self.dir / "started-in"  # seconds the last start took

    @functools.cached_property
    def pause_image(self) -> str:
        """The pod sandbox's image, named by its binary's digest: a rebuilt pause is a new image."""
        digest = hashlib.sha256(self.kube.binary("pause").read_bytes()).hexdigest()[:12]
        return f"localhost/pause:{digest}"

    def processes(self) -> list[ManagedProcess]:
        return [self.containerd, self.kubelet, self.scheduler, self.controller_manager, self.coredns]

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        began = time.monotonic()
        self.kube.start()
        if not self.kube.started_with("--kubelet-client-certificate"):
            raise StackError("the API server was started by an older dbq without a kubelet client certificate: "
                             "restart it with `dbq dev down kube` and `dbq dev up cluster`")  # fmt: skip
        if any(p.unkept() for p in self.processes()):  # started by an older dbq: again, under keepers
            self.stop()
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
        self._start_network()
        admin = str(self.kube.kubeconfig)
        pki = self.kube.pki
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

    def _start_network(self) -> None:
        """The bridge pods attach to, the NAT rules to the stack's services, and CoreDNS on the bridge."""
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            for command in (["link", "add", BRIDGE, "type", "bridge"], ["addr", "add", f"{NODE_IP}/24", "dev", BRIDGE],
                            ["link", "set", BRIDGE, "up"]):  # fmt: skip
                subprocess.run(["ip", *command], capture_output=True, check=True)
        _route_to_loopback()
        if self.coredns.pid() is None:
            coredns = self.paths.cache / "bin" / "coredns"
            if not coredns.exists():
                raise StackError(f"{coredns} is missing: run `bash stack/bootstrap.sh` to build it")
            self._write_corefile()
            self.coredns.start([str(coredns), "-conf", str(self.dir / "Corefile")])
        wait_until(
            self._coredns_ready, timeout=60, what="CoreDNS", log=self.coredns.log, alive=self.coredns.running
        )

    def stop(self) -> None:
        for process in (self.controller_manager, self.scheduler, self.kubelet, self.coredns):
            process.stop()
        namespaces = []
        if self.containerd.pid() is not None:
            # The pods' processes are containerd's tasks (run by its shims), not ours: ended
            # through it, so none outlives the cluster.
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
                self.ctr("tasks", "delete", "-f", task, check=False)
            for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                namespaces += self.network_namespaces(container)
                self.ctr("containers", "rm", container, check=False)
        self.containerd.stop()
        for namespace in namespaces:  # the pods' network namespaces, and with them their interfaces
            subprocess.run(["umount", namespace], capture_output=True, check=False)
            Path(namespace).unlink(missing_ok=True)
        # What the kubelet and containerd mounted under the cluster's directory, innermost first.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{self.dir}/")), reverse=True):
            subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        _forget_rules()
        shutil.rmtree(self.dir / "cni-ipam", ignore_errors=True)  # addresses of pods that are gone
        if self.kube.ready():
            self._api("DELETE", f"/api/v1/nodes/{NODE}")  # a stopped node is not left NotReady

    def ready(self) -> bool:
        up = self.kubelet.pid() is not None and not any(p.unkept() for p in self.processes())
        return up and self.kube.ready() and self.node_ready()

    def describe(self) -> str:
        took = self.started_in.read_text() if self.started_in.exists() else "?"
        return (f"node {NODE} (pods on {POD_SUBNET}, DNS {NODE_IP}, containerd {self.socket}); "
                f"started in {took}s")  # fmt: skip

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

    def _coredns_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{COREDNS_READY_PORT}/ready", timeout=2
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def network_namespaces(self, container: str) -> list[str]:
        """The network namespace file a pod sandbox's container was given, if any."""
        info = json.loads(self.ctr("containers", "info", container, check=False).stdout or "{}")
        spaces = info.get("Spec", {}).get("linux", {}).get("namespaces", [])
        return [
            s["path"]
            for s in spaces
            if s.get("type") == "network" and s.get("path", "").startswith("/var/run/netns/")
        ]

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

    def _write_corefile(self) -> None:
        # Cluster names from the API server; any other name as this machine resolves it.
        (self.dir / "Corefile").write_text(f"""{CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
    bind {NODE_IP}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.kube.kubeconfig} dbq-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    ready 127.0.0.1:{COREDNS_READY_PORT}
    errors
}}
. {{
    bind {NODE_IP}
    forward . /etc/resolv.conf
    errors
}}
""")

    def _write_kubelet_config(self) -> None:
        # Serves on the bridge, where pods reach it too: only the API server's client certificate
        # is accepted, and what it may do is asked of the API server (webhook).
        (self.dir / "kubelet.yaml").write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {self.kube.kubelet_client_ca}}}
authorization: {{mode: Webhook}}
clusterDNS: [{NODE_IP}]
clusterDomain: {CLUSTER_DOMAIN}
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
# In-place pod resize (on by default since 1.33) is of no use to this node, whose cgroupsPerQOS
# is false; a kubelet was seen to crash in its code (a nil pointer in doPodResizeAction) after
# the operator's pod was force-deleted over a frozen process.
featureGates: {{InPlacePodVerticalScaling: false}}
""")


def _buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **BUILDAH_ENV})  # fmt: skip
    if done.returncode != 0:
        raise StackError(f"buildah {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _iptables(*args: str, binary: str = "iptables", check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise StackError(f"{binary} {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _route_to_loopback() -> None:
    """NAT rules by which pods on the bridge reach HOST_SERVICES on loopback (the kernel routes
    to 127.0.0.1 from the bridge only with `route_localnet`), and so does the node itself, so
    that one address (a Secret's url naming NODE_IP) serves a pod and the CLI, a local Spark job
    or a test alike. Idempotent."""
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1")
    hooks = (
        (TO_LOOPBACK, "PREROUTING", ["-i", BRIDGE]),  # from pods
        (TO_LOOPBACK, "OUTPUT", ["-o", "lo"]),  # from the node: its own addresses route through lo
        (FROM_LOOPBACK, "INPUT", ["-i", BRIDGE]),
        (FROM_LOOPBACK, "POSTROUTING", ["-o", "lo"]),
    )
    for chain in (TO_LOOPBACK, FROM_LOOPBACK):
        _iptables("-t", "nat", "-N", chain)
        _iptables("-t", "nat", "-F", chain, check=True)
    for chain, hook, where in hooks:
        if _iptables("-t", "nat", "-C", hook, *where, "-j", chain).returncode != 0:
            _iptables("-t", "nat", "-A", hook, *where, "-j", chain, check=True)
    for (address, port), local_port in HOST_SERVICES.items():
        _iptables("-t", "nat", "-A", TO_LOOPBACK, "-d", address, "-p", "tcp", "--dport", str(port),
                  "-j", "DNAT", "--to-destination", f"127.0.0.1:{local_port}", check=True)  # fmt: skip
    _iptables("-t", "nat", "-A", FROM_LOOPBACK, "-s", POD_SUBNET, "-d", "127.0.0.1", "-j", "SNAT",
              "--to-source", "127.0.0.1", check=True)  # fmt: skip


def _forget_rules() -> None:
    """Remove the iptables rules and chains the node made: ours to loopback, the kubelet's own,
    and the bridge plugin's NAT for pods (its comment names the network; a pod ended through
    containerd, not the kubelet, never had them removed)."""
    ours = {TO_LOOPBACK, FROM_LOOPBACK, *KUBELET_CHAINS}
    for binary in ("iptables", "ip6tables"):
        for table in ("nat", "filter", "mangle"):
            chains = set()
            for rule in _iptables("-t", table, "-S", binary=binary).stdout.splitlines():
                words = shlex.split(rule)
                target = words[words.index("-j") + 1] if "-j" in words else ""
                made_by_cni = any(w.startswith('name: "dbq"') for w in words)
                if words[0] == "-A" and (target in ours or made_by_cni):
                    _iptables("-t", table, "-D", *words[1:], binary=binary)
                if target in ours or (made_by_cni and target.startswith("CNI-")):
                    chains.add(target)
                if words[0] == "-N" and words[1] in ours:
                    chains.add(words[1])
            for chain in chains:
                for flag in ("-F", "-X"):
                    _iptables("-t", table, flag, chain, binary=binary)
