"""`dbq apply`: the operator's reconcile, run against the database with no cluster."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from dbq.api.models import DeletionPolicy
from dbq.backends.base import BackendError
from dbq.controller.reconcile import backend_for, reconcile


def _secrets_from(secret_file: str | None, url: str | None) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, name) -> base64 data, as the API would return it."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    if secret_file:
        for doc in yaml.safe_load_all(Path(secret_file).read_text()):
            if not doc or doc.get("kind") != "Secret":
                continue
            meta = doc.get("metadata", {})
            data = dict(doc.get("data") or {})
            for key, value in (doc.get("stringData") or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            found[(meta.get("namespace", "default"), meta["name"])] = data
    if url:
        found[("*", "*")] = {"url": base64.b64encode(url.encode()).decode()}
    return found


def apply_manifests(
    path: str,
    secret_file: str | None,
    url: str | None,
    *,
    dry_run: bool,
    delete: bool,
    force: bool,
    console: Console,
) -> int:
    secrets = _secrets_from(secret_file, url)

    def read_secret(namespace: str, name: str) -> dict[str, Any] | None:
        return secrets.get((namespace, name)) or secrets.get(("*", "*"))

    failures = 0
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if not doc or doc.get("kind") != "Queue":
            continue
        meta = doc.get("metadata") or {}
        name, namespace = meta.get("name", "?"), meta.get("namespace", "default")
        label = f"queue {namespace}/{name}"
        try:
            if dry_run or delete:
                spec, _, backend = backend_for(name, namespace, doc.get("spec") or {}, read_secret)
                try:
                    if delete:
                        _delete(backend, spec.deletion_policy, force, label, console)
                    else:
                        steps = backend.plan(backend.observe())
                        console.print(f"{label}: " + ("in sync" if not steps else f"{len(steps)} step(s)"))
                        for step in steps:
                            console.print(f"  - {step.action}: {step.why}")
                finally:
                    backend.close()
                continue
        except BackendError as e:
            console.print(f"[red]{label}: {e.reason}[/red]: {e}", highlight=False)
            failures += 1
            continue
        outcome = reconcile(name, namespace, doc.get("spec") or {}, meta.get("generation"), {}, read_secret)
        if outcome.ok:
            detail = "; ".join(outcome.steps) if outcome.steps else "already in sync"
            console.print(f"[green]{label}: Ready[/green] ({detail})", highlight=False)
        else:
            assert outcome.error is not None
            console.print(f"[red]{label}: {outcome.error.reason}[/red]: {outcome.error}", highlight=False)
            failures += 1
    return 1 if failures else 0


def _delete(backend: Any, policy: str, force: bool, label: str, console: Console) -> None:
    if policy == DeletionPolicy.Retain and not force:
        console.print(f"{label}: deletionPolicy Retain: nothing dropped (use --force to drop anyway)")
        return
    if policy == DeletionPolicy.DeleteIfEmpty and not force:
        depth = backend.depth()
        if depth.depth or depth.in_flight:
            raise BackendError(
                f"holds {depth.depth} ready and {depth.in_flight} leased messages; use --force"
            )
    backend.teardown()
    console.print(f"{label}: dropped")
