"""Backends: one subpackage per engine behind the small protocol in `base`."""

from __future__ import annotations

from dbq.api.durations import seconds
from dbq.api.models import QueueSpec
from dbq.backends.base import QueueBackend
from dbq.connection import ConnectionSettings
from dbq.contract.ring import RingTarget
from dbq.errors import InvalidSpec
from dbq.names import QueueNames


def open_backend(spec: QueueSpec, queue: str, settings: ConnectionSettings) -> QueueBackend:
    """The backend object for a Queue's spec; nothing is connected until it is used."""
    names = QueueNames(schema=spec.connection.schema_, queue=queue)
    if spec.backend in ("postgres", "sqlserver") and spec.design == "ring":
        from dbq.backends.odbc_ring import OdbcRing

        return OdbcRing(settings, RingTarget(names, spec.ring.size, spec.ring.message_bytes))
    if spec.backend == "cassandra" and spec.design == "pipes":
        from dbq.backends.cassandra.backend import CassandraPipes
        from dbq.backends.cassandra.cql import replication_map
        from dbq.backends.cassandra.plan import PipesTarget

        target = PipesTarget(
            names=names,
            replication=replication_map(spec.pipes.replication),
            max_pushes_per_pipe=spec.pipes.max_pushes_per_pipe,
            max_push_time_ms=int(seconds(spec.pipes.max_push_time) * 1000),
        )
        return CassandraPipes(settings, target)
    raise InvalidSpec(
        f"backend {spec.backend} with design {spec.design} is not provisioned by this version of dbq yet"
    )
