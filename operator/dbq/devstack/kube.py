"""etcd and kube-apiserver on loopback, built from Go modules by stack/build-kube.sh."""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import urllib.request
from pathlib import Path

from dbq.devstack.base import ManagedProcess, Paths, StackError, port_open, wait_until

KUBE_VERSION = os.environ.get("KUBE_VERSION", "v1.33.13")
ETCD_PORT = int(os.environ.get("DBQ_ETCD_PORT", "12379"))
ETCD_PEER_PORT = ETCD_PORT + 1
APISERVER_PORT = int(os.environ.get("DBQ_APISERVER_PORT", "16443"))
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the first address of SERVICE_CIDR

# Users of the static token file: an administrator for tests and set-up, and an
# unprivileged identity used to prove the operator's RBAC is enough (and no more).
ADMIN_USER = "dbq-admin"
OPERATOR_USER = "system:serviceaccount:dbq-system:dbq-operator"


class Kube:
    name = "kube-apiserver"

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.etcd = ManagedProcess("etcd", paths.state, marker=f"etcd-{KUBE_VERSION}")
        self.apiserver = ManagedProcess(
            "kube-apiserver", paths.state, marker=f"kube-apiserver-{KUBE_VERSION}"
        )
        self.pki = paths.state / "kube-apiserver" / "pki"
        self.kubeconfig = paths.state / "kubeconfig"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{APISERVER_PORT}"

    def binary(self, name: str) -> Path:
        path = self.paths.cache / "bin" / f"{name}-{KUBE_VERSION}"
        if not path.exists():
            raise StackError(f"{path} is missing: run `bash stack/bootstrap.sh` to build it")
        return path

    def token(self, user: str) -> str:
        for line in (self.pki / "tokens.csv").read_text().splitlines():
            token, name, *_ = line.split(",")
            if name == user:
                return token
        raise StackError(f"no token for {user}")

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self.etcd.pid() is None:
            data = self.etcd.dir / "data"
            self.etcd.start(
                [
                    str(self.binary("etcd")),
                    "--name=dbq-local",
                    f"--data-dir={data}",
                    f"--listen-client-urls=http://127.0.0.1:{ETCD_PORT}",
                    f"--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}",
                    f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                    f"--initial-cluster=dbq-local=http://127.0.0.1:{ETCD_PEER_PORT}",
                    "--unsafe-no-fsync",  # a throw-away test store; durability is not under test
                    "--log-level=warn",
                ]
            )
        wait_until(
            lambda: port_open("127.0.0.1", ETCD_PORT),
            timeout=60,
            what="etcd",
            log=self.etcd.log,
            alive=self.etcd.running,
        )
        if self.apiserver.pid() is None:
            self._write_pki()
            self.apiserver.start([str(self.binary("kube-apiserver")), *self._apiserver_args()])
        wait_until(
            self._readyz,
            timeout=180,
            what="kube-apiserver",
            log=self.apiserver.log,
            alive=self.apiserver.running,
        )
        self._write_kubeconfig()

    def stop(self) -> None:
        self.apiserver.stop()
        self.etcd.stop()

    def ready(self) -> bool:
        return self.apiserver.pid() is not None and self._readyz()

    def describe(self) -> str:
        return f"{self.url} (KUBECONFIG={self.kubeconfig}); etcd http://127.0.0.1:{ETCD_PORT}"

    # --- details ---------------------------------------------------------------------
    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={APISERVER_PORT}",
            f"--cert-dir={pki}",  # the server generates a self-signed serving cert here
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none",  # loopback may not be published as an endpoint
            # The single-node cluster's node has no name in DNS: its kubelet is reached by address.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # How the API server proves itself to the kubelet (which trusts `kubelet_client_ca`).
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            # The aggregation layer (an APIService such as KEDA's external metrics): the API server
            # proxies to it as front-proxy-client, and reaches it at its Service's endpoints (there
            # is no kube-proxy to route a ClusterIP).
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--enable-aggregator-routing=true",
            "--v=1",
        ]

    def _write_pki(self) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        key = self.pki / "sa.key"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(
                ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(self.pki / "sa.pub")],
                check=True,
                capture_output=True,
            )
        if not (self.pki / "kubelet-client.crt").exists():
            # A CA the kubelet trusts and the API server's client certificate from it, in the group
            # system:masters, so the kubelet's webhook authorization lets it read logs and exec.
            self._write_client_certificate("kubelet", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        if not (self.pki / "front-proxy-client.crt").exists():
            # The aggregation layer's: extension API servers trust this CA for who the user is.
            self._write_client_certificate("front-proxy", "/CN=front-proxy-client")
        tokens = self.pki / "tokens.csv"
        if not tokens.exists():
            rows = [
                f"{secrets.token_hex(24)},{ADMIN_USER},{ADMIN_USER},system:masters",
                f'{secrets.token_hex(24)},{OPERATOR_USER},dbq-operator,"system:serviceaccounts"',
            ]
            tokens.touch(mode=0o600)
            tokens.write_text("\n".join(rows) + "\n")

    def _write_client_certificate(self, name: str, subject: str) -> None:
        """A CA `NAME-ca` and a client certificate `NAME-client` of `subject` signed by it."""
        ca, client = self.pki / f"{name}-ca", self.pki / f"{name}-client"
        for argv in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", f"/CN=dbq-{name}-client-ca",
             "-keyout", f"{ca}.key", "-out", f"{ca}.crt"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
             "-keyout", f"{client}.key", "-out", f"{client}.csr"],
            ["x509", "-req", "-days", "3650", "-in", f"{client}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{client}.crt.tmp"],
        ):  # fmt: skip
            subprocess.run(["openssl", *argv], check=True, capture_output=True)
        Path(f"{client}.crt.tmp").rename(f"{client}.crt")  # last: its presence means all are there

    @property
    def kubelet_client_ca(self) -> Path:
        return self.pki / "kubelet-ca.crt"

    def started_with(self, flag: str) -> bool:
        """Whether the running API server was started with `flag` (one started by an older dbq may not be)."""
        pid = self.apiserver.pid()
        return pid is not None and flag in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki / "apiserver.crt"))

    def _readyz(self) -> bool:
        if not (self.pki / "apiserver.crt").exists() or not port_open("127.0.0.1", APISERVER_PORT):
            return False
        req = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.token(ADMIN_USER)}"}
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=5) as resp:
                return bool(resp.status == 200 and resp.read().strip() == b"ok")
        except OSError:
            return False

    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig that authenticates as `user` (e.g. the operator's RBAC identity)."""
        path = self.paths.state / f"kubeconfig-{user.replace(':', '_')}"
        self._write_kubeconfig(path, user)
        return path

    def _write_kubeconfig(self, path: Path | None = None, user: str = ADMIN_USER) -> None:
        path = path or self.kubeconfig
        ca = self.pki / "apiserver.crt"
        text = f"""apiVersion: v1
kind: Config
clusters:
- name: dbq-local
  cluster:
    server: {self.url}
    certificate-authority: {ca}
users:
- name: "{user}"
  user:
    token: {self.token(user)}
contexts:
- name: dbq-local
  context: {{cluster: dbq-local, user: "{user}", namespace: default}}
current-context: dbq-local
"""
        path.touch(mode=0o600)
        path.write_text(text)
