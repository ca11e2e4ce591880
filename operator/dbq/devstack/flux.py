"""Flux beside the stack's API server, so a GitOps pipeline really applies Queues: source-,
kustomize- and helm-controller (built from their Go modules by stack/build-flux.sh) run as local
processes against the API server as its admin, each on its own loopback ports, with leader
election off and Events as their only notification; their CRDs come from the same modules. A
git server on loopback (git_http.py, git's own smart HTTP backend) serves the bare repositories
under `git_root`: `repository(name)` makes one and gives its URL for a GitRepository.

source-controller keeps artifacts under the state directory and serves them on STORAGE_PORT,
where kustomize- and helm-controller fetch them."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from dbq.devstack.base import ManagedProcess, Paths, StackError, port_open, wait_until
from dbq.devstack.kube import Kube

SOURCE_CONTROLLER_VERSION = os.environ.get("SOURCE_CONTROLLER_VERSION", "v1.9.5")
KUSTOMIZE_CONTROLLER_VERSION = os.environ.get("KUSTOMIZE_CONTROLLER_VERSION", "v1.9.5")
HELM_CONTROLLER_VERSION = os.environ.get("HELM_CONTROLLER_VERSION", "v1.6.4")
GIT_PORT = 18480
STORAGE_PORT = 18481
# (metrics, health) ports of each controller, on 127.0.0.1.
PORTS = {"source-controller": (18482, 18483), "kustomize-controller": (18484, 18485),
         "helm-controller": (18486, 18487)}  # fmt: skip
VERSIONS = {"source-controller": SOURCE_CONTROLLER_VERSION, "kustomize-controller": KUSTOMIZE_CONTROLLER_VERSION,
            "helm-controller": HELM_CONTROLLER_VERSION}  # fmt: skip
GIT_SERVER = Path(__file__).with_name("git_http.py")


class Flux:
    name = "flux"

    def __init__(self, paths: Paths, kube: Kube) -> None:
        self.paths = paths
        self.kube = kube
        self.dir = paths.state / "flux"
        self.git_root = self.dir / "git"
        self.storage = self.dir / "storage"
        # By the script's name and the root it serves, wherever the checkout that started it is.
        self.git = ManagedProcess("flux-git", paths.state, marker=f"{GIT_SERVER.name} {self.git_root}")
        self.controllers = {
            name: ManagedProcess(name, paths.state, marker=f"{name}-{version}")
            for name, version in VERSIONS.items()
        }

    def binary(self, name: str) -> Path:
        path = self.paths.cache / "bin" / f"{name}-{VERSIONS[name]}"
        if not path.exists():
            raise StackError(f"{path} is missing: run `bash stack/bootstrap.sh` to build it")
        return path

    @property
    def crds(self) -> Path:
        path = self.paths.cache / (
            f"flux-crds-{SOURCE_CONTROLLER_VERSION}-{KUSTOMIZE_CONTROLLER_VERSION}-{HELM_CONTROLLER_VERSION}"
        )
        if not path.is_dir():
            raise StackError(f"{path} is missing: run `bash stack/bootstrap.sh` to copy Flux's CRDs")
        return path

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.kube.start()
        binaries = {name: self.binary(name) for name in self.controllers}
        subprocess.run(["kubectl", "--kubeconfig", str(self.kube.kubeconfig), "apply", "--server-side",
                        "--force-conflicts", "-f", str(self.crds)], check=True, capture_output=True)  # fmt: skip
        self.git_root.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        if self.git.pid() is None:
            self.git.start([sys.executable, str(GIT_SERVER), str(self.git_root), str(GIT_PORT)])
        wait_until(lambda: port_open("127.0.0.1", GIT_PORT), timeout=30, what="the git server",
                   log=self.git.log, alive=self.git.running)  # fmt: skip
        env = {"KUBECONFIG": str(self.kube.kubeconfig)}
        storage = f"127.0.0.1:{STORAGE_PORT}"
        extra = {
            "source-controller": [f"--storage-path={self.storage}", f"--storage-addr={storage}",
                                  f"--storage-adv-addr={storage}"],
            # Queues that wait on another (their dead-letter keeper) are tried again soon.
            "kustomize-controller": ["--requeue-dependency=5s"],
            "helm-controller": [],
        }  # fmt: skip
        for name, process in self.controllers.items():
            if process.pid() is None:
                metrics, health = PORTS[name]
                process.start([str(binaries[name]), f"--metrics-addr=127.0.0.1:{metrics}",
                               f"--health-addr=127.0.0.1:{health}", "--enable-leader-election=false",
                               "--log-encoding=console", *extra[name]], env=env)  # fmt: skip
        for name, process in self.controllers.items():
            wait_until(functools.partial(self._healthy, name), timeout=120, what=name, log=process.log,
                       alive=process.running)  # fmt: skip

    def stop(self) -> None:
        for process in (*self.controllers.values(), self.git):
            process.stop()

    def ready(self) -> bool:
        return self.git.pid() is not None and all(
            process.pid() is not None and self._healthy(name) for name, process in self.controllers.items()
        )

    def describe(self) -> str:
        versions = ", ".join(f"{name} {version}" for name, version in VERSIONS.items())
        return f"{versions}; git over HTTP at http://127.0.0.1:{GIT_PORT}/NAME.git (bare repositories in {self.git_root})"

    # --- repositories ------------------------------------------------------------------
    def repository(self, name: str) -> tuple[Path, str]:
        """A bare repository `name` (made when missing): its path, to push to, and the URL a
        GitRepository fetches from."""
        path = self.git_root / f"{name}.git"
        if not path.exists():
            subprocess.run(
                ["git", "init", "--quiet", "--bare", "--initial-branch=main", str(path)], check=True
            )
        return path, f"http://127.0.0.1:{GIT_PORT}/{name}.git"

    def _healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORTS[name][1]}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False
