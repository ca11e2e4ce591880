"""kopf handlers of Topics and Subscriptions: thin wrappers around `dbq.controller.topics`.

Whatever changes (a Topic, a Subscription, their periodic check), the whole topic is synced: its
routine made to route what its Subscriptions say now, and every status written.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from dbq.api.models import GROUP, VERSION
from dbq.api.topics import SUBSCRIPTION_PLURAL, TOPIC_PLURAL
from dbq.controller import conditions as cond
from dbq.controller import leadership
from dbq.controller.handlers import (
    SETTINGS,
    annotated,
    backoff,
    forget_credentials,
    kube,
    post_event,
    read_secret,
)
from dbq.controller.reconcile import FORCE_DELETE
from dbq.controller.topics import TopicSync

log = logging.getLogger("dbq")


def topics() -> TopicSync:
    return TopicSync(kube(), read_secret, post_event)


def _first_sight(plural: str, meta: kopf.Meta, status: kopf.Status) -> None:
    """Ready=Unknown and Reconciling=True before the first sync of a generation (kstatus)."""
    first = cond.reconciling(status.get("conditions"), meta.get("generation"))
    if first is not None:
        kube().patch_status(plural, meta["namespace"], meta["name"], {"conditions": first})


def _sync(namespace: str, topic: str, retry: int, *, retrying: bool = True) -> None:
    synced = topics().sync(namespace, topic)
    if synced.error is not None:
        forget_credentials()
        log.info("topic %s/%s not synced: %s", namespace, topic, synced.error)
        if retrying:
            raise kopf.TemporaryError(str(synced.error), delay=backoff(retry))


@kopf.on.resume(GROUP, VERSION, TOPIC_PLURAL)
@kopf.on.create(GROUP, VERSION, TOPIC_PLURAL)
@kopf.on.update(GROUP, VERSION, TOPIC_PLURAL)
def apply_topic(meta: kopf.Meta, status: kopf.Status, retry: int, **_: Any) -> None:
    leadership.fence()
    _first_sight(TOPIC_PLURAL, meta, status)
    _sync(meta["namespace"], meta["name"], retry)


@kopf.timer(GROUP, VERSION, TOPIC_PLURAL, interval=SETTINGS.drift_interval_s,
            initial_delay=SETTINGS.drift_interval_s, idle=5)  # fmt: skip
def check_topic(meta: kopf.Meta, **_: Any) -> None:
    """Counts read again, a routine dropped behind dbq's back made again, Queues' readiness followed."""
    leadership.fence()
    _sync(meta["namespace"], meta["name"], 0, retrying=False)


@kopf.on.delete(GROUP, VERSION, TOPIC_PLURAL)
def delete_topic(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, retry: int,
                 **_: Any) -> None:  # fmt: skip
    leadership.fence()
    namespace, name = meta["namespace"], meta["name"]
    done = topics().delete(namespace, name, dict(spec), dict(status), force=annotated(meta, FORCE_DELETE))
    if done.error is not None:
        blocked = cond.set_condition(
            status.get("conditions"), cond.DELETION_BLOCKED, True, done.error.reason, str(done.error),
            meta.get("generation"),
        )  # fmt: skip
        if cond.condition(status.get("conditions"), cond.DELETION_BLOCKED) != cond.condition(
            blocked, cond.DELETION_BLOCKED
        ):
            kube().patch_status(TOPIC_PLURAL, namespace, name, {"conditions": blocked})
            kopf.event(body, type="Warning", reason="DeletionBlocked", message=str(done.error))
        raise kopf.TemporaryError(str(done.error), delay=min(60.0, backoff(retry)))
    kopf.event(body, type="Normal", reason="Deleted", message=f"dropped the routines of topic {name}")
    _sync(namespace, name, retry, retrying=False)  # its Subscriptions now say TopicNotFound


@kopf.on.resume(GROUP, VERSION, SUBSCRIPTION_PLURAL)
@kopf.on.create(GROUP, VERSION, SUBSCRIPTION_PLURAL)
@kopf.on.update(GROUP, VERSION, SUBSCRIPTION_PLURAL)
def apply_subscription(meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, retry: int, **_: Any) -> None:
    leadership.fence()
    _first_sight(SUBSCRIPTION_PLURAL, meta, status)
    _sync(meta["namespace"], str(spec.get("topic")), retry)


@kopf.on.delete(GROUP, VERSION, SUBSCRIPTION_PLURAL)
def delete_subscription(meta: kopf.Meta, spec: kopf.Spec, retry: int, **_: Any) -> None:
    """The topic's routine no longer routes to the subscription's queue before it goes."""
    leadership.fence()
    _sync(meta["namespace"], str(spec.get("topic")), retry)
