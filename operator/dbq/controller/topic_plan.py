"""What a topic's publish routine should route, from the Topic, its Subscriptions and their Queues
as the API server holds them; and what the Topic's and each Subscription's status then say.

Pure: no kopf, no Kubernetes client, no database. `dbq.controller.topics` reads the resources,
applies the plan's target (`dbq.backends.odbc_topic`) and writes the statuses this module makes.

A subscription is bound (its route is in the routine) when its Queue exists, is provisioned, is
not being deleted and lives in the Topic's database (backend, design, Secret and schema). Any
other subscription is left out of the routine, and its status says why; the others go on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from dbq.api.models import QueueSpec, queue_name
from dbq.api.topics import (
    SubscriptionSpec,
    SubscriptionStatus,
    TopicSpec,
    TopicStatus,
    subscription_name,
    topic_name,
)
from dbq.contract.topics import Route, TopicCounts, TopicNames, TopicTarget
from dbq.controller import conditions as cond
from dbq.errors import DbqError, InvalidSpec, QueueNotFound, QueueNotReady, TopicNotFound
from dbq.names import QueueNames
from dbq.resource import validation_message

Resource = Mapping[str, Any]


@dataclass(frozen=True)
class Binding:
    """One Subscription of the topic: its route when bound, else why not."""

    subscription: str  # metadata.name
    queue: str  # spec.queue
    generation: int | None
    route: Route | None = None
    problem: DbqError | None = None


@dataclass(frozen=True)
class TopicPlan:
    name: str  # metadata.name
    spec: TopicSpec
    target: TopicTarget
    bindings: tuple[Binding, ...]
    problems: tuple[DbqError, ...]  # what keeps the topic from Ready besides its bindings


def parse_topic(name: str, raw: Mapping[str, Any]) -> tuple[TopicSpec, TopicNames]:
    try:
        spec = TopicSpec.model_validate(dict(raw))
        return spec, TopicNames(spec.connection.schema_, topic_name(name, spec))
    except ValidationError as e:
        raise InvalidSpec(validation_message(e)) from None
    except ValueError as e:
        raise InvalidSpec(str(e)) from None


def deleting(resource: Resource) -> bool:
    return bool((resource.get("metadata") or {}).get("deletionTimestamp"))


def subscribers(topic: str, subscriptions: Sequence[Resource]) -> list[Resource]:
    """The Subscriptions (of one namespace) of the Topic `topic`, being deleted or not."""
    return [s for s in subscriptions if (s.get("spec") or {}).get("topic") == topic]


def _queue(field: str, wanted: str, spec: TopicSpec, queues: Mapping[str, Resource]) -> QueueNames:
    """The names of the Queue `wanted`, checked to be a provisioned queue of the topic's database;
    the DbqError that says why not."""
    found = queues.get(wanted)
    if found is None or deleting(found):
        state = "is being deleted" if found is not None else "does not exist in this namespace"
        raise QueueNotFound(f"{field}: Queue {wanted} {state}: create it, or name another Queue")
    try:
        other = QueueSpec.model_validate(found.get("spec") or {})
        other_name = queue_name(wanted, other)
    except (ValidationError, ValueError):
        raise QueueNotReady(f"{field}: Queue {wanted} has an invalid spec (see its conditions)") from None
    differs = [
        f"{what} {theirs} (the topic's: {ours})"
        for what, ours, theirs in (
            ("backend", spec.backend, other.backend),
            ("design", spec.design, other.design),
            ("Secret", spec.connection.secret_ref.name, other.connection.secret_ref.name),
            ("schema", spec.connection.schema_, other.connection.schema_),
        )
        if ours != theirs
    ]
    if differs:
        raise InvalidSpec(
            f"{field}: Queue {wanted} has {', '.join(differs)}; a topic routes in one transaction, so its"
            " queues live in its database and schema: name such a Queue"
        )
    if not cond.is_true((found.get("status") or {}).get("conditions"), cond.PROVISIONED):
        raise QueueNotReady(f"{field}: Queue {wanted} is not provisioned yet")
    return QueueNames(other.connection.schema_, other_name)


def _bind(subscription: Resource, spec: TopicSpec, queues: Mapping[str, Resource]) -> Binding:
    meta = subscription.get("metadata") or {}
    raw = subscription.get("spec") or {}
    binding = Binding(str(meta.get("name")), str(raw.get("queue", "")), meta.get("generation"))
    try:
        try:
            parsed = SubscriptionSpec.model_validate(raw)
            name = subscription_name(binding.subscription)
        except ValidationError as e:
            raise InvalidSpec(validation_message(e)) from None
        except ValueError as e:
            raise InvalidSpec(str(e)) from None
        queue = _queue("spec.queue", parsed.queue, spec, queues)
        route = Route(name, queue, parsed.filter, parsed.on_full, label=binding.subscription)
    except DbqError as e:
        return replace(binding, problem=e)
    return replace(binding, route=route)


def plan_topic(name: str, spec_raw: Mapping[str, Any], subscriptions: Sequence[Resource],
               queues: Mapping[str, Resource]) -> TopicPlan:  # fmt: skip
    """The routes of the Topic `name` from its Subscriptions (those being deleted are left out)
    and the Queues of its namespace (by metadata.name). Raises InvalidSpec for a bad Topic."""
    spec, names = parse_topic(name, spec_raw)
    bindings = tuple(
        _bind(s, spec, queues)
        for s in sorted(subscribers(name, subscriptions), key=lambda s: s["metadata"]["name"])
        if not deleting(s)
    )
    problems: list[DbqError] = []
    unrouted = None
    if spec.unrouted_queue:
        try:
            unrouted = _queue("spec.unroutedQueue", spec.unrouted_queue, spec, queues)
        except DbqError as e:
            problems.append(e)
    for b in bindings:
        queue = queues.get(b.queue)
        if (
            b.route is not None
            and queue
            and not cond.is_true((queue.get("status") or {}).get("conditions"), cond.READY)
        ):
            problems.append(QueueNotReady(f"Queue {b.queue} of subscription {b.subscription} is not Ready"))
    routes = tuple(b.route for b in bindings if b.route is not None)
    return TopicPlan(name, spec, TopicTarget(names, routes, unrouted), bindings, tuple(problems))


def topic_status(plan: TopicPlan, counts: TopicCounts | None, conditions: list[dict[str, Any]] | None,
                 generation: int | None, endpoint: str, now: str) -> dict[str, Any]:  # fmt: skip
    """The Topic's status once its routine matches the plan (`counts` read after)."""
    bound = [b for b in plan.bindings if b.route is not None]
    unbound = [b for b in plan.bindings if b.problem is not None]
    version = counts.rules_version if counts else None
    if plan.problems:
        first = plan.problems[0]
        new = cond.set_condition(
            conditions, cond.READY, False, first.reason, "; ".join(str(p) for p in plan.problems), generation
        )
    else:
        message = f"rules version {version} routes to {len(bound)} subscriptions"
        new = cond.set_condition(conditions, cond.READY, True, "RulesApplied", message, generation)
    if unbound:
        words = "; ".join(f"{b.subscription}: {b.problem}" for b in unbound)
        new = cond.set_condition(new, cond.DEGRADED, True, "SubscriptionsNotBound", words, generation)
    else:
        new = cond.set_condition(
            new, cond.DEGRADED, False, "AsExpected", "every subscription is bound", generation
        )
    new = cond.settled(new, plan.problems[0] if plan.problems else None)
    routed = counts.routed if counts else {}
    dropped = counts.dropped if counts else {}
    return TopicStatus.model_validate({
        "observedGeneration": generation,
        "topicName": plan.target.names.topic,
        "endpoint": endpoint,
        "conditions": new,
        "rulesVersion": version,
        "subscriptions": len(bound),
        "published": counts.published if counts else 0,
        "unrouted": counts.unrouted if counts else 0,
        "routes": [
            {"subscription": b.subscription, "queue": b.queue,
             "routed": routed.get(b.route.subscription, 0), "dropped": dropped.get(b.route.subscription, 0)}
            for b in bound if b.route is not None
        ],
        "measuredAt": now,
    }).wire()  # fmt: skip


