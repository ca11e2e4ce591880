"""QueueConsumer planning: the KEDA objects a spec asks for, and each refusal; pure functions,
no API server, no database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from pydantic import ValidationError

from dbq.api.consumers import QueueConsumerResource, QueueConsumerSpec
from dbq.connection import ConnectionSettings
from dbq.controller.consumer_plan import backlog_query, plan_scaling
from dbq.errors import InvalidQueueConsumer, NoQueueReady, WorkloadNotFound, WorkloadTaken
from tests.manifests import pipes_queue, queue

ROOT = Path(__file__).resolve().parents[1]
SHOP = ConnectionSettings("postgres", "db", 5432, "shop", "dbq_operator", "secret")
OTHER = ConnectionSettings("postgres", "db", 5432, "other", "dbq_operator", "secret")
CONSUMER = {"metadata": {"name": "workers", "namespace": "shop", "uid": "u-1"}}
WORKLOAD = {"metadata": {"name": "order-workers"}}


def ready(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


QUEUES = {
    "orders": ready(queue("orders")),
    "refunds": ready(queue("refunds")),
    "pending": queue("pending"),  # not Ready yet
    "events": ready(pipes_queue("events", "ks")),
    "far": ready(queue("far", connection={"secretRef": {"name": "far-db"}, "schema": "shopq"})),
}


def settings_of(spec: Any, _namespace: str) -> ConnectionSettings:
    return OTHER if spec.connection.secret_ref.name == "far-db" else SHOP


def spec(**fields: Any) -> QueueConsumerSpec:
    raw = {"queues": ["orders"], "workload": {"name": "order-workers"}, "messagesPerReplica": 100} | fields
    return QueueConsumerSpec.model_validate(raw)


def plan(workload: Any = WORKLOAD, scaled_objects: tuple[Any, ...] = (), **fields: Any) -> Any:
    return plan_scaling(CONSUMER, spec(**fields), QUEUES, workload, scaled_objects, settings_of)


def test_one_query_adds_up_the_queues_and_the_objects_are_owned_by_the_consumer():
    p = plan(queues=["orders", "pending", "refunds", "gone"])
    assert p.queues == ("orders", "refunds")  # the missing and the not-yet-Ready are left out
    assert p.query == (
        'SELECT (SELECT o_depth FROM "shopq"."orders_stats"()) + (SELECT o_depth FROM "shopq"."refunds_stats"())'
    )
    user, auth, scaled = p.children
    assert [c["kind"] for c in p.children] == ["QueueUser", "TriggerAuthentication", "ScaledObject"]
    assert user["metadata"]["name"] == auth["metadata"]["name"] == "workers-scaler"
    assert user["spec"]["queues"] == [{"name": "orders", "rights": ["monitor"]},
                                      {"name": "refunds", "rights": ["monitor"]}]  # fmt: skip
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "connection", "name": "dbq-user-workers-scaler",
                                                "key": "url"}]  # fmt: skip
    assert scaled["metadata"]["name"] == "workers"
    for child in p.children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("QueueConsumer", "u-1", True)
        assert child["metadata"]["labels"]["dbq.dev/queue-consumer"] == "workers"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql" and trigger["authenticationRef"] == {"name": "workers-scaler"}
    assert trigger["metadata"] == {
        "query": p.query,
        "targetQueryValue": "100",
        "activationTargetQueryValue": "0",
    }
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "order-workers",
    }
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 10)
    assert (scaled["spec"]["pollingInterval"], scaled["spec"]["cooldownPeriod"]) == (10, 300)


@pytest.mark.parametrize(
    ("measure", "query"),
    [
        ("depthAndInFlight", 'SELECT (SELECT o_depth + o_in_flight FROM "s"."a_stats"()) + (SELECT o_depth +'
         ' o_in_flight FROM "s"."b_stats"())'),
        ("oldestAge", 'SELECT GREATEST((SELECT coalesce(ceil(o_oldest_age_s), 0)::bigint FROM "s"."a_stats"()),'
         ' (SELECT coalesce(ceil(o_oldest_age_s), 0)::bigint FROM "s"."b_stats"()))'),
    ],
)  # fmt: skip
def test_each_measure_reads_its_figure(measure, query):
    assert backlog_query(spec(measure=measure), ['"s"."a_stats"', '"s"."b_stats"']) == query


def test_the_generated_query_runs_on_the_ring_as_a_monitor_login(postgres):
    """The three measures' queries parse and answer on a real ring queue's stats routine."""
    from dbq.backends.odbc_ring import OdbcRing
    from dbq.connection import from_url
    from dbq.contract.ring import RingTarget
    from dbq.names import QueueNames

    ring = OdbcRing(from_url(postgres.url), RingTarget(QueueNames("plan_q", "jobs"), 64, 256))
    ring.apply()
    try:
        with psycopg.connect(postgres.url, autocommit=True) as db:
            db.execute("SELECT count(*) FROM plan_q.jobs_send_batch(%s::bytea[])", ([b"x"] * 3,))
            answers = [db.execute(backlog_query(spec(measure=m), ['"plan_q"."jobs_stats"'] * 2)).fetchone()[0]  # type: ignore[index]
                       for m in ("depth", "depthAndInFlight", "oldestAge")]  # fmt: skip
        assert answers[:2] == [6, 6] and 0 <= answers[2] <= 5, answers
    finally:
        ring.teardown()
        ring.close()


def test_what_cannot_be_scaled_is_refused_naming_the_field():
    with pytest.raises(WorkloadNotFound, match=r"spec.workload: there is no Deployment order-workers"):
        plan(workload=None)
    theirs = {"metadata": {"name": "hand-made", "ownerReferences": []},
              "spec": {"scaleTargetRef": {"name": "order-workers"}}}  # fmt: skip
    with pytest.raises(WorkloadTaken, match="already scaled by ScaledObject hand-made"):
        plan(scaled_objects=(theirs,))
    ours = {**theirs, "metadata": {"name": "workers", "ownerReferences": [{"uid": "u-1"}]}}
    assert plan(scaled_objects=(ours,)).queues == ("orders",)
    with pytest.raises(
        InvalidQueueConsumer, match=r"spec.queues\[1\]: Queue events is a pipes queue on cassandra"
    ):
        plan(queues=["orders", "events"])
    with pytest.raises(InvalidQueueConsumer, match=r"spec.queues\[1\]: Queue far is on db:5432/other"):
        plan(queues=["orders", "far"])
    with pytest.raises(NoQueueReady, match="none of pending, gone exists and is Ready"):
        plan(queues=["pending", "gone"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"maxReplicas": 2, "minReplicas": 3}, "spec.maxReplicas must be at least spec.minReplicas"),
        ({"maxReplicas": 0}, "greater than or equal to 1"),
        ({"messagesPerReplica": 0}, "greater than or equal to 1"),
        ({"queues": ["orders", "orders"]}, "name each Queue once"),
        ({"queues": []}, "at least 1 item"),
        ({"measure": "lag"}, "'depth', 'depthAndInFlight' or 'oldestAge'"),
    ],
)
def test_the_model_refuses_bad_input(fields, message):
    with pytest.raises(ValidationError, match=message):
        spec(**fields)


def test_the_example_manifest_is_a_valid_queue_consumer():
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "queueconsumer.yaml").read_text())
    QueueConsumerResource.model_validate(doc)


def test_the_push_trigger_dials_the_operator_and_needs_no_login_of_its_own():
    p = plan_scaling(
        CONSUMER, spec(trigger="push"), QUEUES, WORKLOAD, (), settings_of, "dbq-operator.dbq-system.svc:9095"
    )
    (scaled,) = p.children
    assert scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["triggers"] == [
        {
            "type": "external-push",
            "name": "backlog",
            "metadata": {"scalerAddress": "dbq-operator.dbq-system.svc:9095"},
        }
    ]
    # what the postgresql trigger wrote before is taken away
    assert {plural for _, plural, _ in p.unused} == {"queueusers", "triggerauthentications", "scaledjobs"}
    with pytest.raises(InvalidQueueConsumer, match=r"spec.trigger: push needs the operator's push scaler"):
        plan_scaling(CONSUMER, spec(trigger="push"), QUEUES, WORKLOAD, (), settings_of, "")


JOB = {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "task", "image": "worker"}]}}}


def test_a_job_spec_makes_a_scaled_job_that_starts_jobs_for_the_backlog():
    p = plan_scaling(CONSUMER, spec(workload=None, job=JOB, maxReplicas=5), QUEUES, None, (), settings_of)
    scaled = p.scaled_object
    assert scaled["kind"] == "ScaledJob" and scaled["metadata"]["name"] == "workers"
    assert scaled["spec"]["jobTargetRef"] == JOB and scaled["spec"]["maxReplicaCount"] == 5
    assert "scaleTargetRef" not in scaled["spec"] and "cooldownPeriod" not in scaled["spec"]
    assert scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue"] == "100"
    assert ("keda.sh/v1alpha1", "scaledobjects", "workers") in p.unused  # a workload's, from before
    # and a workload's plan takes a ScaledJob of before away
    assert ("keda.sh/v1alpha1", "scaledjobs", "workers") in plan().unused


def test_a_consumer_names_a_workload_or_a_job_not_both():
    for fields in ({"job": JOB}, {"workload": None}):
        with pytest.raises(ValidationError, match=r"give spec.workload .* or spec.job"):
            spec(**fields)
