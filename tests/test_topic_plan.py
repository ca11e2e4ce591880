"""The pure planning of a topic (`dbq.controller.topic_plan`): which Subscriptions are bound, why
the others are not, and what the statuses say, from resources as the API server returns them."""

from __future__ import annotations

from typing import Any

import pytest

from dbq.contract.topics import TopicCounts
from dbq.controller.topic_plan import plan_topic, subscription_status, topic_status
from dbq.errors import InvalidSpec

TOPIC = {"backend": "postgres", "connection": {"secretRef": {"name": "db"}, "schema": "shop"}}


def queue(
    name: str, *, schema: str = "shop", provisioned: bool = True, ready: bool = True, **meta: Any
) -> dict:
    conditions = [
        {"type": "Provisioned", "status": "True" if provisioned else "False"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    spec = {
        "backend": "postgres",
        "design": "ring",
        "connection": {"secretRef": {"name": "db"}, "schema": schema},
    }
    return {"metadata": {"name": name, **meta}, "spec": spec, "status": {"conditions": conditions}}


def subscription(name: str, queue_name: str, topic: str = "orders", **meta: Any) -> dict:
    spec = {"topic": topic, "queue": queue_name, "filter": {"headers": [{"key": "region", "eq": "eu"}]}}
    return {"metadata": {"name": name, "generation": 3, **meta}, "spec": spec}


def by_name(*queues: dict) -> dict[str, dict]:
    return {q["metadata"]["name"]: q for q in queues}


def test_each_subscription_is_bound_or_says_why_not_and_the_others_go_on():
    subs = [
        subscription("eu-team", "eu-orders"),
        subscription("lost", "no-such-queue"),
        subscription("elsewhere", "other-schema"),
        subscription("early", "not-yet"),
        subscription("leaving", "eu-orders", deletionTimestamp="2026-11-27T00:00:00Z"),
        subscription("other-topic", "eu-orders", topic="invoices"),
    ]
    queues = by_name(
        queue("eu-orders"), queue("other-schema", schema="billing"), queue("not-yet", provisioned=False)
    )
    plan = plan_topic("orders", TOPIC, subs, queues)
    why = {
        b.subscription: (b.route is not None, b.problem.reason if b.problem else None) for b in plan.bindings
    }
    assert why == {
        "early": (False, "QueueNotReady"),
        "elsewhere": (False, "InvalidSpec"),
        "eu-team": (True, None),
        "lost": (False, "QueueNotFound"),
    }
    (route,) = plan.target.routes
    assert (route.subscription, route.label, route.queue.qualified) == (
        "eu_team",
        "eu-team",
        "shop.eu_orders",
    )
    assert plan.problems == () and plan.target.names.topic == "orders"


def test_a_missing_unrouted_queue_or_a_bound_queue_not_ready_keeps_the_topic_from_ready():
    topic = {**TOPIC, "unroutedQueue": "rest"}
    plan = plan_topic(
        "orders", topic, [subscription("eu-team", "eu-orders")], by_name(queue("eu-orders", ready=False))
    )
    assert [p.reason for p in plan.problems] == ["QueueNotFound", "QueueNotReady"]
    assert plan.target.unrouted is None and len(plan.target.routes) == 1  # still routed: provisioned
    counts = TopicCounts(
        rules_version=2, published=10, unrouted=1, routed={"eu_team": 9}, dropped={"eu_team": 0}
    )
    status = topic_status(plan, counts, None, 1, "db:5432/shop", "2026-11-27T00:00:00Z")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "QueueNotFound") and "spec.unroutedQueue" in ready[
        "message"
    ]
    assert status["routes"] == [{"subscription": "eu-team", "queue": "eu-orders", "routed": 9, "dropped": 0}]
    assert (status["published"], status["unrouted"], status["subscriptions"]) == (10, 1, 1)


def test_statuses_of_a_bound_topic_and_subscription():
    subs = [subscription("eu-team", "eu-orders"), subscription("lost", "gone")]
    plan = plan_topic("orders", TOPIC, subs, by_name(queue("eu-orders")))
    counts = TopicCounts(
        rules_version=4, published=5, unrouted=0, routed={"eu_team": 5}, dropped={"eu_team": 0}
    )
    status = topic_status(plan, counts, None, 2, "db:5432/shop", "2026-11-27T00:00:00Z")
    kinds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert kinds == {"Ready": ("True", "RulesApplied"), "Degraded": ("True", "SubscriptionsNotBound")}
    bound, lost = plan.bindings[0], plan.bindings[1]
    mine = subscription_status(bound, "orders", counts, None)
    assert (mine["routed"], mine["dropped"], mine["queueName"], mine["observedGeneration"]) == (
        5,
        0,
        "eu_orders",
        3,
    )
    assert (
        mine["conditions"][0]["reason"] == "Bound" and "rules version 4" in mine["conditions"][0]["message"]
    )
    theirs = subscription_status(lost, "orders", counts, None)
    assert {c["type"]: c["reason"] for c in theirs["conditions"]} == {
        "Ready": "QueueNotFound",
        "Reconciling": "QueueNotFound",
    }


def test_a_topic_on_another_backend_is_refused_naming_the_field():
    with pytest.raises(
        InvalidSpec, match=r"spec\.backend and spec\.design: topics are made on postgres ring"
    ):
        plan_topic("orders", {**TOPIC, "backend": "sqlserver", "design": "ring"}, [], {})
    with pytest.raises(InvalidSpec, match=r"\(backend: cassandra, design: pipes\)"):
        plan_topic("orders", {**TOPIC, "backend": "cassandra", "design": "ring"}, [], {})
    assert (
        plan_topic("orders", {**TOPIC, "backend": "cassandra", "design": "pipes"}, [], {}).target.routes == ()
    )
