"""`dbq-topics`: the Topics dbq manages and their Subscriptions, from their status, as a batch
DataFrame. It reads the Kubernetes API only (no database), with the job's credentials: the
in-cluster service account in a pod, else the kubeconfig (`KUBECONFIG`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import InputPartition

from dbq.api.topics import SUBSCRIPTION_PLURAL, TOPIC_PLURAL
from dbq.kube import Kube
from dbq.spark.options import Options, Source, SourceReader

TOPICS_SCHEMA = (
    "namespace string, topic string, backend string, ready boolean, reason string, message string,"
    " rules_version long, published long, unrouted long, measured_at timestamp,"
    " subscription string, queue string, on_full string, subscription_ready boolean,"
    " subscription_reason string, routed long, dropped long"
)
TOPICS_OPTIONS = {
    "kubeconfig": "path of a kubeconfig (default: the pod's service account, else KUBECONFIG)",
    "namespace": "the namespace to read (default: every namespace)",
}

Resource = Mapping[str, Any]


def _ready(resource: Resource | None) -> dict[str, Any]:
    conditions = ((resource or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def topic_rows(topics: Sequence[Resource], subscriptions: Sequence[Resource]) -> Iterator[tuple[Any, ...]]:
    """One row per Subscription with its Topic's figures (its topic's columns null when that Topic
    does not exist), and one row for each Topic without Subscriptions; in TOPICS_SCHEMA's order."""
    by_topic: dict[tuple[str, str], list[Resource]] = {}
    for s in subscriptions:
        key = (s["metadata"]["namespace"], str((s.get("spec") or {}).get("topic")))
        by_topic.setdefault(key, []).append(s)
    named = {(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in topics}
    for key in sorted(set(named) | set(by_topic)):
        topic = named.get(key)
        status = (topic or {}).get("status") or {}
        ready = _ready(topic)
        head = (
            key[0], key[1], ((topic or {}).get("spec") or {}).get("backend"),
            ready.get("status") == "True" if topic else None, ready.get("reason"), ready.get("message"),
            status.get("rulesVersion"), status.get("published"), status.get("unrouted"),
            _time(status.get("measuredAt")),
        )  # fmt: skip
        subs = sorted(by_topic.get(key, []), key=lambda s: s["metadata"]["name"])
        if not subs:
            yield (*head, None, None, None, None, None, None, None)
        for s in subs:
            spec, own, sub_ready = s.get("spec") or {}, s.get("status") or {}, _ready(s)
            yield (
                *head, s["metadata"]["name"], spec.get("queue"), spec.get("onFull", "Reject"),
                sub_ready.get("status") == "True", sub_ready.get("reason"), own.get("routed"), own.get("dropped"),
            )  # fmt: skip


class TopicsReader(SourceReader):
    def __init__(self, options: Options) -> None:
        self.kubeconfig = options.text("kubeconfig")
        self.namespace = options.text("namespace") or None

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        kube = Kube.for_kubeconfig(self.kubeconfig)
        topics = kube.list_resources(TOPIC_PLURAL, self.namespace)
        subscriptions = kube.list_resources(SUBSCRIPTION_PLURAL, self.namespace)
        yield from topic_rows(topics, subscriptions)


class TopicsSource(Source):
    """`spark.read.format("dbq-topics").load()`: the Topics and Subscriptions the job's credentials
    can see, from their status: one row per Subscription with its Topic's readiness and counts
    (published, unrouted) beside its own (routed, dropped), and one row for a Topic without
    Subscriptions.

    Options: `namespace` (default: every namespace).
    """

    NAME = "dbq-topics"
    SCHEMA = TOPICS_SCHEMA
    OPTIONS = TOPICS_OPTIONS
    READER = TopicsReader
