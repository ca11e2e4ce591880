"""The `dbq` command: one module per command group.

- `operator`: `dbq run` (the operator) and `dbq crd`;
- `apply`: `dbq apply`, the operator's reconcile straight against a database;
- `data`: `dbq push`, `dbq pop`, `dbq stats` on a queue;
- `dev`: `dbq dev up|down|status`, the local stack;
- `spark`: `dbq spark health`, the fleet-health Spark job.
"""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """dbq: database-backed message queues, managed declaratively."""


def _register() -> None:
    from dbq.cli import apply, data, dev, operator, spark

    for group in (operator, apply, data, dev, spark):
        for command in group.COMMANDS:
            main.add_command(command)


_register()
