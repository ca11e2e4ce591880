"""`dbq apply`: the operator's reconcile and deletion, run against the database with no cluster."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console

from dbq.api.models import DeletionPolicy
from dbq.cli.output import console
from dbq.controller.reconcile import Outcome, backend_for, delete, reconcile
from dbq.errors import DbqError


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

    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d and d.get("kind") == "Queue"]
    queues = {((d.get("metadata") or {}).get("namespace", "default"), (d.get("metadata") or {}).get("name")): d
              for d in docs}  # fmt: skip

    def read_queue(namespace: str, name: str) -> dict[str, Any] | None:
        """spec.deadLetter.queue is looked up among the manifests given."""
        return queues.get((namespace, name))

    # The Queues that keep others' dead letters first (last when deleting).
    docs.sort(key=lambda d: bool(((d.get("spec") or {}).get("deadLetter") or {}).get("queue")) != delete)
    failures = 0
    for doc in docs:
        meta = doc.get("metadata") or {}
        name, namespace = meta.get("name", "?"), meta.get("namespace", "default")
        spec = doc.get("spec") or {}
        label = f"queue {namespace}/{name}"
        if dry_run:
            try:
                _show_plan(name, namespace, spec, read_secret, read_queue, label, console)
            except DbqError as e:
                console.print(f"[red]{label}: {e.reason}[/red]: {e}", highlight=False)
                failures += 1
            continue
        if delete:
            if force:  # drop whatever the policy, messages and all
                spec = {**spec, "deletionPolicy": DeletionPolicy.Delete}
            outcome = _delete(name, namespace, spec, read_secret)
            done = "; ".join(e.message for e in outcome.events)
        else:
            outcome = reconcile(
                name, namespace, spec, meta.get("generation"), {}, read_secret, read_queue=read_queue
            )
            done = "Ready (" + ("; ".join(outcome.steps) if outcome.steps else "already in sync") + ")"
        if outcome.error is None:
            console.print(f"[green]{label}[/green]: {done}", highlight=False)
        else:
            console.print(f"[red]{label}: {outcome.error.reason}[/red]: {outcome.error}", highlight=False)
            failures += 1
    return 1 if failures else 0


def _show_plan(name: str, namespace: str, spec: dict[str, Any], read_secret: Any, read_queue: Any,
               label: str, console: Console) -> None:  # fmt: skip
    _spec, _, backend = backend_for(name, namespace, spec, read_secret, read_queue)
    try:
        steps = backend.plan(backend.observe())
    finally:
        backend.close()
    console.print(f"{label}: " + ("in sync" if not steps else f"{len(steps)} step(s)"))
    for step in steps:
        console.print(f"  - {step}: {step.why}")


def _delete(name: str, namespace: str, spec: dict[str, Any], read_secret: Any) -> Outcome:
    """The operator's deletion, with the queue treated as provisioned (it may well be)."""
    provisioned = {"conditions": [{"type": "Provisioned", "status": "True"}]}
    return delete(name, namespace, spec, None, provisioned, read_secret, force=False)


@click.command()
@click.option(
    "--file",
    "-f",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Queue manifest(s).",
)
@click.option(
    "--secret-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Secret manifest (data or stringData).",
)
@click.option("--url", envvar="DBQ_URL", help="Connection URL instead of a Secret (env DBQ_URL).")
@click.option("--dry-run", is_flag=True, help="Show the plan; change nothing.")
@click.option(
    "--delete", is_flag=True, help="Drop the queue's objects (honours deletionPolicy unless --force)."
)
@click.option("--force", is_flag=True, help="With --delete: drop even a non-empty queue.")
def apply(
    path: str, secret_file: str | None, url: str | None, dry_run: bool, delete: bool, force: bool
) -> None:
    """Reconcile Queue manifests straight against the database, without Kubernetes."""
    sys.exit(
        apply_manifests(path, secret_file, url, dry_run=dry_run, delete=delete, force=force, console=console)
    )


COMMANDS = (apply,)
