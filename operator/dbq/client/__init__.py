"""dbq's data plane: push, pop, acquire/ack and stats on queues the operator provisioned.

from dbq.client import connect
with connect("postgresql://app:secret@db:5432/shop", "orders") as q:
    q.push(b"hello")
    msg = q.acquire(timeout=5)
    ...
    msg.ack()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dbq.api.durations import seconds
from dbq.api.models import queue_name
from dbq.client.broker import BrokerMessage, BrokerQueue
from dbq.client.consume import ConsumeStats, consume
from dbq.client.rates import RateMeter
from dbq.client.ring import Message, Queue, RepairResult
from dbq.client.stats import ArchivedMessage, DeadLetter, HistorySample, QueueStats
from dbq.client.topic import Topic
from dbq.connection import ConnectionSettings, from_url
from dbq.contract.topics import TopicNames
from dbq.errors import (
    LeaseLost,
    MessageTooLarge,
    PermissionDenied,
    QueueError,
    QueueFull,
    QueueNotFound,
    QueueUnavailable,
)
from dbq.names import QueueNames, queue_identifier
from dbq.resource import SecretReader, parse_spec, settings_for

__all__ = [
    "AnyQueue",
    "AnyTopic",
    "ArchivedMessage",
    "BrokerMessage",
    "BrokerQueue",
    "ConsumeStats",
    "DeadLetter",
    "HistorySample",
    "LeaseLost",
    "Message",
    "MessageTooLarge",
    "PermissionDenied",
    "PipeMessage",
    "PipesQueue",
    "PipesRepair",
    "PipesStats",
    "PipesTopic",
    "Queue",
    "QueueError",
    "QueueFull",
    "QueueNotFound",
    "QueueStats",
    "QueueUnavailable",
    "RateMeter",
    "RepairResult",
    "Topic",
    "connect",
    "connect_resource",
    "connect_topic",
    "connect_topic_resource",
    "consume",
    "from_resource",
]

if TYPE_CHECKING:
    from dbq.client.pipes import PipeMessage, PipesQueue, PipesRepair, PipesStats, PipesTopic

    AnyQueue = Queue | PipesQueue | BrokerQueue
    AnyTopic = Topic | PipesTopic

# Cassandra's client loads with its driver, which the lean install leaves out (the `cassandra`
# extra): `dbq.client.PipesQueue` and the others import it when first named.
_PIPES_NAMES = ("PipeMessage", "PipesQueue", "PipesRepair", "PipesStats", "PipesTopic")


def __getattr__(name: str) -> Any:
    if name in _PIPES_NAMES:
        from dbq.client import pipes

        return getattr(pipes, name)
    if name == "AnyQueue":
        from dbq.client.pipes import PipesQueue

        return Queue | PipesQueue | BrokerQueue
    if name == "AnyTopic":
        from dbq.client.pipes import PipesTopic

        return Topic | PipesTopic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_SCHEMA = "dbq"
PIPES_OPTIONS = ("visibility", "push_timeout", "pop_timeout", "ttl", "smart_batching")
PIPES_TOPIC_OPTIONS = ("ttl", "smart_batching", "rules_refresh")


def connect(
    url: str, queue: str, *, schema: str | None = None, design: str | None = None, **options: Any
) -> AnyQueue:
    """A client for `queue` (its name, or its Queue resource's metadata.name) at `url`: postgresql://user:pass@host:port/db or mssql://... (a ring;
    `?driver=...` picks the ODBC driver; `design="servicebroker"` for a Service Broker queue), or
    cassandra://[user:pass@]host1,host2:9042[?dc=...] (pipes; `schema` is the keyspace). Options:
    visibility, push_timeout, pop_timeout, ttl (seconds), smart_batching (rings and pipes, on by
    default); for rings also pool_size, hole_grace and notify (PostgreSQL: woken by LISTEN/NOTIFY
    instead of polling)."""
    return _open(from_url(url), queue, schema or DEFAULT_SCHEMA, options, design)


def from_resource(resource: dict[str, Any], secret_data: dict[str, Any], **options: Any) -> AnyQueue:
    """A client for a Queue resource (as the API returns it) and its Secret's `data`.

    The resource's spec.timeouts become the defaults (visibility, pushWait, popWait, messageTTL);
    `options` override them."""
    return _from_resource(resource, lambda _namespace, _name: secret_data, options)


def connect_resource(
    name: str, namespace: str = "default", *, api_client: Any = None, user: str | None = None, **options: Any
) -> AnyQueue:
    """A client for the Queue resource `namespace/name`, read from the Kubernetes API (with the
    in-cluster or kubeconfig credentials unless `api_client` is given) with its Secret; with
    `user`, as that QueueUser (its login, from the Secret the operator wrote: dbq-user-USER),
    holding only the rights the QueueUser gives."""
    from dbq import kube  # the kubernetes client: the `kube` extra

    api = kube.Kube(api_client)
    return _from_resource(api.get_queue(namespace, name), api.read_secret, options, user)


def _from_resource(
    resource: dict[str, Any], read_secret: SecretReader, options: dict[str, Any], user: str | None = None
) -> AnyQueue:
    spec = parse_spec(resource.get("spec") or {})
    t = spec.timeouts
    defaults: dict[str, Any] = {
        "visibility": seconds(t.visibility),
        "push_timeout": seconds(t.push_wait),
        "pop_timeout": seconds(t.pop_wait),
        "ttl": seconds(t.message_ttl),
    }
    metadata = resource["metadata"]
    settings = settings_for(spec, metadata.get("namespace") or "default", read_secret, user)
    return _open(
        settings,
        queue_name(metadata["name"], spec),
        spec.connection.schema_,
        defaults | options,
        str(spec.design),
    )


def _open(
    settings: ConnectionSettings, queue: str, schema: str, options: dict[str, Any], design: str | None = None
) -> AnyQueue:
    names = QueueNames(schema=schema, queue=queue_identifier(queue))
    if design == "servicebroker":
        return BrokerQueue(settings, names, **options)
    if settings.backend == "cassandra":
        from dbq.client.pipes import PipesQueue

        return PipesQueue(settings, names, **{k: v for k, v in options.items() if k in PIPES_OPTIONS})
    return Queue(settings, names, **options)


def connect_topic(url: str, topic: str, *, schema: str | None = None, **options: Any) -> AnyTopic:
    """A publisher of `topic` (its name, or its Topic resource's metadata.name with '-' as '_') at
    `url`: postgresql://... (`Topic`) or cassandra://... (`PipesTopic`, `schema` naming the
    keyspace). Options: ttl (seconds, the copies' default), smart_batching; on PostgreSQL also
    timeout (seconds a publish is made again while the subscriptions change) and pool_size; on
    Cassandra rules_refresh (seconds a publish may route by rules an earlier one read; 0: read
    them at every publish)."""
    return _open_topic(from_url(url), TopicNames(schema or DEFAULT_SCHEMA, queue_identifier(topic)), options)


def _open_topic(settings: ConnectionSettings, names: TopicNames, options: dict[str, Any]) -> AnyTopic:
    if settings.backend == "cassandra":
        from dbq.client.pipes import PipesTopic

        return PipesTopic(settings, names, **{k: v for k, v in options.items() if k in PIPES_TOPIC_OPTIONS})
    return Topic(settings, names, **options)


def connect_topic_resource(
    name: str, namespace: str = "default", *, api_client: Any = None, user: str | None = None, **options: Any
) -> AnyTopic:
    """A publisher of the Topic resource `namespace/name`, read from the Kubernetes API with its
    Secret (in-cluster or kubeconfig credentials unless `api_client` is given); with `user`, as
    that QueueUser (its Secret dbq-user-USER)."""
    from dbq import kube  # the kubernetes client: the `kube` extra
    from dbq.api.topics import TOPIC_PLURAL, TopicSpec, topic_name
    from dbq.errors import InvalidSpec, TopicNotFound

    api = kube.Kube(api_client)
    found = api.find(TOPIC_PLURAL, namespace, name)
    if found is None:
        raise TopicNotFound(
            f"no Topic {name} in namespace {namespace}: `kubectl get topics -A` lists them;"
            " pass -n NAMESPACE, or --url to name the database"
        )
    try:
        spec = TopicSpec.model_validate(found.get("spec") or {})
        names = TopicNames(spec.connection.schema_, topic_name(name, spec))
    except ValueError as e:
        raise InvalidSpec(f"Topic {namespace}/{name}: {e}") from None
    return _open_topic(settings_for(spec, namespace, api.read_secret, user), names, options)
