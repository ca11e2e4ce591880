"""KEDA beside the single-node cluster, so consumers really scale on a queue: its operator and its
metrics adapter (built from the Go module github.com/kedacore/keda/v2 by stack/build-keda.sh) run
as local processes against the API server as its admin, as Flux's controllers do, with leader
election and KEDA's own certificate rotation off.

The HPA controller asks the API server for external metrics; the API server's aggregation layer
proxies that to the adapter, found through the endpoints of the Service of the APIService (there
is no kube-proxy to route a ClusterIP): the adapter listens on the node's address, the one the
Service's Endpoints name. The adapter asks the operator for the values over gRPC on loopback. One
certificate authority of the stack's own signs the certificate both serve, and the APIService
trusts it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from dbq.devstack.base import NODE_IP, ManagedProcess, Paths, StackError, port_open, wait_until
from dbq.devstack.cluster import Cluster

KEDA_VERSION = os.environ.get("KEDA_VERSION", "v2.21.0")
NAMESPACE = "keda"
SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
# On 127.0.0.1: the operator's metrics, health probe and gRPC metrics service, the adapter's own
# metrics. The adapter serves the external metrics API on NODE_IP:ADAPTER_PORT.
OPERATOR_METRICS, OPERATOR_HEALTH, METRICS_SERVICE, ADAPTER_METRICS = 18490, 18491, 18492, 18493
ADAPTER_PORT = 18494


class Keda:
    name = "keda"

    def __init__(self, paths: Paths, cluster: Cluster) -> None:
        self.paths = paths
        self.cluster = cluster
        self.kube = cluster.kube
        self.dir = paths.state / "keda"
        self.certs = self.dir / "certs"
        self.operator = ManagedProcess("keda-operator", paths.state, marker=f"keda-operator-{KEDA_VERSION}")
        self.adapter = ManagedProcess("keda-adapter", paths.state, marker=f"keda-adapter-{KEDA_VERSION}")

    def binary(self, name: str) -> Path:
        path = self.paths.cache / "bin" / f"keda-{name}-{KEDA_VERSION}"
        if not path.exists():
            raise StackError(f"{path} is missing: run `bash stack/bootstrap.sh` to build it")
        return path

    @property
    def crds(self) -> Path:
        path = self.paths.cache / f"keda-crds-{KEDA_VERSION}"
        if not path.is_dir():
            raise StackError(f"{path} is missing: run `bash stack/bootstrap.sh` to copy KEDA's CRDs")
        return path

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.cluster.start()  # the HPA controller, and pods to scale
        if not self.kube.started_with("--enable-aggregator-routing"):
            raise StackError("the API server was started by an older dbq without the aggregation layer: "
                             "restart it with `dbq dev down` and `dbq dev up keda`")  # fmt: skip
        binaries = {name: self.binary(name) for name in ("operator", "adapter")}
        self._write_certificates()
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(self.crds))
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(self._objects())
        )
        env = {
            "KUBECONFIG": str(self.kube.kubeconfig),
            "WATCH_NAMESPACE": "",  # every namespace
            "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "OPERATOR_NAME": "keda-operator",
        }
        kubeconfig = str(self.kube.kubeconfig)
        if self.operator.pid() is None:
            self.operator.start([
                str(binaries["operator"]), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{OPERATOR_METRICS}",
                f"--health-probe-bind-address=127.0.0.1:{OPERATOR_HEALTH}",
                f"--metrics-service-bind-address=127.0.0.1:{METRICS_SERVICE}",
                f"--cert-dir={self.certs}", "--enable-cert-rotation=false", f"--ca-dir={self.certs}",
                "--enable-webhook-patching=false", "--enable-apiservice-patching=false", "--zap-log-level=info",
            ], env=env)  # fmt: skip
        if self.adapter.pid() is None:
            self.adapter.start([
                str(binaries["adapter"]), f"--lister-kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={NODE_IP}",
                f"--secure-port={ADAPTER_PORT}", f"--port={ADAPTER_METRICS}",
                f"--tls-cert-file={self.certs / 'tls.crt'}", f"--tls-private-key-file={self.certs / 'tls.key'}",
                f"--client-ca-file={self.certs / 'ca.crt'}", f"--cert-dir={self.certs}",
                f"--metrics-service-address=127.0.0.1:{METRICS_SERVICE}", "--zap-log-level=info",
            ], env=env)  # fmt: skip
        wait_until(self._operator_healthy, timeout=120, what="keda-operator", log=self.operator.log,
                   alive=self.operator.running)  # fmt: skip
        wait_until(self._available, timeout=120, what=f"the APIService {API_SERVICE} (keda-adapter)",
                   log=self.adapter.log, alive=self.adapter.running)  # fmt: skip

    def stop(self) -> None:
        for process in (self.adapter, self.operator):
            process.stop()

    def ready(self) -> bool:
        return (
            self.operator.pid() is not None
            and self.adapter.pid() is not None
            and self._operator_healthy()
            and self._available()
        )

    def describe(self) -> str:
        return (
            f"KEDA {KEDA_VERSION}: operator (gRPC 127.0.0.1:{METRICS_SERVICE}), external metrics"
            f" {API_SERVICE} served at {NODE_IP}:{ADAPTER_PORT}"
        )

    # --- details ---------------------------------------------------------------------
    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kube.kubeconfig), *args],
            input=stdin, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise StackError(f"kubectl {' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done.stdout

    def _write_certificates(self) -> None:
        """A CA, and the certificate the adapter and the operator's gRPC serve (and present to
        each other): ca.crt, tls.crt, tls.key, as KEDA reads them from its certificate directory."""
        if (self.certs / "tls.crt").exists():
            return
        self.certs.mkdir(parents=True, exist_ok=True)
        ca, tls = self.certs / "ca", self.certs / "tls"
        names = ",".join([f"IP:127.0.0.1,IP:{NODE_IP}", f"DNS:{SERVICE}.{NAMESPACE}.svc",
                          f"DNS:keda-operator.{NAMESPACE}.svc", "DNS:localhost"])  # fmt: skip
        for argv in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=dbq-keda-ca",
             "-keyout", f"{ca}.key", "-out", f"{ca}.crt"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={SERVICE}.{NAMESPACE}.svc",
             "-keyout", f"{tls}.key", "-out", f"{tls}.csr"],
            ["x509", "-req", "-days", "3650", "-in", f"{tls}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-extfile", "/dev/stdin", "-out", f"{tls}.crt.tmp"],
        ):  # fmt: skip
            extensions = f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n"
            subprocess.run(["openssl", *argv], check=True, capture_output=True, input=extensions.encode())
        Path(f"{tls}.crt.tmp").rename(f"{tls}.crt")  # last: its presence means all are there

    def _objects(self) -> dict[str, Any]:
        """KEDA's namespace, the Service the APIService names (no selector: its Endpoints are the
        adapter on the node's address) and the APIService, trusting the stack's KEDA CA."""
        ca = (self.certs / "ca.crt").read_bytes()
        port = {"name": "https", "port": 443, "targetPort": ADAPTER_PORT, "protocol": "TCP"}
        items: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "spec": {"ports": [port]}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "subsets": [{"addresses": [{"ip": NODE_IP}],
                          "ports": [{"name": "https", "port": ADAPTER_PORT, "protocol": "TCP"}]}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
             "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                      "versionPriority": 100, "caBundle": base64.b64encode(ca).decode(),
                      "service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443}}},
        ]  # fmt: skip
        return {"apiVersion": "v1", "kind": "List", "items": items}

    def _operator_healthy(self) -> bool:
        if not port_open("127.0.0.1", OPERATOR_HEALTH):
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{OPERATOR_HEALTH}/healthz", timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def _available(self) -> bool:
        try:
            service = json.loads(self.kubectl("get", "apiservice", API_SERVICE, "-o", "json"))
        except StackError:
            return False
        conditions = service.get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)
