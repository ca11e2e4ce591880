"""The Queue API: spec and status models, and the CRD generated from them."""

from dbq.api.models import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Backend,
    DeletionPolicy,
    Design,
    QueueResource,
    QueueSpec,
    queue_name,
)
from dbq.api.status import Condition, QueueStatus

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Backend",
    "Condition",
    "DeletionPolicy",
    "Design",
    "QueueResource",
    "QueueSpec",
    "QueueStatus",
    "queue_name",
]
