"""Backends: one subpackage per engine behind the small protocol in `base`."""

from __future__ import annotations

from dbq.api.durations import seconds
from dbq.api.limits import DEFAULT_MAX_BODY_BYTES
from dbq.api.models import QueueSpec
from dbq.backends.base import QueueBackend
from dbq.backends.broker_plan import BrokerTarget
from dbq.connection import ConnectionSettings
from dbq.contract.ring import RingTarget
from dbq.errors import InvalidSpec
from dbq.names import QueueNames


def open_backend(
    spec: QueueSpec, queue: str, settings: ConnectionSettings, dead_letter_keeper: QueueNames | None = None,
    provisioned: bool = False,
) -> QueueBackend:  # fmt: skip
    """The backend object for a Queue's spec; nothing is connected until it is used.
    `dead_letter_keeper`: the queue that keeps this one's dead letters (`dbq.resource.dead_letter_keeper`).
    `provisioned`: the Queue provisioned its objects already, so a ring of another size is resized."""
    names = QueueNames(schema=spec.connection.schema_, queue=queue)
    if spec.backend in ("postgres", "sqlserver") and spec.design == "ring":
        from dbq.backends.odbc_ring import OdbcRing

        max_attempts = spec.dead_letter.max_attempts if spec.dead_letter else 0
        ring = RingTarget(
            names, spec.ring.size, spec.ring.message_bytes, max_attempts,
            archive=spec.archive.enabled, archive_retention_s=seconds(spec.archive.retention),
            dead_letter_keeper=dead_letter_keeper,
            header_bytes=spec.messages.header_bytes, max_headers=spec.messages.max_headers,
            max_body_bytes=spec.messages.max_bytes or DEFAULT_MAX_BODY_BYTES,
            compression=str(spec.messages.compression or ""),
            pgmq_name=spec.pgmq.name if spec.pgmq else "",
            pgmq_topics=tuple(sorted(spec.pgmq.topics)) if spec.pgmq else (), resize=provisioned,
            grows_to=spec.ring.auto_grow.max_size if spec.ring.auto_grow else 0,
        )  # fmt: skip
        return OdbcRing(settings, ring)
    if spec.backend == "cassandra" and spec.design == "pipes":
        from dbq.backends.cassandra.backend import CassandraPipes
        from dbq.backends.cassandra.cql import replication_map
        from dbq.backends.cassandra.plan import PipesTarget

        target = PipesTarget(
            names=names,
            replication=replication_map(spec.pipes.replication),
            max_pushes_per_pipe=spec.pipes.max_pushes_per_pipe,
            max_push_time_ms=int(seconds(spec.pipes.max_push_time) * 1000),
            max_attempts=spec.dead_letter.max_attempts if spec.dead_letter else 0,
            archive_ttl_s=int(seconds(spec.archive.retention)) if spec.archive.enabled else 0,
            dead_letter_keeper=dead_letter_keeper,
            header_bytes=spec.messages.header_bytes,
            max_headers=spec.messages.max_headers,
            max_body_bytes=spec.messages.max_bytes or DEFAULT_MAX_BODY_BYTES,
        )
        return CassandraPipes(settings, target)
    if spec.backend == "sqlserver" and spec.design == "servicebroker":
        from dbq.backends.sqlserver.broker import ServiceBrokerQueue

        return ServiceBrokerQueue(settings, broker_target(spec, names, settings.database))
    raise InvalidSpec(
        f"backend {spec.backend} with design {spec.design} is not provisioned by this version of dbq yet"
    )


def broker_target(spec: QueueSpec, names: QueueNames, database: str) -> BrokerTarget:
    sb, activation = spec.service_broker, spec.service_broker.activation
    return BrokerTarget(
        names=names,
        database=database,
        activation_procedure=activation.procedure if activation else None,
        activation_enabled=activation.enabled if activation else False,
        max_readers=activation.max_readers if activation else 0,
        execute_as=activation.execute_as if activation else "OWNER",
        # dbq's own clients give a message back by rolling its RECEIVE back (nack, a lease that
        # ran out, a stopping consumer): with poison-message handling on, five of those in a row
        # would disable the queue for every consumer. So it is on only with an activation
        # procedure, whose own failures it is there to catch.
        poison_message_handling=sb.poison_message_handling and activation is not None,
        re_enable_on_poison=sb.re_enable_on_poison,
        new_broker=sb.new_broker,
        trustworthy=sb.trustworthy,
        notified_after_s=seconds(sb.checks.notified_after),
        open_conversations=sb.checks.open_conversations,
    )
