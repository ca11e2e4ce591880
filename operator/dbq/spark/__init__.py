"""dbq on Spark, through pyspark's Python Data Source API (`pip install dbq-operator[spark]`).

    from dbq.spark import register
    register(spark)
    spark.read.format("dbq-queues").load()                       # the Queues and their status
    spark.read.format("dbq-stats").option("since", "24h").load()  # their statistics history
    spark.read.format("dbq-archive").option("since", "24h").load()  # their archived messages
    spark.read.format("dbq-topics").load()                       # the Topics, Subscriptions and counts
    spark.read.format("dbq").option("queue", "orders").load()       # peek at waiting messages
    spark.readStream.format("dbq").option("queue", "orders").load() # consume, at least once
    df.write.format("dbq").option("queue", "orders").mode("append").save()  # push rows' body

Each source documents its schema and options in its class docstring (`dbq.spark.status`,
`dbq.spark.topics`, `dbq.spark.queue_source`).
"""

from __future__ import annotations

from typing import Any

from dbq.spark.queue_source import QueueSource
from dbq.spark.status import ArchiveSource, QueuesSource, StatsSource
from dbq.spark.topics import TopicsSource

SOURCES = (QueuesSource, StatsSource, ArchiveSource, TopicsSource, QueueSource)


def register(spark: Any) -> None:
    """Register every dbq data source with the SparkSession `spark`."""
    for source in SOURCES:
        spark.dataSource.register(source)
