"""Backends: one subpackage per engine behind the small protocol in `base`."""

from __future__ import annotations

from dbq.api.models import QueueSpec
from dbq.backends.base import InvalidSpec, QueueBackend
from dbq.backends.names import QueueNames
from dbq.connection import ConnectionSettings


def open_backend(spec: QueueSpec, queue: str, settings: ConnectionSettings) -> QueueBackend:
    """The backend object for a Queue's spec; nothing is connected until it is used."""
    names = QueueNames(schema=spec.connection.schema_, queue=queue)
    if spec.backend in ("postgres", "sqlserver") and spec.design == "ring":
        from dbq.backends.odbc_ring import OdbcRing

        return OdbcRing(settings, names, spec.ring.size, spec.ring.message_bytes)
    raise InvalidSpec(
        f"backend {spec.backend} with design {spec.design} is not provisioned by this version of dbq yet"
    )
