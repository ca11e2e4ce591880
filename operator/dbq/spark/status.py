"""`dbq-queues`, `dbq-stats` and `dbq-archive`: the status of the Queues dbq manages, their
statistics history and their archived messages, as batch DataFrames.

All read the Kubernetes API with the job's credentials: the in-cluster service account in a
pod, else the kubeconfig (`KUBECONFIG`). `dbq-stats` and `dbq-archive` then read each queue's own
database with the Secret the Queue names, so those credentials need `get` on those Secrets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql.datasource import InputPartition

from dbq.client import AnyQueue, BrokerQueue, connect_resource
from dbq.contract import headers as header_codec
from dbq.errors import InvalidSpec
from dbq.kube import Kube, current_namespace
from dbq.resource import parse_spec
from dbq.spark.options import Options, Source, SourceReader

QUEUES_SCHEMA = (
    "namespace string, name string, backend string, design string, ready boolean, reason string,"
    " message string, generation long, observed_generation long, ready_changed_at timestamp,"
    " depth long, in_flight long, pushed long, popped long, acquired long, expired long,"
    " push_rate double, pop_rate double, oldest_message_age_seconds double, measured_at timestamp,"
    " last_cleanup timestamp, last_cleanup_result string,"
    " last_maintenance timestamp, last_maintenance_result string, last_maintenance_message string"
)
STATS_SCHEMA = (
    "namespace string, name string, backend string, design string, at timestamp,"
    " depth long, in_flight long, pushed long, popped long, acquired long, expired long,"
    " oldest_message_age_seconds double"
)
ARCHIVE_SCHEMA = (
    "namespace string, name string, backend string, design string, id string, attempts int,"
    " pushed_at timestamp, acked_at timestamp, body binary, headers map<string,string>"
)
SELECT_OPTIONS = {
    "kubeconfig": "path of a kubeconfig (default: the pod's service account, else KUBECONFIG)",
    "namespace": "the namespace to read (default: every namespace for dbq-queues, the current one for dbq-stats)",
    "labelSelector": "a Kubernetes label selector, such as team=shop",
}
USER_OPTION = {
    "user": "a QueueUser to read the queues as (its Secret dbq-user-USER; it needs monitor for dbq-stats,"
    " manage for dbq-archive), instead of each Queue's own Secret",
}

STATS_OPTIONS = {
    **SELECT_OPTIONS,
    **USER_OPTION,
    "queues": "comma-separated Queue names (default: every Queue of the namespace)",
    "since": "start of the range: ISO 8601 or a duration before now (default 24h)",
    "until": "end of the range, excluded: ISO 8601 or a duration before now (default now)",
    "partitions": "time slices read in parallel per queue (default 4)",
}


ARCHIVE_OPTIONS = {
    **SELECT_OPTIONS,
    **USER_OPTION,
    "queues": "comma-separated Queue names (default: every Queue of the namespace with spec.archive)",
    "since": "messages acked or popped at or after: ISO 8601 or a duration before now (default 24h)",
    "limit": "at most this many messages per queue, oldest first (default 100000)",
}


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def provisioned(item: dict[str, Any]) -> bool:
    conditions = (item.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Provisioned" and c.get("status") == "True" for c in conditions)


def queue_row(item: dict[str, Any]) -> tuple[Any, ...]:
    """One `dbq-queues` row from a Queue resource, in QUEUES_SCHEMA's order."""
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    stats = status.get("stats") or {}
    cleanup = status.get("cleanup") or {}
    maintenance = status.get("maintenance") or {}
    figures = ("depth", "inFlight", "pushed", "popped", "acquired", "expired")
    return (
        meta["namespace"], meta["name"], spec.get("backend"), spec.get("design"),
        ready.get("status") == "True", ready.get("reason"), ready.get("message"),
        meta.get("generation"), status.get("observedGeneration"),
        _time(ready.get("lastTransitionTime")),
        *(stats.get(k) for k in figures),
        stats.get("pushRate"), stats.get("popRate"), stats.get("oldestMessageAgeSeconds"),
        _time(stats.get("measuredAt")),
        _time(cleanup.get("lastRun")),
        json.dumps(cleanup["lastResult"], sort_keys=True) if "lastResult" in cleanup else None,
        _time(maintenance.get("lastRun")), maintenance.get("result"), maintenance.get("message"),
    )  # fmt: skip


class QueuesReader(SourceReader):
    def __init__(self, options: Options) -> None:
        self.kubeconfig = options.text("kubeconfig")
        self.namespace = options.text("namespace") or None
        self.selector = options.text("labelSelector")

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        for item in Kube.for_kubeconfig(self.kubeconfig).list_queues(self.namespace, self.selector):
            yield queue_row(item)


class QueuesSource(Source):
    """`spark.read.format("dbq-queues").load()`: one row per Queue resource the job's credentials
    can see, from its status (conditions, latest statistics, last cleanup and maintenance).

    Options: `namespace` (default: every namespace), `labelSelector`.
    """

    NAME = "dbq-queues"
    SCHEMA = QUEUES_SCHEMA
    OPTIONS = SELECT_OPTIONS
    READER = QueuesReader


class QueuePartition(InputPartition):
    """One queue, over [since, until)."""

    def __init__(self, resource: dict[str, Any], since: datetime, until: datetime) -> None:
        super().__init__((resource["metadata"]["namespace"], resource["metadata"]["name"]))
        self.resource, self.since, self.until = resource, since, until


