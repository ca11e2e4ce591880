"""kopf handlers of QueueConsumers: thin wrappers around `dbq.controller.consumers`."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from dbq.api.consumers import QUEUE_CONSUMER_PLURAL
from dbq.api.models import GROUP, VERSION
from dbq.controller import leadership
from dbq.controller.consumers import QueueConsumerSync
from dbq.controller.handlers import SETTINGS, backoff, forget_credentials, kube, post_event, read_secret

log = logging.getLogger("dbq")
# How often the scaling state is mirrored and the Queues looked at again: what `kubectl get
# queueconsumers` shows lags KEDA by at most this.
WATCH_INTERVAL_S = min(SETTINGS.drift_interval_s, 10.0)


def consumers() -> QueueConsumerSync:
    return QueueConsumerSync(kube(), read_secret, post_event, SETTINGS.scaler_address)


def _sync(body: kopf.Body, retry: int, *, retrying: bool = True) -> None:
    synced = consumers().sync(body)
    if synced.error is not None:
        forget_credentials()
        meta = body["metadata"]
        log.info("queueconsumer %s/%s not synced: %s", meta["namespace"], meta["name"], synced.error)
        if retrying and synced.error.retry:
            raise kopf.TemporaryError(str(synced.error), delay=backoff(retry))


@kopf.on.resume(GROUP, VERSION, QUEUE_CONSUMER_PLURAL)
@kopf.on.create(GROUP, VERSION, QUEUE_CONSUMER_PLURAL)
@kopf.on.update(GROUP, VERSION, QUEUE_CONSUMER_PLURAL)
def apply_queue_consumer(body: kopf.Body, retry: int, **_: Any) -> None:
    leadership.fence()
    _sync(body, retry)


@kopf.timer(GROUP, VERSION, QUEUE_CONSUMER_PLURAL, interval=WATCH_INTERVAL_S, initial_delay=WATCH_INTERVAL_S,
            idle=2)  # fmt: skip
def watch_queue_consumer(body: kopf.Body, **_: Any) -> None:
    """A Queue made Ready or deleted since, KEDA installed since, the replicas KEDA set."""
    leadership.fence()
    _sync(body, 0, retrying=False)


@kopf.on.delete(GROUP, VERSION, QUEUE_CONSUMER_PLURAL)
def delete_queue_consumer(body: kopf.Body, **_: Any) -> None:
    """The ScaledObject, TriggerAuthentication and QueueUser it wrote go with it (the workload
    keeps the replicas it has)."""
    leadership.fence()
    consumers().delete(body)
