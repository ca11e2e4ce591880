"""Prometheus metrics of the operator (served by `dbq run --metrics-port`)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("dbq_reconciles_total", "Reconciles by result", ["result"])
RECONCILE_ERRORS = Counter("dbq_reconcile_errors_total", "Failed reconciles by reason", ["reason"])
RECONCILE_SECONDS = Histogram(
    "dbq_reconcile_duration_seconds", "Time to reconcile one queue",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)  # fmt: skip
QUEUE_READY = Gauge("dbq_queue_ready", "1 when the queue's Ready condition is True", ["namespace", "queue"])


def reconciled(*, ok: bool, seconds: float, reason: str = "") -> None:
    RECONCILES.labels(result="ok" if ok else "error").inc()
    RECONCILE_SECONDS.observe(seconds)
    if not ok:
        RECONCILE_ERRORS.labels(reason=reason).inc()


def set_ready(namespace: str, name: str, ready: bool) -> None:
    QUEUE_READY.labels(namespace=namespace, queue=name).set(1 if ready else 0)


def forget(namespace: str, name: str) -> None:
    with contextlib.suppress(KeyError):
        QUEUE_READY.remove(namespace, name)
