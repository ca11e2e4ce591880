"""dbq's data plane: push, pop, acquire/ack and stats on queues the operator provisioned.

from dbq.client import connect
with connect("postgresql://app:secret@db:5432/shop", "orders") as q:
    q.push(b"hello")
    msg = q.acquire(timeout=5)
    ...
    msg.ack()
"""

from __future__ import annotations

from typing import Any, cast

from dbq.api.durations import seconds
from dbq.api.models import GROUP, PLURAL, VERSION, QueueSpec, queue_name
from dbq.backends.names import QueueNames
from dbq.client.errors import (
    LeaseLost,
    MessageTooLarge,
    QueueError,
    QueueFull,
    QueueNotFound,
    QueueUnavailable,
)
from dbq.client.ring import Message, Queue, QueueStats, RepairResult
from dbq.connection import ConnectionSettings, from_secret_data, from_url

__all__ = [
    "LeaseLost",
    "Message",
    "MessageTooLarge",
    "Queue",
    "QueueError",
    "QueueFull",
    "QueueNotFound",
    "QueueStats",
    "QueueUnavailable",
    "RepairResult",
    "connect",
    "connect_resource",
    "from_resource",
]

DEFAULT_SCHEMA = "dbq"


def connect(url: str, queue: str, *, schema: str | None = None, **options: Any) -> Queue:
    """A client for `queue` at `url` (postgresql://user:pass@host:port/db or mssql://...;
    `?driver=...` picks the ODBC driver). Options: pool_size, visibility, push_timeout,
    pop_timeout, ttl (seconds), hole_grace."""
    return _open(from_url(url), queue, schema or DEFAULT_SCHEMA, options)


def from_resource(resource: dict[str, Any], secret_data: dict[str, Any], **options: Any) -> Queue:
    """A client for a Queue resource (as the API returns it) and its Secret's `data`.

    The resource's spec.timeouts become the defaults (visibility, pushWait, popWait, messageTTL);
    `options` override them."""
    spec = QueueSpec.model_validate(resource.get("spec") or {})
    name = queue_name(resource["metadata"]["name"], spec)
    t = spec.timeouts
    defaults: dict[str, Any] = {
        "visibility": seconds(t.visibility),
        "push_timeout": seconds(t.push_wait),
        "pop_timeout": seconds(t.pop_wait),
        "ttl": seconds(t.message_ttl),
    }
    settings = from_secret_data(secret_data, str(spec.backend))
    return _open(settings, name, spec.connection.schema_, defaults | options)


def connect_resource(
    name: str, namespace: str = "default", *, api_client: Any = None, **options: Any
) -> Queue:
    """A client for the Queue resource `namespace/name`, read from the Kubernetes API (with the
    in-cluster or kubeconfig credentials unless `api_client` is given) with its Secret."""
    from kubernetes import client

    from dbq import kubeconfig

    if api_client is None:
        kubeconfig.load()
        api_client = client.ApiClient()
    resource = cast(
        dict[str, Any],
        client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        ),
    )
    secret_name = resource["spec"]["connection"]["secretRef"]["name"]
    secret = client.CoreV1Api(api_client).read_namespaced_secret(secret_name, namespace)
    return from_resource(resource, secret.data or {}, **options)


def _open(settings: ConnectionSettings, queue: str, schema: str, options: dict[str, Any]) -> Queue:
    return Queue(settings, QueueNames(schema=schema, queue=queue), **options)
