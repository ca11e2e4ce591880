"""Consuming a ring queue (PostgreSQL) from Spark, against the plain client in the same run.

Three ways to take the same backlog of messages off the queue, at the same parallelism N:
1. baseline: N threads of the client calling pop_many(batch);
(each after a warm-up Spark job: a session's first job costs about 12 s here, timed in none)
2. Spark batch drain (`mode=drain`, N partitions) into the noop sink;
3. Spark streaming read (N tasks a micro-batch) into the noop sink, until all is processed:
   from the query's start, and from its second micro-batch on (a running stream's rate).
Then the latency of the stream from push to sink: a pusher sends a steady rate of messages whose
body carries their push time, and the sink (foreachBatch, on the driver) notes when each arrives.

    ~/.cache/dbq/venv/bin/python -m bench.spark_consume --messages 300000 --parallelism 2
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from dbq.client import connect
from dbq.devstack import Stack
from tests.local import KubeHandle, PgDatabase, kube_handle, local_spark, scratch_database
from tests.manifests import queue
from tests.operator_harness import Operator, operator_namespace

BODY = 100  # bytes a message


def push_backlog(q: Any, n: int) -> None:
    filler = b"x" * (BODY - 8)
    for start in range(0, n, 1000):
        q.push_many([struct.pack(">q", i) + filler for i in range(start, min(n, start + 1000))], timeout=60)


def pop_many_rate(q: Any, n: int, threads: int, batch: int) -> float:
    taken, lock = [0], threading.Lock()

    def consume() -> None:
        while True:
            with lock:
                if taken[0] >= n:
                    return
            got = len(q.pop_many(batch, timeout=1.0))
            with lock:
                taken[0] += got
            if not got:
                return

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(consume) for _ in range(threads)]:
            f.result()
    elapsed = time.perf_counter() - started
    assert taken[0] == n, taken
    return n / elapsed


def steady_rate(progress: list[dict[str, Any]]) -> float:
    """Messages/s of a running stream: the micro-batches after the first, from the start of the
    second to the end of the last (the query's start and its first batch, which stages its
    messages before Spark runs it, are left out)."""
    rest = progress[1:]
    assert rest, "only one micro-batch: push more messages than maxMessagesPerTrigger"
    start = datetime.fromisoformat(rest[0]["timestamp"]).timestamp()
    end = (
        datetime.fromisoformat(rest[-1]["timestamp"]).timestamp()
        + rest[-1]["durationMs"]["triggerExecution"] / 1000
    )
    return sum(p["numInputRows"] for p in rest) / (end - start)


def batch_times(progress: list[dict[str, Any]]) -> str:
    """Where a micro-batch's time goes, in ms, averaged over the batches after the first."""
    rest = progress[1:]
    parts = {
        "in all": ["triggerExecution"],
        "planning on the driver (latestOffset)": ["latestOffset"],
        "tasks (addBatch)": ["addBatch"],
        "offset and commit logs": ["walCommit", "commitOffsets"],
    }
    return ", ".join(
        f"{label} {statistics.mean(sum(p['durationMs'].get(k, 0) for k in keys) for p in rest):.0f}"
        for label, keys in parts.items()
    )


