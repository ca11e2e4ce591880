"""`dbq`: a queue itself as a DataFrame (batch drain, every design).

`spark.read.format("dbq").option("queue", "orders").option("limit", "10000").load()` takes at
most `limit` messages off the Queue resource `orders`, split over `partitions` tasks, each one
consumer popping in batches of `batch`.

Delivery guarantee of a batch drain: at most once. A message is removed from the queue when a
task pops it (a batch read has no later point at which Spark confirms the output is durable), so
if a task fails after popping, the messages it had popped are lost; Spark's retry pops other
ones. Use it to empty a queue into a table where that is acceptable; the streaming read, which
removes messages only when Spark commits a micro-batch, is the at-least-once way (not built yet).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import InputPartition

from dbq.client import connect_resource
from dbq.errors import InvalidSpec
from dbq.kube import Kube, current_namespace
from dbq.spark.options import Options, Source, SourceReader

QUEUE_SCHEMA = "namespace string, queue string, id string, body binary, attempts int"
QUEUE_OPTIONS = {
    "queue": "the Queue resource's name (required)",
    "namespace": "its namespace (default: the current one)",
    "kubeconfig": "path of a kubeconfig (default: the pod's service account, else KUBECONFIG)",
    "mode": "drain: take messages off the queue (at most once); the only batch mode",
    "limit": "at most this many messages in all (required for drain)",
    "partitions": "tasks that pop at once, each one consumer (default 2)",
    "batch": "messages per pop_many call (default 500)",
}


class DrainReader(SourceReader):
    def __init__(self, options: Options) -> None:
        self.queue = options.text("queue")
        if not self.queue:
            raise InvalidSpec('dbq: option queue is required: .option("queue", "<Queue resource name>")')
        mode = options.text("mode", "drain")
        if mode != "drain":
            raise InvalidSpec(f"dbq: option mode={mode!r}: a batch read supports mode=drain only")
        if "limit" not in options.values:
            raise InvalidSpec('dbq: option limit is required for mode=drain: .option("limit", "10000")')
        self.limit = options.count("limit", 0)
        self.tasks = options.count("partitions", 2)
        self.batch = options.count("batch", 500)
        self.namespace = options.text("namespace") or current_namespace()
        self.kubeconfig = options.text("kubeconfig")

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.limit, self.tasks)
        return [InputPartition(share + (1 if i < extra else 0)) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        wanted: int = partition.value
        api = Kube.for_kubeconfig(self.kubeconfig).api_client
        with connect_resource(self.queue, self.namespace, api_client=api) as queue:
            while wanted > 0:
                messages = queue.pop_many(min(self.batch, wanted), timeout=1.0)
                if not messages:
                    return  # the queue stayed empty for a second
                wanted -= len(messages)
                for m in messages:
                    yield self.namespace, self.queue, str(m.id), m.body, m.attempts


class QueueSource(Source):
    """`spark.read.format("dbq")`: see the module docstring for the options and the guarantee."""

    NAME = "dbq"
    SCHEMA = QUEUE_SCHEMA
    OPTIONS = QUEUE_OPTIONS
    READER = DrainReader
