"""Helpers of the GitOps tests: a git repository on Flux's git server to commit to, and the Flux
objects that apply it (GitRepository, Kustomization, HelmRepository, HelmRelease), asked to
reconcile at once as `flux reconcile` does (the `reconcile.fluxcd.io/requestedAt` annotation)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.operator_harness import wait_for

GIT_REPOSITORY = ("source.toolkit.fluxcd.io", "v1", "gitrepositories", "GitRepository")
HELM_REPOSITORY = ("source.toolkit.fluxcd.io", "v1", "helmrepositories", "HelmRepository")
KUSTOMIZATION = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations", "Kustomization")
HELM_RELEASE = ("helm.toolkit.fluxcd.io", "v2", "helmreleases", "HelmRelease")
Kind = tuple[str, str, str, str]


class Repository:
    """A bare repository on Flux's git server and a working copy to commit from."""

    def __init__(self, flux: Any, name: str, work: Path) -> None:
        self.bare, self.url = flux.repository(name)
        self.work = work
        subprocess.run(
            ["git", "clone", "--quiet", str(self.bare), str(work)], check=True, capture_output=True
        )
        for key, value in (("user.name", "dbq tests"), ("user.email", "tests@dbq.invalid")):
            subprocess.run(["git", "-C", str(work), "config", key, value], check=True)

    def commit(self, files: dict[str, Any], message: str, folder: str = "queues") -> str:
        """Writes each file of `folder` (a manifest, or None to delete it) and the
        kustomization.yaml that lists them all, commits and pushes; the commit's sha."""
        where = self.work / folder
        where.mkdir(exist_ok=True)
        for name, content in files.items():
            if content is None:
                (where / name).unlink()
            else:
                (where / name).write_text(yaml.safe_dump(content, sort_keys=False))
        listed = sorted(p.name for p in where.glob("*.yaml") if p.name != "kustomization.yaml")
        (where / "kustomization.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": listed}))  # fmt: skip
        git = ["git", "-C", str(self.work)]
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "--quiet", "--allow-empty", "-m", message], check=True)
        subprocess.run([*git, "push", "--quiet", "origin", "HEAD:main"], check=True, capture_output=True)
        sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
        return sha.strip()


class FluxObjects:
    """The Flux objects of one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace

    def create(self, kind: Kind, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": f"{kind[0]}/{kind[1]}",
            "kind": kind[3],
            "metadata": {"name": name},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(kind[0], kind[1], self.namespace, kind[2], body)

    def delete(self, kind: Kind, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(kind[0], kind[1], self.namespace, kind[2], name)
        except client.ApiException as e:
            if e.status != 404:
                raise

    def get(self, kind: Kind, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(kind[0], kind[1], self.namespace, kind[2], name))

    def exists(self, kind: Kind, name: str) -> bool:
        try:
            self.get(kind, name)
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def ready(self, kind: Kind, name: str) -> dict[str, Any]:
        conditions = (self.get(kind, name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Ready"), {})

    def reconcile_now(self, *objects: tuple[Kind, str]) -> None:
        at = datetime.now(UTC).isoformat()
        for kind, name in objects:
            self.custom.patch_namespaced_custom_object(kind[0], kind[1], self.namespace, kind[2], name,
                {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": at}}})  # fmt: skip

    def applied(self, name: str, revision: str, timeout: float = 120) -> dict[str, Any]:
        """Kustomization `name`'s Ready condition once Flux applied `revision` and judged it."""

        def done() -> dict[str, Any] | None:
            status = self.get(KUSTOMIZATION, name).get("status") or {}
            ready = self.ready(KUSTOMIZATION, name)
            # lastAttemptedRevision moves to the new revision before Ready does: a True counts
            # only with the revision applied, a False only once judged for this revision.
            if ready.get("status") == "True":
                return ready if status.get("lastAppliedRevision") == revision else None
            judged = ready.get("status") == "False" and ready.get("reason") != "Progressing"
            return ready if status.get("lastAttemptedRevision") == revision and judged else None

        found = wait_for(done, timeout, f"Flux to apply {revision}", interval=0.5)
        assert isinstance(found, dict)
        return found