def spark_session(parallelism: int) -> Any:
    from dbq.spark import register

    spark = local_spark(f"local[{parallelism}]", "dbq-bench", shuffle_partitions=parallelism)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def measure(
    kube: KubeHandle, postgres: PgDatabase, opts: argparse.Namespace
) -> tuple[dict[str, float], list[str], list[float], int]:
    """The rates, notes on the streaming batches, and the latency samples, on a Queue the operator provisions in `postgres`."""
    n, par = opts.messages, opts.parallelism
    cluster = operator_namespace(kube, postgres, "dbq-bench-spark")
    cluster.create(queue("bench-q", ring={"size": 524288, "messageBytes": 128}, timeouts={"popWait": "0s"}))
    work = Path(f"/tmp/dbq-bench-spark-{secrets.token_hex(3)}")
    work.mkdir()
    operator = Operator(kube, cluster.ns, work / "operator.log")
    operator.start()
    results: dict[str, float] = {}
    notes: list[str] = []
    try:
        cluster.wait_condition("bench-q", "Ready", "True", timeout=120)
        q = connect(postgres.url, "bench_q", schema="shopq", pop_timeout=0)
        spark = spark_session(par)
        source = lambda reader: (  # noqa: E731
            reader.format("dbq").option("kubeconfig", kube.kubeconfig).option("namespace", cluster.ns)
            .option("queue", "bench-q").option("partitions", str(par)).option("batch", str(opts.batch))
        )  # fmt: skip

        # Warm up: the first Spark job of a session starts the JVM's code paths and the Python
        # workers (about 12 s here); the client's baseline is timed warm too.
        push_backlog(q, 1000)
        source(spark.read).option("mode", "drain").option("limit", "1000").load().write.format("noop").mode(
            "overwrite"
        ).save()

        push_backlog(q, n)
        results["client pop_many"] = pop_many_rate(q, n, par, opts.batch)

        push_backlog(q, n)
        started = time.perf_counter()
        source(spark.read).option("mode", "drain").option("limit", str(n)).load().write.format("noop").mode(
            "overwrite"
        ).save()
        results["Spark batch drain"] = n / (time.perf_counter() - started)
        assert q.stats().depth == 0

        for per_trigger in opts.per_trigger:
            push_backlog(q, n)
            stream = source(spark.readStream).option("maxMessagesPerTrigger", str(per_trigger)).load()
            started = time.perf_counter()
            query = (
                stream.writeStream.format("noop")
                .option("checkpointLocation", str(work / f"throughput-{per_trigger}"))
                .trigger(processingTime="0 seconds")
                .start()
            )
            while q.stats().depth > 0:
                time.sleep(0.05)
            query.processAllAvailable()
            label = f"Spark streaming, {per_trigger // 1000}k a batch"
            results[label] = n / (time.perf_counter() - started)
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            query.stop()
            assert sum(p["numInputRows"] for p in progress) == n, progress
            results[label + ", after its first"] = steady_rate(progress)
            notes.append(f"{label}, ms a batch after the first: {batch_times(progress)}")

        latencies: list[float] = []

        def note(batch: Any, _batch_id: int) -> None:
            now = time.time()
            latencies.extend(now - struct.unpack(">d", bytes(r["body"])[:8])[0] for r in batch.collect())

        query = (
            source(spark.readStream).load().writeStream.foreachBatch(note)
            .option("checkpointLocation", str(work / "latency")).trigger(processingTime="0 seconds").start()
        )  # fmt: skip
        time.sleep(5)  # the query is up
        sent = int(opts.latency_rate * opts.latency_seconds)
        start = time.monotonic()
        for i in range(sent):
            wait = start + i / opts.latency_rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            q.push(struct.pack(">d", time.time()) + b"x" * (BODY - 8))
        deadline = time.monotonic() + 60
        while len(latencies) < sent and time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()
        q.close()
        spark.stop()
    finally:
        cluster.force_delete_all(120)
        operator.stop()
    return results, notes, latencies, sent


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300_000, help="at most the ring's 524288")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument(
        "--per-trigger",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[20_000, 50_000, 100_000],
        help="maxMessagesPerTrigger of each streaming run, comma-separated",
    )
    parser.add_argument(
        "--latency-rate", type=int, default=1_000, help="messages/s pushed for the latency run"
    )
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    opts = parser.parse_args()
    n, par = opts.messages, opts.parallelism

    stack = Stack()
    stack.up(("kube", "postgres"))
    kube = kube_handle(stack)
    with scratch_database(stack, "dbq_bench") as postgres:
        results, notes, latencies, sent = measure(kube, postgres, opts)

    base = results["client pop_many"]
    print(f"ring on PostgreSQL, {n} messages of {BODY} bytes, parallelism {par}, batch {opts.batch}")
    for label, rate in results.items():
        print(f"  {label:45s} {rate:9.0f} msg/s   {rate / base:5.2f} x client pop_many")
    print(
        "  (streaming: each first figure includes the query's start and its first batch, staged"
        " before Spark runs it; target >= 0.50 x client pop_many)"
    )
    for note in notes:
        print(f"  {note}")
    assert len(latencies) == sent, f"{len(latencies)} of {sent} arrived"
    ms = sorted(v * 1000 for v in latencies)
    print(
        f"streaming latency, push to sink, {sent} messages at {opts.latency_rate}/s:"
        f" p50 {statistics.median(ms):.0f} ms   p95 {ms[int(len(ms) * 0.95)]:.0f} ms   max {ms[-1]:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
