"""The `dbq` command."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from dbq.devstack import Stack

console = Console()


@click.group()
def main() -> None:
    """dbq: database-backed message queues, managed declaratively."""


@main.command()
def crd() -> None:
    """Print the Queue CRD generated from the API models."""
    from dbq.api.crd import crd_yaml

    click.echo(crd_yaml(), nl=False)


@main.command()
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch only these namespaces.")
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch the whole cluster (default without -n).")
@click.option(
    "--liveness", default="http://0.0.0.0:8080/healthz", show_default=True, help="Liveness endpoint."
)
@click.option(
    "--metrics-port", default=9090, show_default=True, type=int, help="Prometheus port; 0 disables."
)
@click.option("--verbose", "-v", is_flag=True)
def run(
    namespaces: tuple[str, ...], all_namespaces: bool, liveness: str, metrics_port: int, verbose: bool
) -> None:
    """Run the operator against the cluster in KUBECONFIG (or in-cluster)."""
    import logging

    import kopf
    from prometheus_client import start_http_server

    import dbq.controller.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if metrics_port:
        start_http_server(metrics_port)
    kopf.run(
        standalone=True,
        clusterwide=all_namespaces or not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness or None,
    )


@main.command()
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
    from dbq.cli_apply import apply_manifests

    sys.exit(
        apply_manifests(path, secret_file, url, dry_run=dry_run, delete=delete, force=force, console=console)
    )


@main.group()
def dev() -> None:
    """The local stack: Kubernetes API server, PostgreSQL, Cassandra (all on loopback)."""


_component = click.argument("components", nargs=-1, type=click.Choice(["kube", "postgres", "cassandra"]))


@dev.command("up")
@_component
def dev_up(components: tuple[str, ...]) -> None:
    """Start the stack (or the named components); idempotent."""
    from dbq.devstack import COMPONENTS, Stack, StackError

    stack = Stack()
    try:
        stack.up(components or COMPONENTS)
    except StackError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        sys.exit(1)
    _print_status(stack)
    console.print(f"\nPoint kubectl at it:  export KUBECONFIG={stack.kube.kubeconfig}")


@dev.command("down")
@_component
def dev_down(components: tuple[str, ...]) -> None:
    """Stop what `dbq dev up` started (by pid); data stays for the next `up`."""
    from dbq.devstack import COMPONENTS, Stack

    Stack().down(components or COMPONENTS)


@dev.command("status")
def dev_status() -> None:
    """Show where each component listens and whether it is ready."""
    from dbq.devstack import Stack

    stack = Stack()
    if not _print_status(stack):
        sys.exit(3)


def _print_status(stack: Stack) -> bool:
    table = Table("component", "ready", "endpoint")
    rows = stack.status()
    for name, ready, where in rows:
        table.add_row(name, "[green]yes[/green]" if ready else "[red]no[/red]", where)
    console.print(table)
    return all(ready for _, ready, _ in rows)


def _register_data_plane() -> None:
    from dbq.cli_data import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register_data_plane()


if __name__ == "__main__":
    main()
