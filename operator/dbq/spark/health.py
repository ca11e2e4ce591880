"""The fleet-health job: reads `dbq-queues` and `dbq-stats`, and computes per queue over a window
of its statistics history:

- backlog trend: the slope of depth over time (messages per second, least squares);
- push and take rates (taken = popped + acquired), and their imbalance;
- time to drain at those rates (depth / (take rate - push rate); none when it does not drain);
- not Ready, and for how long; depth and oldest-message age past their thresholds.

It writes the report as Parquet partitioned by date, and prints a summary table.

    dbq spark health --namespace shop --window 1h --output /data/dbq-health
    spark-submit "$(python -c 'import dbq.spark.health as h; print(h.__file__)')" --namespace shop ...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dbq.api.durations import parse_duration
from dbq.spark import register


@dataclass(frozen=True)
class Thresholds:
    depth: int = 10_000  # messages waiting
    oldest_age_s: float = 900.0  # age of the oldest waiting message
    imbalance: float = 1.2  # push rate over take rate that counts as falling behind


def health(
    spark: SparkSession,
    namespaces: Sequence[str],
    window: str = "1h",
    thresholds: Thresholds = Thresholds(),
    kubeconfig: str = "",
    user: str = "",
) -> DataFrame:
    """One row per Queue of `namespaces` with the figures and flags the module docstring lists;
    `user`: a QueueUser with monitor on the queues to read their history as (the same name in
    each namespace), instead of each Queue's own Secret."""
    register(spark)
    now = datetime.now(UTC)
    since = now - parse_duration(window)

    def read(source: str, **options: str) -> DataFrame:
        reader = spark.read.format(source).option("kubeconfig", kubeconfig)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    queues = read("dbq-queues").filter(F.col("namespace").isin(list(namespaces)))
    history = None
    for ns in namespaces:
        as_user = {"user": user} if user else {}
        part = read("dbq-stats", namespace=ns, since=since.isoformat(), until=now.isoformat(), **as_user)
        history = part if history is None else history.unionByName(part)
    assert history is not None, "health needs at least one namespace"
    t = F.col("at").cast("double")
    taken = F.col("popped") + F.col("acquired")
    span = F.max(t) - F.min(t)
    trends = history.groupBy("namespace", "name").agg(
        F.count("*").alias("samples"),
        F.regr_slope(F.col("depth").cast("double"), t).alias("depth_slope_per_s"),
        ((F.max("pushed") - F.min("pushed")) / span).alias("push_rate"),
        ((F.max(taken) - F.min(taken)) / span).alias("take_rate"),
        F.max_by("depth", "at").alias("last_depth"),
        F.max_by("oldest_message_age_seconds", "at").alias("last_oldest_age_s"),
    )
    drains = F.col("take_rate") > F.col("push_rate")
    report = (
        queues.drop("push_rate", "pop_rate")  # the window's rates, from the history, replace the status's
        .join(trends, ["namespace", "name"], "left")
        .withColumn("depth_now", F.coalesce("last_depth", "depth"))
        .withColumn("oldest_age_s", F.coalesce("last_oldest_age_s", "oldest_message_age_seconds"))
        .withColumn(
            "time_to_drain_s",
            F.when(drains, F.col("depth_now") / (F.col("take_rate") - F.col("push_rate"))),
        )
        .withColumn("not_ready", ~F.col("ready"))
        .withColumn(
            "not_ready_for_s",
            F.when(~F.col("ready"), F.lit(now.timestamp()) - F.col("ready_changed_at").cast("double")),
        )
        .withColumn("growing", F.coalesce(F.col("depth_slope_per_s") > 0, F.lit(False)) & ~drains)
        .withColumn(
            "falling_behind",
            F.coalesce(F.col("push_rate") > F.col("take_rate") * thresholds.imbalance, F.lit(False)),
        )
        .withColumn("past_depth", F.coalesce(F.col("depth_now") > thresholds.depth, F.lit(False)))
        .withColumn("past_age", F.coalesce(F.col("oldest_age_s") > thresholds.oldest_age_s, F.lit(False)))
        .withColumn("checked_at", F.lit(now))
        .withColumn("date", F.lit(now.date().isoformat()))
    )
    return report.select(
        "date", "checked_at", "namespace", "name", "backend", "design", "ready", "reason",
        "not_ready", "not_ready_for_s", "samples", "depth_now", "oldest_age_s", "depth_slope_per_s",
        "push_rate", "take_rate", "time_to_drain_s", "growing", "falling_behind", "past_depth", "past_age",
    )  # fmt: skip


FLAGS = ("not_ready", "growing", "falling_behind", "past_depth", "past_age")


def summary(rows: Sequence[Any]) -> Any:
    """A rich table of the report, flagged queues first."""
    from rich.table import Table

    table = Table(title=f"dbq fleet health: {len(rows)} queues")
    for column in ("queue", "ready", "depth", "oldest", "trend/s", "push/s", "take/s", "drains in", "flags"):
        table.add_column(column, justify="left" if column in ("queue", "flags") else "right")

    def num(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:,.1f}{unit}"

    for row in sorted(rows, key=lambda r: (not any(r[f] for f in FLAGS), r["namespace"], r["name"])):
        flags = ", ".join(f for f in FLAGS if row[f])
        table.add_row(
            f"{row['namespace']}/{row['name']}", "yes" if row["ready"] else f"no ({row['reason']})",
            num(row["depth_now"]), num(row["oldest_age_s"], "s"), num(row["depth_slope_per_s"]),
            num(row["push_rate"]), num(row["take_rate"]), num(row["time_to_drain_s"], "s"),
            f"[red]{flags}[/red]" if flags else "",
        )  # fmt: skip
    return table


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbq spark health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", "-n", action="append", required=True, help="repeat for several")
    parser.add_argument("--window", default="1h", help="statistics history to read, such as 1h or 30m")
    parser.add_argument("--output", help="Parquet directory, partitioned by date (default: none)")
    parser.add_argument("--depth-threshold", type=int, default=Thresholds.depth)
    parser.add_argument("--age-threshold", type=float, default=Thresholds.oldest_age_s, help="seconds")
    parser.add_argument("--imbalance", type=float, default=Thresholds.imbalance)
    parser.add_argument("--kubeconfig", default="", help="default: in-cluster, else KUBECONFIG")
    parser.add_argument(
        "--user", default="", help="a QueueUser with monitor on the queues (default: their Secrets)"
    )
    args = parser.parse_args(argv)
    from rich.console import Console

    spark = SparkSession.builder.appName("dbq-fleet-health").getOrCreate()
    thresholds = Thresholds(args.depth_threshold, args.age_threshold, args.imbalance)
    report = health(spark, args.namespace, args.window, thresholds, args.kubeconfig, args.user).cache()
    if args.output:
        report.write.mode("append").partitionBy("date").parquet(args.output)
    Console().print(summary(report.collect()))
    return 0


if __name__ == "__main__":
    sys.exit(run())
