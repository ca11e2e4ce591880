"""Spark jobs the tests run as processes of their own (a driver to kill, or a local master that
retries failed tasks): `consume` streams a queue into Parquet, `write` pushes a DataFrame.

python -m tests.spark_jobs consume --kubeconfig K --namespace N --queue Q --sink DIR ...
python -m tests.spark_jobs write --kubeconfig K --namespace N --queue Q --rows 100000 --fail-once FILE
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from tests.local import local_spark


def session(master: str) -> Any:
    from dbq.spark import register

    spark = local_spark(master, "dbq-test-job", shuffle_partitions=2)
    register(spark)
    return spark


def consume(args: argparse.Namespace) -> None:
    """Stream the queue into Parquet; stop once no message came for `idle_exit` seconds (a
    batch still running counts as a message coming: under load the first takes a while), and,
    with `--after FILE`, only once that file exists (the feeder is done)."""
    fed = Path(args.after) if args.after else None
    spark = session("local[2]")
    stream = (
        spark.readStream.format("dbq")
        .option("kubeconfig", args.kubeconfig)
        .option("namespace", args.namespace)
        .option("queue", args.queue)
        .option("maxMessagesPerTrigger", str(args.per_trigger))
        .option("partitions", "2")
        .load()
    )
    query = (
        stream.writeStream.format("parquet")
        .option("path", args.sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    last_batch, last_data = -1, time.monotonic()
    while query.isActive:
        time.sleep(0.2)
        if query.status["isDataAvailable"] or (fed is not None and not fed.exists()):
            last_data = time.monotonic()  # a batch with data is planned or running, or more is coming
        progress = query.lastProgress
        if progress is None or progress["batchId"] == last_batch:
            if time.monotonic() - last_data > args.idle_exit:
                break
            continue
        last_batch = progress["batchId"]
        if progress["numInputRows"]:
            last_data = time.monotonic()
        print(f"batch {last_batch} rows {progress['numInputRows']}", flush=True)
    query.stop()
    spark.stop()


def write(args: argparse.Namespace) -> None:
    """Push `rows` bodies over `partitions` tasks; the first attempt of partition 1 fails after
    half its rows (once: a marker file remembers), and Spark retries it."""
    spark = session("local[2,4]")  # four attempts per task
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    marker = Path(args.fail_once)

    @F.udf("binary")
    def body(n: int) -> bytes:
        context = TaskContext.get()
        if context is not None and context.partitionId() == 1 and n % 1000 == 500 and not marker.exists():
            marker.write_text(f"failed at row {n}")
            raise RuntimeError("injected task failure")
        return b"w%d" % n

    df = spark.range(args.rows, numPartitions=args.partitions).select(body("id").alias("body"))
    (
        df.write.format("dbq")
        .option("kubeconfig", args.kubeconfig)
        .option("namespace", args.namespace)
        .option("queue", args.queue)
        .mode("append")
        .save()
    )
    spark.stop()
    print("written", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("job", choices=["consume", "write"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--sink")
    parser.add_argument("--checkpoint")
    parser.add_argument("--per-trigger", type=int, default=10_000)
    parser.add_argument("--idle-exit", type=float, default=20.0)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--fail-once")
    parser.add_argument("--after", help="consume: not idle until this file exists")
    args = parser.parse_args()
    consume(args) if args.job == "consume" else write(args)


if __name__ == "__main__":
    main()
