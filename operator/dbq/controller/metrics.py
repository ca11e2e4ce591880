"""Prometheus metrics of the operator (served by `dbq run --metrics-port`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from dbq.client import QueueStats
from dbq.contract.topics import TopicCounts

RECONCILES = Counter("dbq_reconciles_total", "Reconciles by result", ["result"])
RECONCILE_ERRORS = Counter("dbq_reconcile_errors_total", "Failed reconciles by reason", ["reason"])
RECONCILE_SECONDS = Histogram(
    "dbq_reconcile_duration_seconds", "Time to reconcile one queue",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)  # fmt: skip
QUEUE_READY = Gauge("dbq_queue_ready", "1 when the queue's Ready condition is True", ["namespace", "queue"])
_LABELS = ["namespace", "queue"]
STATS = {
    "depth": Gauge("dbq_queue_depth", "Messages ready to be taken", _LABELS),
    "in_flight": Gauge("dbq_queue_in_flight", "Messages leased and not yet acknowledged", _LABELS),
    "pushed": Gauge("dbq_queue_pushed", "Messages pushed since the queue was created", _LABELS),
    "popped": Gauge("dbq_queue_popped", "Messages popped (at-most-once) since creation", _LABELS),
    "acquired": Gauge("dbq_queue_acquired", "Messages acquired (leased) since creation", _LABELS),
    "expired": Gauge("dbq_queue_expired", "Messages expired unread since creation", _LABELS),
    "oldest_age_seconds": Gauge(
        "dbq_queue_oldest_message_age_seconds", "Age of the oldest ready message", _LABELS
    ),
    "dead": Gauge("dbq_queue_dead_letters", "Dead letters held (spec.deadLetter)", _LABELS),
    "delayed": Gauge("dbq_queue_delayed", "Messages delayed and not due yet", _LABELS),
    "archived": Gauge("dbq_queue_archived", "Acked and popped messages kept in the archive", _LABELS),
}
RATES = (
    Gauge("dbq_queue_push_rate", "Pushes per second over the rate window", _LABELS),
    Gauge("dbq_queue_pop_rate", "Pops and acquires per second over the rate window", _LABELS),
)
RING_SLOTS = Gauge(
    "dbq_ring_slots", "Slots of the ring pushes fill (PostgreSQL and SQL Server rings)", _LABELS
)
RING_GROW_BLOCKED = Gauge(
    "dbq_ring_grow_blocked",
    "1 while the ring is nearly full at spec.ring.autoGrow.maxSize and cannot grow",
    _LABELS,
)
CLEANUP = Counter("dbq_queue_cleanup_total", "What cleanup repaired or removed, by kind", [*_LABELS, "kind"])
_TOPIC = ["namespace", "topic"]
TOPIC_READY = Gauge("dbq_topic_ready", "1 when the topic's Ready condition is True", _TOPIC)
TOPIC_PUBLISHED = Gauge(
    "dbq_topic_published", "Messages published to the topic (rolled back ones too)", _TOPIC
)
TOPIC_UNROUTED = Gauge("dbq_topic_unrouted", "Published messages no subscription matched", _TOPIC)
_SUBSCRIPTION = [*_TOPIC, "subscription"]
SUBSCRIPTION_ROUTED = Gauge(
    "dbq_subscription_routed", "Copies put in the subscription's queue", _SUBSCRIPTION
)
SUBSCRIPTION_DROPPED = Gauge(
    "dbq_subscription_dropped", "Copies skipped, the subscription's queue full (onFull: Drop)", _SUBSCRIPTION
)
LEADER = Gauge("dbq_leader", "1 while this replica acts (holds the operator's Lease), 0 while it stands by")
LEADER_TRANSITIONS = Counter("dbq_leader_transitions_total", "Times this replica became the leader")


_leads = [False]  # whether this replica leads, as last told


def leading(now: bool, acting: Callable[[], bool] = lambda: True) -> None:
    """This replica became the leader (True) or stands by (False). While it leads, each scrape
    asks `acting`: a leader whose Lease lapsed (one frozen, then woken) reads 0 at once."""
    if now and not _leads[0]:
        LEADER_TRANSITIONS.inc()
    _leads[0] = now
    LEADER.set_function(lambda: 1.0 if now and acting() else 0.0)


def set_ring(namespace: str, queue: str, slots: int, grow_blocked: bool) -> None:
    RING_SLOTS.labels(namespace=namespace, queue=queue).set(slots)
    RING_GROW_BLOCKED.labels(namespace=namespace, queue=queue).set(1 if grow_blocked else 0)


def reconciled(*, ok: bool, seconds: float, reason: str = "") -> None:
    RECONCILES.labels(result="ok" if ok else "error").inc()
    RECONCILE_SECONDS.observe(seconds)
    if not ok:
        RECONCILE_ERRORS.labels(reason=reason).inc()


def set_ready(namespace: str, name: str, ready: bool) -> None:
    QUEUE_READY.labels(namespace=namespace, queue=name).set(1 if ready else 0)


def set_stats(namespace: str, name: str, stats: QueueStats, rates: tuple[float, float] | None) -> None:
    for field, gauge in STATS.items():
        gauge.labels(namespace=namespace, queue=name).set(getattr(stats, field))
    for gauge, value in zip(RATES, rates or (0.0, 0.0), strict=True):
        gauge.labels(namespace=namespace, queue=name).set(value)


def count_cleanup(namespace: str, name: str, counts: dict[str, int]) -> None:
    for kind, n in counts.items():
        CLEANUP.labels(namespace=namespace, queue=name, kind=kind).inc(n)


def forget(namespace: str, name: str) -> None:
    for gauge in (QUEUE_READY, *STATS.values(), *RATES, RING_SLOTS, RING_GROW_BLOCKED):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)


# The subscriptions whose counts are set, by namespace and topic: removed when they go.
_subscriptions: dict[tuple[str, str], set[str]] = {}


def set_topic(namespace: str, topic: str, *, ready: bool, counts: TopicCounts | None) -> None:
    TOPIC_READY.labels(namespace=namespace, topic=topic).set(1 if ready else 0)
    if counts is None:
        return
    TOPIC_PUBLISHED.labels(namespace=namespace, topic=topic).set(counts.published)
    TOPIC_UNROUTED.labels(namespace=namespace, topic=topic).set(counts.unrouted)
    gone = _subscriptions.get((namespace, topic), set()) - set(counts.routed)
    _subscriptions[(namespace, topic)] = set(counts.routed)
    for gauge, values in ((SUBSCRIPTION_ROUTED, counts.routed), (SUBSCRIPTION_DROPPED, counts.dropped)):
        for subscription, n in values.items():
            gauge.labels(namespace=namespace, topic=topic, subscription=subscription).set(n)
        for subscription in gone:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, topic, subscription)


def forget_topic(namespace: str, topic: str) -> None:
    for gauge in (TOPIC_READY, TOPIC_PUBLISHED, TOPIC_UNROUTED):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, topic)
    for subscription in _subscriptions.pop((namespace, topic), set()):
        for gauge in (SUBSCRIPTION_ROUTED, SUBSCRIPTION_DROPPED):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, topic, subscription)
