"""The Queue API: spec/status models and the CRD generated from them."""

from dbq.api.models import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Backend,
    Condition,
    DeletionPolicy,
    Design,
    QueueResource,
    QueueSpec,
    QueueStats,
    QueueStatus,
    queue_name,
)

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
    "QueueStats",
    "QueueStatus",
    "queue_name",
]