def subscription_status(binding: Binding, topic: str, counts: TopicCounts | None,
                        conditions: list[dict[str, Any]] | None) -> dict[str, Any]:  # fmt: skip
    """A Subscription's status once its topic's routine matches the plan it is part of."""
    generation = binding.generation
    if binding.route is None:
        problem = binding.problem or QueueNotFound(f"Queue {binding.queue} is not bound")
        new = cond.set_condition(conditions, cond.READY, False, problem.reason, str(problem), generation)
        new = cond.settled(new, problem)
        return SubscriptionStatus.model_validate({"observedGeneration": generation, "conditions": new}).wire()
    name = binding.route.subscription
    version = counts.rules_version if counts else None
    message = f"topic {topic} routes matching messages to queue {binding.route.queue.qualified} (rules version {version})"
    new = cond.settled(cond.set_condition(conditions, cond.READY, True, "Bound", message, generation))
    return SubscriptionStatus.model_validate({
        "observedGeneration": generation,
        "conditions": new,
        "queueName": binding.route.queue.queue,
        "routed": (counts.routed if counts else {}).get(name, 0),
        "dropped": (counts.dropped if counts else {}).get(name, 0),
    }).wire()  # fmt: skip


def failed_status(
    error: DbqError, conditions: list[dict[str, Any]] | None, generation: int | None
) -> dict[str, Any]:
    """Ready=False with the error's reason, for a Topic or Subscription whose routine could not be
    made (or, for a Subscription, whose Topic is missing or invalid)."""
    new = cond.settled(
        cond.set_condition(conditions, cond.READY, False, error.reason, str(error), generation), error
    )
    return {"observedGeneration": generation, "conditions": new}


def topic_missing(subscription: Resource) -> TopicNotFound:
    topic = (subscription.get("spec") or {}).get("topic")
    return TopicNotFound(
        f"spec.topic: there is no Topic {topic} in this namespace: create it, or fix the name"
    )
