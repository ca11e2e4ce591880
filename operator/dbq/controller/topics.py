"""Keeps a topic's publish routine, and the statuses of its Topic and Subscriptions, in step with
the resources: read them, plan (`dbq.controller.topic_plan`), apply, count, write.

Every change to a topic (its Topic, a Subscription, one of their Queues going away) runs
`TopicSync.sync`, which reads the resources afresh under a lock held per topic in this process: the
last sync to run read everything the changes before it wrote, so the routine ends as the
resources say, whatever order the handlers ran in. Across operators the database's own lock
orders the changes (`dbq.backends.odbc_topic`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dbq.api.crd import SUBSCRIPTION_QUEUE_FIELD, UNROUTED_QUEUE_FIELD, field_selector
from dbq.api.topics import SUBSCRIPTION_PLURAL, TOPIC_PLURAL
from dbq.backends.cassandra.topic import CassandraTopic
from dbq.backends.odbc_topic import OdbcTopic
from dbq.connection import ConnectionSettings
from dbq.contract.topics import TopicTarget
from dbq.controller import conditions as cond
from dbq.controller import metrics
from dbq.controller.reconcile import Event, status_changes
from dbq.controller.topic_plan import (
    deleting,
    failed_status,
    parse_topic,
    plan_topic,
    subscribers,
    subscription_status,
    topic_missing,
    topic_status,
)
from dbq.errors import DbqError, TopicInUse
from dbq.kube import Kube
from dbq.resource import SecretReader, settings_for

Resource = Mapping[str, Any]
# Posts an Event about a resource (the operator: kopf.event).
Poster = Callable[[Resource, Event], None]

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(namespace: str, topic: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, topic), threading.Lock())


def topic_backend(settings: ConnectionSettings, target: TopicTarget) -> OdbcTopic | CassandraTopic:
    """What makes the topic in its database: a publish routine (PostgreSQL), recorded rules (Cassandra)."""
    if settings.backend == "cassandra":
        return CassandraTopic(settings, target)
    return OdbcTopic(settings, target)


@dataclass
class Synced:
    """What a sync or deletion ended with: the error that stopped it (the caller retries), if any."""

    error: DbqError | None = None


class TopicSync:
    """One namespace's Topics and Subscriptions, through `kube`; Secrets through `read_secret`."""

    def __init__(self, kube: Kube, read_secret: SecretReader, post: Poster) -> None:
        self.kube = kube
        self.read_secret = read_secret
        self.post = post

    def sync(self, namespace: str, topic: str) -> Synced:
        """Make the topic's routine route what its Subscriptions say, and write every status."""
        with _lock(namespace, topic):
            return self._sync(namespace, topic)

    def _sync(self, namespace: str, topic: str) -> Synced:
        out = Synced()
        found = self.kube.find(TOPIC_PLURAL, namespace, topic)
        subscriptions = [
            s for s in subscribers(topic, self.kube.list_resources(SUBSCRIPTION_PLURAL, namespace))
            if not deleting(s)
        ]  # fmt: skip
        if found is None or deleting(found):
            for s in subscriptions:
                self._write(s, failed_status(topic_missing(s), _conditions(s), _generation(s)))
            return out
        generation = _generation(found)
        try:
            queues = {q["metadata"]["name"]: q for q in self.kube.list_queues(namespace)}
            plan = plan_topic(topic, found.get("spec") or {}, subscriptions, queues)
            backend = topic_backend(settings_for(plan.spec, namespace, self.read_secret), plan.target)
            try:
                backend.apply()
                counts = backend.counts()
                endpoint = backend.endpoint()
            finally:
                backend.close()
        except DbqError as e:
            out.error = e
            self._write(found, failed_status(e, _conditions(found), generation))
            for s in subscriptions:
                self._write(s, failed_status(e, _conditions(s), _generation(s)))
            metrics.set_topic(namespace, topic, ready=False, counts=None)
            return out
        status = topic_status(plan, counts, _conditions(found), generation, endpoint, cond.now_iso())
        self._write(found, status)
        for binding in plan.bindings:
            s = next(s for s in subscriptions if s["metadata"]["name"] == binding.subscription)
            self._write(s, subscription_status(binding, topic, counts, _conditions(s)))
        metrics.set_topic(
            namespace, topic, ready=cond.is_true(status["conditions"], cond.READY), counts=counts
        )
        return out

    def delete(self, namespace: str, topic: str, spec: Mapping[str, Any], status: Mapping[str, Any],
               force: bool) -> Synced:  # fmt: skip
        """Drop the topic's routine and counters; refused (TopicInUse) while Subscriptions name the
        Topic, unless `force`."""
        with _lock(namespace, topic):
            out = Synced()
            users = [
                s["metadata"]["name"]
                for s in subscribers(topic, self.kube.list_resources(SUBSCRIPTION_PLURAL, namespace))
                if not deleting(s)
            ]
            if users and not force:
                out.error = TopicInUse(
                    f"Subscriptions {', '.join(sorted(users))} route this topic's messages: delete them first,"
                    " or annotate the Topic dbq.dev/force-delete=true to stop their copies"
                )
                return out
            try:
                parsed, names = parse_topic(topic, spec)
                settings = settings_for(parsed, namespace, self.read_secret)
            except DbqError as e:
                if status.get("rulesVersion") is not None and not force:
                    out.error = e  # made once: its routine is dropped when the Secret is back
                return out
            backend = topic_backend(settings, TopicTarget(names))
            try:
                backend.teardown()
            except DbqError as e:
                out.error = e
            finally:
                backend.close()
            if out.error is None:
                metrics.forget_topic(namespace, topic)
            return out

    def topics_of_queue(self, namespace: str, queue: str) -> list[str]:
        """The Topics that route to the Queue `queue` (by a Subscription or as unrouted queue). The
        API server selects them from its cache: a listing of the namespace's would make a Queue's
        deletion cost more the more Subscriptions and Topics there are."""
        subscriptions = self.kube.list_resources(
            SUBSCRIPTION_PLURAL, namespace, field_selector=field_selector(SUBSCRIPTION_QUEUE_FIELD, queue)
        )
        topics = self.kube.list_resources(
            TOPIC_PLURAL, namespace, field_selector=field_selector(UNROUTED_QUEUE_FIELD, queue)
        )
        routed = {
            str(s["spec"].get("topic")) for s in subscriptions if (s.get("spec") or {}).get("queue") == queue
        }
        routed |= {
            t["metadata"]["name"] for t in topics if (t.get("spec") or {}).get("unroutedQueue") == queue
        }
        return sorted(routed)

    def _write(self, resource: Resource, status: dict[str, Any]) -> None:
        """Patch the fields of `status` that changed, and post the Events the change calls for."""
        current = dict(resource.get("status") or {})
        changed = status_changes(current, status)
        if not changed:
            return
        meta = resource["metadata"]
        plural = TOPIC_PLURAL if resource.get("kind") == "Topic" else SUBSCRIPTION_PLURAL
        self.kube.patch_status(plural, meta["namespace"], meta["name"], changed)
        for event in _events(resource, current, status):
            self.post(resource, event)


def _events(resource: Resource, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Event]:
    """A Warning when Ready turns False or its reason changes; a Normal Event when it turns True,
    and when a Topic's rules change."""
    old = cond.condition(before.get("conditions"), cond.READY) or {}
    new = cond.condition(after.get("conditions"), cond.READY) or {}
    events = []
    if new.get("status") == "False" and (
        old.get("status") != "False" or old.get("reason") != new.get("reason")
    ):
        events.append(Event("Warning", str(new.get("reason")), str(new.get("message"))))
    if new.get("status") == "True" and old.get("status") != "True":
        events.append(Event("Normal", str(new.get("reason")), str(new.get("message"))))
    version = after.get("rulesVersion")
    if version is not None and before.get("rulesVersion") not in (None, version):
        events.append(Event("Normal", "RulesChanged", f"rules version {version}: {new.get('message')}"))
    return events


def _conditions(resource: Resource) -> list[dict[str, Any]] | None:
    return (resource.get("status") or {}).get("conditions")


def _generation(resource: Resource) -> int | None:
    return (resource.get("metadata") or {}).get("generation")
