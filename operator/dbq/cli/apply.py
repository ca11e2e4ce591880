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
from dbq.backends.odbc_ring import OdbcRing
from dbq.cli.output import console
from dbq.controller import conditions as cond
from dbq.controller.reconcile import Outcome, backend_for, delete, reconcile
from dbq.errors import DbqError

# The status of a Queue whose objects are its own: its deletion drops them, and its reconcile
# resizes its ring online.
PROVISIONED = {
    "conditions": cond.set_condition(
        [], cond.PROVISIONED, True, "Provisioned", "the manifest's own objects", None
    )
}


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
    resize: bool = False,
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
            outcome = reconcile(name, namespace, spec, meta.get("generation"), PROVISIONED if resize else {},
                                read_secret, read_queue=read_queue)  # fmt: skip
            done = "Ready (" + ("; ".join(outcome.steps) if outcome.steps else "already in sync") + ")"
            done += "".join(f"; {e.message}" for e in outcome.events if e.reason == "ResizeStarted")
            if resize and outcome.error is None:
                done += "; " + _retire(name, namespace, spec, read_secret)
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
    return delete(name, namespace, spec, None, PROVISIONED, read_secret, force=False)


def _retire(name: str, namespace: str, spec: dict[str, Any], read_secret: Any) -> str:
    """What the operator's cleanup does after a resize: older rings that drained retire."""
    _spec, _, backend = backend_for(name, namespace, spec, read_secret, status=PROVISIONED)
    try:
        done = backend.retire() if isinstance(backend, OdbcRing) else None
    finally:
        backend.close()
    if done is None:
        return "no ring to retire" if not isinstance(backend, OdbcRing) else "a resize runs: retire later"
    said = f"{done.retired} older ring(s) retired"
    if done.resizing:
        said += (f", {done.alive - 1} still draining ({done.positions_left} message(s) to pop, {done.leased} leased):"
                 " run again once consumers drained them")  # fmt: skip
    return said


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
@click.option(
    "--resize",
    is_flag=True,
    help="The queue's objects are this manifest's: resize its ring online to spec.ring.size, and retire"
    " older rings that drained (run again until none is left).",
)
def apply(
    path: str,
    secret_file: str | None,
    url: str | None,
    dry_run: bool,
    delete: bool,
    force: bool,
    resize: bool,
) -> None:
    """Reconcile Queue manifests straight against the database, without Kubernetes."""
    sys.exit(
        apply_manifests(
            path,
            secret_file,
            url,
            dry_run=dry_run,
            delete=delete,
            force=force,
            console=console,
            resize=resize,
        )
    )


COMMANDS = (apply,)
