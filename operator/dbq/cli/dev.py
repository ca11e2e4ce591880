"""`dbq dev up|down|status|ca`: the local stack (Kubernetes API server, PostgreSQL, Cassandra)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from rich.table import Table

from dbq.cli.output import console

if TYPE_CHECKING:
    from dbq.devstack import Stack


@click.group()
def dev() -> None:
    """The local stack: Kubernetes API server, PostgreSQL, Cassandra (all on loopback); on demand a
    three-node Cassandra (cassandra3), a single-node cluster that runs pods (cluster), Flux's
    controllers with a git server (flux) and KEDA's operator and metrics adapter (keda)."""


_component = click.argument(
    "components",
    nargs=-1,
    type=click.Choice(["kube", "postgres", "cassandra", "cassandra3", "cluster", "flux", "keda"]),
)


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
    from dbq.devstack import COMPONENTS, OPTIONAL, Stack

    Stack().down(components or COMPONENTS + OPTIONAL)


@dev.command("import-image")
@click.argument("images", nargs=-1, required=True)
def dev_import_image(images: tuple[str, ...]) -> None:
    """Copy images from buildah's store (stack/image.sh builds there) into the single-node
    cluster's containerd, where pods with `imagePullPolicy: Never` find them."""
    from dbq.devstack import Stack, StackError

    cluster = Stack().cluster
    try:
        if not cluster.ready():
            raise StackError("the single-node cluster is not running: start it with `dbq dev up cluster`")
        for image in images:
            cluster.import_image(image)
            console.print(f"imported {image}", highlight=False)
    except StackError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        sys.exit(1)


@dev.command("ca")
def dev_ca() -> None:
    """Print the certificate of the stack's own CA (PEM), which signed the certificates its
    PostgreSQL serves TLS with: what a Secret's `ca` key holds to verify them."""
    from dbq.devstack import Stack

    click.echo(Stack().postgres.tls.ca_pem(), nl=False)


@dev.command("status")
def dev_status() -> None:
    """Show where each component listens and whether it is ready."""
    from dbq.devstack import Stack

    stack = Stack()
    if not _print_status(stack):
        sys.exit(3)


def _print_status(stack: Stack) -> bool:
    """The table of components; whether every default one is ready (optional ones may be down)."""
    from dbq.devstack import OPTIONAL

    table = Table("component", "ready", "endpoint")
    rows = stack.status()
    for name, ready, where in rows:
        shown = "[green]yes[/green]" if ready else ("no (optional)" if name in OPTIONAL else "[red]no[/red]")
        table.add_row(name, shown, where)
    console.print(table)
    return all(ready for name, ready, _ in rows if name not in OPTIONAL)


COMMANDS = (dev,)
