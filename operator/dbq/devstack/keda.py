"""KEDA beside the single-node cluster, so consumers really scale on a queue: its operator, its
metrics adapter and its admission webhooks (built from the Go module github.com/kedacore/keda/v2
by stack/build-keda.sh) run as local processes against the API server as its admin, as Flux's
controllers do, with leader election and KEDA's own certificate rotation off.

The HPA controller asks the API server for external metrics; the API server's aggregation layer
proxies that to the adapter, found through the endpoints of the Service of the APIService (there
is no kube-proxy to route a ClusterIP): the adapter listens on the node's address, the one the
Service's Endpoints name. KEDA's webhooks are reached the same way. The adapter asks the operator
for the values over gRPC on loopback. One certificate authority of the stack's own signs the
certificate all three serve; the APIService and the webhooks' configuration trust it."""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from dbq.devstack.base import NODE_IP, ManagedProcess, Paths, StackError, port_open, wait_until
from dbq.devstack.cluster import Cluster

KEDA_VERSION = os.environ.get("KEDA_VERSION", "v2.21.0")
NAMESPACE = "keda"
SERVICE = "keda-metrics-apiserver"
WEBHOOKS_SERVICE = "keda-admission-webhooks"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
# On 127.0.0.1: the operator's metrics, health probe and gRPC metrics service, the adapter's own
# metrics, the webhooks' metrics and health probe. The adapter serves the external metrics API on
# NODE_IP:ADAPTER_PORT, the webhooks theirs on WEBHOOKS_PORT.
OPERATOR_METRICS, OPERATOR_HEALTH, METRICS_SERVICE, ADAPTER_METRICS = 18490, 18491, 18492, 18493
ADAPTER_PORT, WEBHOOKS_PORT, WEBHOOKS_METRICS, WEBHOOKS_HEALTH = 18494, 18495, 18496, 18497


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
        self.webhooks = ManagedProcess("keda-webhooks", paths.state, marker=f"keda-webhooks-{KEDA_VERSION}")

    def binary(self, name: str) -> Path:
        path = self.paths.cache / "bin" / f"keda-{name}-{KEDA_VERSION}"
        if not path.exists():
            raise StackError(f"{path} is missing: run `bash stack/bootstrap.sh` to build it")
        return path

    def built(self, name: str) -> Path:
        """What stack/build-keda.sh copied from KEDA's module: its CRDs, its webhooks' configuration."""
        path = self.paths.cache / name
        if not path.exists():
            raise StackError(
                f"{path} is missing: run `bash stack/bootstrap.sh` to copy it from KEDA's module"
            )
        return path

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.cluster.start()  # the HPA controller, and pods to scale
        if not self.kube.started_with("--enable-aggregator-routing"):
            raise StackError("the API server was started by an older dbq without the aggregation layer: "
                             "restart it with `dbq dev down` and `dbq dev up keda`")  # fmt: skip
        binaries = {name: self.binary(name) for name in ("operator", "adapter", "webhooks")}
        self._write_certificates()
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(self.built(f"keda-crds-{KEDA_VERSION}"))
        )
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
        if self.webhooks.pid() is None:
            self.webhooks.start([
                str(binaries["webhooks"]), f"--kubeconfig={kubeconfig}", f"--cert-dir={self.certs}",
                f"--port={WEBHOOKS_PORT}", f"--metrics-bind-address=127.0.0.1:{WEBHOOKS_METRICS}",
                f"--health-probe-bind-address=127.0.0.1:{WEBHOOKS_HEALTH}", "--zap-log-level=info",
            ], env=env)  # fmt: skip
        for process, port in ((self.operator, OPERATOR_HEALTH), (self.webhooks, WEBHOOKS_HEALTH)):
            wait_until(functools.partial(healthy, port), timeout=120, what=process.name, log=process.log,
                       alive=process.running)  # fmt: skip
        wait_until(self._available, timeout=120, what=f"the APIService {API_SERVICE} (keda-adapter)",
                   log=self.adapter.log, alive=self.adapter.running)  # fmt: skip

    def stop(self) -> None:
        for process in (self.webhooks, self.adapter, self.operator):
            process.stop()

    def ready(self) -> bool:
        return (
            all(p.pid() is not None for p in (self.operator, self.adapter, self.webhooks))
            and healthy(OPERATOR_HEALTH)
            and healthy(WEBHOOKS_HEALTH)
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
        """A CA, and the certificate the adapter, the webhooks and the operator's gRPC serve (and
        present to each other): ca.crt, tls.crt, tls.key, as KEDA reads them from its certificate
        directory. Made again when the names it must carry changed."""
        names = ",".join([f"IP:127.0.0.1,IP:{NODE_IP}", f"DNS:{SERVICE}.{NAMESPACE}.svc",
                          f"DNS:{WEBHOOKS_SERVICE}.{NAMESPACE}.svc", f"DNS:keda-operator.{NAMESPACE}.svc",
                          "DNS:localhost"])  # fmt: skip
        made_for = self.certs / "names"
        if (self.certs / "tls.crt").exists() and made_for.exists() and made_for.read_text() == names:
            return
        self.certs.mkdir(parents=True, exist_ok=True)
        ca, tls = self.certs / "ca", self.certs / "tls"
        extensions = f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n".encode()
        for argv in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=dbq-keda-ca",
             "-keyout", f"{ca}.key", "-out", f"{ca}.crt"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={SERVICE}.{NAMESPACE}.svc",
             "-keyout", f"{tls}.key", "-out", f"{tls}.csr"],
            ["x509", "-req", "-days", "3650", "-in", f"{tls}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-extfile", "/dev/stdin", "-out", f"{tls}.crt"],
        ):  # fmt: skip
            subprocess.run(["openssl", *argv], check=True, capture_output=True, input=extensions)
        made_for.write_text(names)  # last: its presence means all are there

    def _objects(self) -> dict[str, Any]:
        """KEDA's namespace; for the adapter and the webhooks each a Service with no selector,
        whose Endpoints are the process on the node's address; the APIService and KEDA's
        ValidatingWebhookConfiguration naming them, trusting the stack's KEDA CA."""
        ca = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        items: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        ]
        for name, target in ((SERVICE, ADAPTER_PORT), (WEBHOOKS_SERVICE, WEBHOOKS_PORT)):
            meta = {"name": name, "namespace": NAMESPACE}
            items += [
                {"apiVersion": "v1", "kind": "Service", "metadata": meta,
                 "spec": {"ports": [{"name": "https", "port": 443, "targetPort": target, "protocol": "TCP"}]}},
                {"apiVersion": "v1", "kind": "Endpoints", "metadata": meta,
                 "subsets": [{"addresses": [{"ip": NODE_IP}],
                              "ports": [{"name": "https", "port": target, "protocol": "TCP"}]}]},
            ]  # fmt: skip
        items.append(
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
             "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                      "versionPriority": 100, "caBundle": ca,
                      "service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443}}}
        )  # fmt: skip
        webhooks = yaml.safe_load(self.built(f"keda-webhooks-{KEDA_VERSION}.yaml").read_text())
        for hook in webhooks["webhooks"]:
            hook["clientConfig"]["caBundle"] = ca
            hook["clientConfig"]["service"].update(namespace=NAMESPACE, port=443)
        items.append(webhooks)
        return {"apiVersion": "v1", "kind": "List", "items": items}

    def _available(self) -> bool:
        """Whether the API server reaches the adapter (the APIService's Available condition)."""
        try:
            service = json.loads(self.kubectl("get", "apiservice", API_SERVICE, "-o", "json"))
        except StackError:
            return False
        conditions = service.get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def healthy(port: int) -> bool:
    """Whether a KEDA process's health probe on 127.0.0.1:`port` answers."""
    if not port_open("127.0.0.1", port):
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
