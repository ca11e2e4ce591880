"""The `dbq` command: one module per command group.

- `operator`: `dbq run` (the operator) and `dbq crd`;
- `apply`: `dbq apply`, the operator's reconcile straight against a database;
- `data`: `dbq push`, `dbq pop`, `dbq stats` on a queue;
- `publish`: `dbq publish` to a topic;
- `access`: `dbq access install-sql`, what a DBA runs for the operator's login;
- `pgmq`: `dbq pgmq drain`, a real PGMQ queue's messages moved into a dbq queue;
- `dev`: `dbq dev up|down|status`, the local stack;
- `spark`: `dbq spark health`, the fleet-health Spark job.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# The lean install (`pip install dbq-operator`) is the client: push, pop, stats, consume. What
# else a command needs comes with an extra; a module of one missing names the extra to install.
EXTRA_OF_MODULE = {
    "kopf": "operator",
    "prometheus_client": "operator",
    "yaml": "operator",
    "kubernetes": "kube",
    "cassandra": "cassandra",
    "pyspark": "spark",
    "pyarrow": "spark",
}
EXTRA_OF_COMMAND = {
    "run": "operator",
    "crd": "operator",
    "apply": "operator",
    "dev": "operator",
    "spark": "spark",
}


def _needs(missing: str) -> click.ClickException:
    extra = EXTRA_OF_MODULE[missing]
    return click.ClickException(
        f"this needs {missing}, which dbq's lean install leaves out: pip install 'dbq-operator[{extra}]'"
    )


class _Main(click.Group):
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in EXTRA_OF_COMMAND:
            extra = EXTRA_OF_COMMAND[cmd_name]
            raise click.ClickException(
                f"dbq {cmd_name} needs the {extra} extra: pip install 'dbq-operator[{extra}]'"
            )
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:
            top = (e.name or "").partition(".")[0]
            if top not in EXTRA_OF_MODULE:
                raise
            raise _needs(top) from None


@click.group(cls=_Main)
def main() -> None:
    """dbq: database-backed message queues, managed declaratively."""


def _register() -> None:
    for module in ("operator", "apply", "data", "publish", "access", "pgmq", "dev", "spark"):
        try:
            group = importlib.import_module(f"dbq.cli.{module}")
        except ModuleNotFoundError as e:
            if (e.name or "").partition(".")[0] not in EXTRA_OF_MODULE:
                raise
            continue  # its commands answer with the extra they need (_Main.get_command)
        for command in group.COMMANDS:
            main.add_command(command)


_register()