class SelectedQueues(SourceReader):
    """A reader of queues chosen by the options namespace, queues or labelSelector, read from
    `since` on (default: the last 24 hours)."""

    def __init__(self, options: Options) -> None:
        self.now = datetime.now(UTC)
        self.kubeconfig = options.text("kubeconfig")
        self.namespace = options.text("namespace") or current_namespace()
        self.selector = options.text("labelSelector")
        self.user = options.text("user") or None
        self.queues = options.names("queues")
        self.since = options.time("since", self.now - timedelta(hours=24), self.now)

    def resources(self) -> list[dict[str, Any]]:
        """The Queues named, or those of the namespace (and selector)."""
        kube = Kube.for_kubeconfig(self.kubeconfig)
        if self.queues:
            return [kube.get_queue(self.namespace, name) for name in self.queues]
        return kube.list_queues(self.namespace, self.selector)

    def client(self, partition: InputPartition) -> AbstractContextManager[AnyQueue]:
        assert isinstance(partition, QueuePartition)
        meta = partition.resource["metadata"]
        return connect_resource(
            meta["name"],
            meta["namespace"],
            api_client=Kube.for_kubeconfig(self.kubeconfig).api_client,
            user=self.user,
        )


class StatsReader(SelectedQueues):
    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.until = options.time("until", self.now, self.now)
        self.slices = options.count("partitions", 4)
        if self.since >= self.until:
            raise InvalidSpec(
                f"dbq-stats: since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})"
            )

    def partitions(self) -> list[InputPartition]:
        resources = [r for r in self.resources() if provisioned(r)]  # the others have no history yet
        step = (self.until - self.since) / self.slices
        return [
            QueuePartition(resource, self.since + i * step, self.until if i == self.slices - 1 else self.since + (i + 1) * step)
            for resource in resources
            for i in range(self.slices)
        ]  # fmt: skip

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, QueuePartition):
            return  # no queue to read: Spark's one default partition when partitions() found none
        meta, spec = partition.resource["metadata"], parse_spec(partition.resource.get("spec") or {})
        with self.client(partition) as queue:
            samples = queue.history(partition.since, partition.until)
        for sample in samples:
            s = sample.stats
            yield (
                meta["namespace"], meta["name"], spec.backend, spec.design, sample.at,
                s.depth, s.in_flight, s.pushed, s.popped, s.acquired, s.expired, s.oldest_age_seconds,
            )  # fmt: skip


class ArchiveReader(SelectedQueues):
    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.limit = options.count("limit", 100_000)

    def partitions(self) -> list[InputPartition]:
        resources = self.resources()
        if self.queues:
            off = [r["metadata"]["name"] for r in resources if not archived(r)]
            if off:
                raise InvalidSpec(f"dbq-archive: {', '.join(off)} keep no archive: set spec.archive.enabled")
        return [QueuePartition(r, self.since, self.now) for r in resources if archived(r) and provisioned(r)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, QueuePartition):
            return  # no queue to read: Spark's one default partition when partitions() found none
        meta, spec = partition.resource["metadata"], parse_spec(partition.resource.get("spec") or {})
        with self.client(partition) as queue:
            if isinstance(queue, BrokerQueue):  # refused at admission: a Queue edited around it
                raise InvalidSpec(
                    f"dbq-archive: {meta['name']} is a Service Broker queue: it keeps no archive"
                )
            kept = queue.archived(partition.since, self.limit)
        for m in kept:
            yield (
                meta["namespace"], meta["name"], spec.backend, spec.design, str(m.id), m.attempts,
                datetime.fromtimestamp(m.pushed_at, UTC), datetime.fromtimestamp(m.acked_at, UTC), m.body,
                header_codec.as_text(m.headers),
            )  # fmt: skip


def archived(item: dict[str, Any]) -> bool:
    return bool(((item.get("spec") or {}).get("archive") or {}).get("enabled"))


class ArchiveSource(Source):
    """`spark.read.format("dbq-archive").load()`: the archived messages of queues with
    spec.archive (acked or popped, kept for the retention), read from each queue's own database
    with the Secret its Queue names; one row per message, oldest first per queue.

    Options: `namespace` (default: the current one), `queues` (comma-separated Queue names;
    default: every Queue of the namespace with spec.archive), `labelSelector`, `since` (ISO 8601,
    or a duration before now such as 24h; default the last 24 hours), `limit` (per queue;
    default 100000).
    """

    NAME = "dbq-archive"
    SCHEMA = ARCHIVE_SCHEMA
    OPTIONS = ARCHIVE_OPTIONS
    READER = ArchiveReader


class StatsSource(Source):
    """`spark.read.format("dbq-stats").load()`: the statistics history (`dbq_stats_history`) of
    queues, read from each queue's own database with the Secret its Queue names; one row per
    sample the operator recorded. Queues never provisioned (no history yet) are left out; a
    provisioned queue whose database does not answer fails the read.

    Options: `namespace` (default: the current one), `queues` (comma-separated Queue names;
    default: every Queue of the namespace), `labelSelector`, `since` and `until` (ISO 8601 times,
    or durations before now such as 24h; default the last 24 hours), `partitions` (time slices
    read in parallel per queue; default 4).
    """

    NAME = "dbq-stats"
    SCHEMA = STATS_SCHEMA
    OPTIONS = STATS_OPTIONS
    READER = StatsReader
