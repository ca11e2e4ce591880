"""Runs the real operator (`dbq run`) against the local API server, as its least-privilege RBAC
identity, and gives tests small helpers over the admin client."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from dbq.devstack.kube import OPERATOR_USER
from stack.render_manifests import CRD_KINDS, package_version, render
from tests.local import exclusive

ROOT = Path(__file__).resolve().parent.parent
G, V, P = "dbq.dev", "v1alpha1", "queues"
IMAGE = f"localhost/dbq-operator:{package_version()}"  # what stack/image.sh builds


def buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, env={"BUILDAH_ISOLATION": "chroot", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})  # fmt: skip
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def build_image(which: str = "operator") -> None:
    """dbq's `which` image (operator or spark), built by stack/image.sh when its inputs changed."""
    done = subprocess.run(
        ["bash", str(ROOT / "stack" / "image.sh"), which], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"stack/image.sh {which} failed:\n{done.stdout}\n{done.stderr}"
    print(done.stdout.strip().splitlines()[-1])  # name and size


def build_operator_image() -> dict[str, Any]:
    """The operator image and its OCI config."""
    build_image("operator")
    return dict(json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"])


def new_namespace(api: client.ApiClient, name: str) -> None:
    """Create namespace `name` and wait for its default ServiceAccount (made by the cluster's
    controller manager), without which no pod is admitted."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: core.list_namespaced_service_account(name).items, 30, f"the default ServiceAccount of {name}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


class Operator:
    """One `dbq run -n NAMESPACE` process; restartable and killable."""

    def __init__(
        self, kube: Any, namespace: str, log: Path, drift_interval: float = 2.0, args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.kubeconfig = kube.operator_kubeconfig
        self.args = args  # more `dbq run` options
        self.env = env or {}  # more environment (DBQ_* settings)
        self.namespace = namespace
        self.log = log
        self.drift_interval = drift_interval
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()
        self.health_port = free_port()

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "DBQ_DRIFT_INTERVAL": str(self.drift_interval),
            **self.env,
        }
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dbq.cli", "run", "-n", self.namespace,
                 "--metrics-port", str(self.metrics_port),
                 "--liveness", f"http://127.0.0.1:{self.health_port}/healthz", *self.args],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class Cluster:
    """Admin-side helpers for one test namespace."""

    def __init__(self, api: client.ApiClient, namespace: str, plural: str = P) -> None:
        self.api = api
        self.ns = namespace
        self.plural = plural
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def of(self, plural: str) -> Cluster:
        """The same helpers for another of dbq's kinds (topics, subscriptions) in this namespace."""
        return Cluster(self.api, self.ns, plural)

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        doc = json.loads(json.dumps(doc))
        doc["metadata"]["namespace"] = self.ns
        return dict(self.custom.create_namespaced_custom_object(G, V, self.ns, self.plural, doc))

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(G, V, self.ns, self.plural, name))

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.patch_namespaced_custom_object(G, V, self.ns, self.plural, name, body))

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(G, V, self.ns, self.plural, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def names(self) -> list[str]:
        return [
            i["metadata"]["name"]
            for i in self.custom.list_namespaced_custom_object(G, V, self.ns, self.plural)["items"]
        ]

    def force_delete_all(self, timeout: float) -> None:
        """Delete every resource of the kind with the force-delete annotation; the operator must
        finish each."""
        for name in self.names():
            try:
                self.patch(name, {"metadata": {"annotations": {"dbq.dev/force-delete": "true"}}})
            except ApiException as e:
                if e.status != 404:  # gone since it was listed
                    raise
            self.delete(name)
        wait_for(lambda: not self.names(), timeout, f"{self.plural} deleted by the operator")

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        status = self.get(name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})

    def wait_condition(
        self, name: str, type_: str, status: str, timeout: float = 60, reason: str | None = None
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition(name, type_)
            ok = c.get("status") == status and (reason is None or c.get("reason") == reason)
            return c if ok else None

        return dict(wait_for(check, timeout, f"{name} {type_}={status} {reason or ''}"))

    def events(self, name: str) -> list[Any]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return list(items)

    def secret(self, name: str, string_data: dict[str, str]) -> None:
        body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=string_data)
        try:
            self.core.create_namespaced_secret(self.ns, body)
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.replace_namespaced_secret(name, self.ns, body)


def operator_namespace(kube: Any, postgres: Any, prefix: str) -> Cluster:
    """A new namespace with the CRDs, the chart's namespaced RBAC and the Secret `orders-db` for
    the test database: where an operator under test is pointed."""
    ns = f"{prefix}-{secrets.token_hex(3)}"
    kubectl = ["kubectl", "--kubeconfig", kube.kubeconfig]
    with exclusive("crd"):  # the CRDs and the chart's ClusterRole are shared by every test process
        for kind in CRD_KINDS:
            subprocess.run(
                [*kubectl, "apply", "-f", str(ROOT / "crds" / f"{kind}.yaml")],
                check=True,
                capture_output=True,
            )
        subprocess.run([*kubectl, "wait", "--for=condition=Established", *(f"crd/{k}s.dbq.dev" for k in CRD_KINDS),
                        "--timeout=60s"], check=True, capture_output=True)  # fmt: skip
        client.CoreV1Api(kube.api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        apply_rbac(kube.kubeconfig, ns)
    cluster = Cluster(kube.api, ns)
    cluster.secret("orders-db", {"url": postgres.url, "ca": postgres.ca})  # verified TLS
    return cluster


def apply_rbac(kubectl_config: str, namespace: str) -> None:
    """The chart's namespaced RBAC for `namespace`, exactly as `helm install` would create it for
    one operator without leader election (the Lease is granted by the tests that elect)."""
    docs = render("--set", f"watchNamespaces={{{namespace}}}", "--set", "replicas=1", "--set",
                  "leaderElection.enabled=false", show_only=("rbac.yaml",), plain=False)  # fmt: skip
    subprocess.run(
        ["kubectl", "--kubeconfig", kubectl_config, "apply", "-f", "-"],
        input=yaml.safe_dump_all(docs), text=True, check=True, capture_output=True,
    )  # fmt: skip
    subjects = {s["namespace"] + ":" + s["name"] for d in docs for s in d.get("subjects", [])}
    assert subjects == {OPERATOR_USER.removeprefix("system:serviceaccount:")}, subjects
