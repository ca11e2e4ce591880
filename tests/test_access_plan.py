"""QueueUser planning and role names: pure functions, no database, no API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from dbq.api.access import QueueUserResource, QueueUserSpec
from dbq.connection import ConnectionSettings
from dbq.controller.access_plan import granted, plan_access
from dbq.errors import InvalidQueueUser, UnsafeName
from dbq.names import check_role, group_role, login_role, owner_role
from tests.manifests import pipes_queue, queue

ROOT = Path(__file__).resolve().parents[1]
SHOP = ConnectionSettings("postgres", "db", 5432, "shop", "dbq_operator", "secret")
OTHER = ConnectionSettings("postgres", "db", 5432, "other", "dbq_operator", "secret")
EVENTS = ConnectionSettings("cassandra", "cass", 9042, "", "dbq", "secret")


def topic(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"backend": "postgres",
            "connection": {"secretRef": {"name": "orders-db"}, "schema": "shopq"}}}  # fmt: skip


QUEUES = {
    "orders": queue("orders"),
    "events-q": pipes_queue("events-q", "ks"),
    "kept": pipes_queue("kept", "ks", deadLetter={"queue": "keeper", "maxAttempts": 3}),
    "keeper": pipes_queue("keeper", "ks2"),
    "far": queue("far"),
}
TOPICS = {"news": topic("news")}


def settings_of(spec: Any, _namespace: str) -> ConnectionSettings:
    if spec.backend == "cassandra":
        return EVENTS
    return OTHER if spec.connection.secret_ref.name == "far-db" else SHOP


def plan(**spec: Any) -> Any:
    queues = {**QUEUES, "far": {**queue("far"), "spec": {**queue("far")["spec"],
              "connection": {"secretRef": {"name": "far-db"}, "schema": "shopq"}}}}  # fmt: skip
    return plan_access("shop", "app", QueueUserSpec.model_validate(spec), queues, TOPICS, settings_of)


def test_a_plan_names_one_group_role_per_right_of_each_queue_and_topic():
    p = plan(
        queues=[{"name": "orders", "rights": ["send", "receive", "send"]}],
        topics=[{"name": "news", "rights": ["publish"]}],
    )
    assert p.login == login_role("shop", "app") and p.admin == SHOP
    assert [(g.kind, g.name, str(g.right)) for g in p.grants] == [
        ("queue", "orders", "send"), ("queue", "orders", "receive"), ("topic", "news", "publish"),
    ]  # fmt: skip
    assert p.groups == {
        group_role("shop", "shopq", "orders", "send"),
        group_role("shop", "shopq", "orders", "receive"),
        group_role("shop", "shopq", "topic:news", "publish"),
    }
    held = frozenset({group_role("shop", "shopq", "orders", "send")})
    assert granted(p, held) == [
        {"kind": "queue", "name": "orders", "rights": ["send"]},
        {"kind": "topic", "name": "news", "rights": []},
    ]


def test_a_pipes_plan_gives_each_group_the_tables_its_right_reads_and_writes():
    p = plan(queues=[{"name": "kept", "rights": ["send", "receive", "peek"]}])
    assert p.admin == EVENTS
    send, receive, peek = (g.tables for g in p.grants)
    assert ("MODIFY", "<table ks.kept_waiting>") in send and ("SELECT", "<table ks.kept_waiting>") not in send
    assert ("SELECT", "<table ks.dbq_queues>") in send and ("MODIFY", "<table ks.dbq_queues>") not in send
    # A receiver buries dead letters in the keeper's table, not in the queue's own.
    assert ("MODIFY", "<table ks2.keeper_dead>") in receive and not any("kept_dead" in t for _, t in receive)
    assert {p for p, _ in peek} == {"SELECT"} and ("SELECT", "<table ks.kept_content>") in peek
    assert plan(queues=[{"name": "orders", "rights": ["send"]}]).grants[0].tables == frozenset()


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"queues": [{"name": "ghost", "rights": ["send"]}]}, "spec.queues[0].name: there is no Queue ghost in namespace shop"),
        ({"queues": [{"name": "news", "rights": ["send"]}]}, "spec.queues[0].name: news is a Topic: list it under spec.topics"),
        ({"topics": [{"name": "orders", "rights": ["publish"]}]}, "spec.topics[0].name: orders is a Queue: list it under spec.queues"),
        ({"queues": [{"name": "orders", "rights": ["send"]}, {"name": "events-q", "rights": ["send"]}]},
         "spec.queues[1].name: events-q is on cass:9042 and orders on db:5432/shop"),
        ({"queues": [{"name": "orders", "rights": ["send"]}, {"name": "far", "rights": ["peek"]}]},
         "spec.queues[1].name: far is on db:5432/other and orders on db:5432/shop: one QueueUser is one login on one database"),
    ],
)  # fmt: skip
def test_what_cannot_be_had_is_refused_naming_the_field(spec, words):
    with pytest.raises(InvalidQueueUser) as refused:
        plan(**spec)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"queues": [{"name": "orders", "rights": ["delete"]}]},
        {"queues": [{"name": "orders", "rights": []}]},
        {"queues": [{"name": "shop/orders", "rights": ["send"]}]},
        {"topics": [{"name": "news", "rights": ["send"]}]},
        {"queues": [{"name": "orders", "rights": ["send"]}], "connectionLimit": 0},
        {"queues": [{"name": "orders", "rights": ["send"]}, {"name": "orders", "rights": ["peek"]}]},
    ],
)
def test_the_models_refuse_what_admission_refuses(spec):
    with pytest.raises(ValidationError):
        QueueUserSpec.model_validate(spec)


def test_role_names_fit_postgresql_and_differ_by_database_schema_queue_and_namespace():
    longest = group_role("d" * 63, "s" * 40, "q" * 40, "receive")
    assert len(longest) <= 63 and longest.startswith("dbq_r_qqq") and longest.endswith("_receive")
    assert len(login_role("n" * 63, "x" * 40)) <= 63
    assert group_role("a", "s", "q", "send") != group_role("b", "s", "q", "send")
    assert group_role("a", "s", "q", "send") != group_role("a", "s", "topic:q", "send")
    assert owner_role("a", "s") != owner_role("b", "s") and owner_role("a", "s").startswith("dbq_o_s_")
    assert login_role("ns1", "app") != login_role("ns2", "app")
    assert login_role("shop", "Weird.Name!").startswith("dbq_u_weird_name_")
    for bad in ("pg_execute_server_program", "dbq_access", "dbq_r_x; DROP ROLE y", "postgres"):
        with pytest.raises(UnsafeName):
            check_role(bad)


def test_the_example_manifest_is_valid():
    docs = list(yaml.safe_load_all((ROOT / "manifests" / "examples" / "queueuser.yaml").read_text()))
    assert [QueueUserResource.model_validate(d).metadata["name"] for d in docs] == [
        "orders-producer",
        "orders-worker",
    ]


def test_applications_on_the_operators_login_are_warned_of_once_when_they_appear():
    from dbq.controller.reconcile import shared_login

    [warning] = shared_login(0, 3)
    assert (
        warning.type == "Warning" and warning.reason == "AdminSecretInUse" and "QueueUser" in warning.message
    )
    assert (
        shared_login(None, 1)
        and not shared_login(2, 5)
        and not shared_login(4, 0)
        and not shared_login(None, None)
    )
