"""`dbq spark health`: the fleet-health Spark job (`dbq.spark.health`), run with a local or
configured SparkSession. Needs the `spark` extra."""

from __future__ import annotations

import os
import sys

import click


@click.group()
def spark() -> None:
    """Spark jobs over the queues dbq manages."""


@spark.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def health(args: tuple[str, ...]) -> None:
    """Backlog trend, time to drain, not Ready, depth and age past thresholds, per queue
    (`dbq spark health --help` lists the options)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need dbq and pyarrow
    try:
        from dbq.spark.health import run
    except ImportError as e:
        raise click.ClickException(
            f"{e}: install the spark extra, pip install 'dbq-operator[spark]'"
        ) from None
    sys.exit(run(list(args)))


COMMANDS = (spark,)
