"""Topics and Subscriptions end to end: real API server (admission, CEL), real PostgreSQL, the
operator (`dbq run`) as its RBAC identity, and the publishing client and CLI."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest
from kubernetes.client.rest import ApiException

from dbq.client import connect, connect_topic_resource
from tests.manifests import pipes_queue, queue
from tests.operator_harness import Operator, operator_namespace, wait_for
from tests.test_operator import cli_for


@pytest.fixture(scope="module")
def env(kube, postgres, tmp_path_factory):
    cluster = operator_namespace(kube, postgres, "dbq-topics")
    operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("operator") / "operator.log")
    operator.start()
    yield cluster, operator, postgres
    for plural in ("subscriptions", "topics", "queues"):
        cluster.of(plural).force_delete_all(180)
    operator.stop()


def topic(name: str, schema: str, **spec) -> dict:
    base = {
        "backend": "postgres",
        "connection": {"secretRef": {"name": "orders-db"}, "schema": schema},
        **spec,
    }
    return {"apiVersion": "dbq.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name}, "spec": base}


def subscription(name: str, topic_name: str, queue_name: str, **spec) -> dict:
    base = {"topic": topic_name, "queue": queue_name, **spec}
    return {
        "apiVersion": "dbq.dev/v1alpha1",
        "kind": "Subscription",
        "metadata": {"name": name},
        "spec": base,
    }


def ring(name: str, schema: str, size: int = 64) -> dict:
    doc = queue(name, ring={"size": size})
    doc["spec"]["connection"]["schema"] = schema
    return doc


def routine_exists(postgres, schema: str, routine: str) -> bool:
    cur = postgres.connect().cursor()
    sql = "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE nspname = ? AND proname = ?"
    return bool(cur.execute(sql, schema, routine).fetchval())


def bodies(postgres, schema: str, name: str) -> list[bytes]:
    with connect(postgres.url, name, schema=schema) as q:
        return sorted(m.body for m in q.pop_many(100))


@pytest.fixture()
def shop(env):
    """A Topic `orders` with Queues eu-orders, big-orders and unrouted, and Subscriptions eu (region
    eu) and big-spend (amount >= 1000), in a schema of its own, all Ready."""
    cluster, _, postgres = env
    schema = f"tp_{secrets.token_hex(4)}"
    queues, topics, subs = cluster, cluster.of("topics"), cluster.of("subscriptions")
    for name in ("eu-orders", "big-orders", "unrouted"):
        queues.create(ring(name, schema))
    topics.create(topic("orders", schema, unroutedQueue="unrouted"))
    subs.create(
        subscription("eu", "orders", "eu-orders", filter={"headers": [{"key": "region", "eq": "eu"}]})
    )
    subs.create(subscription("big-spend", "orders", "big-orders", onFull="Drop",
                             filter={"headers": [{"key": "amount", "gte": 1000}]}))  # fmt: skip
    for name in ("eu", "big-spend"):
        subs.wait_condition(name, "Ready", "True", timeout=90, reason="Bound")
    topics.wait_condition("orders", "Ready", "True", timeout=90)
    yield cluster, postgres, schema
    for plural in ("subscriptions", "topics", "queues"):
        cluster.of(plural).force_delete_all(120)


def test_publish_routes_by_the_subscriptions_and_status_counts_it(shop, kube):
    cluster, postgres, schema = shop
    topics, subs = cluster.of("topics"), cluster.of("subscriptions")
    with connect_topic_resource("orders", cluster.ns, api_client=cluster.api) as publisher:
        both = publisher.publish(b"eu-big", headers={"region": "eu", "amount": 5000})
        eu = publisher.publish(b"eu-small", headers={"region": "eu", "amount": 10})
        big = publisher.publish(b"us-big", headers={"region": "us", "amount": 1000.0})
        none = publisher.publish(
            b"us-small", headers={"region": "us", "amount": "5000"}
        )  # text: not a number
    assert (
        set(both) == {"eu", "big-spend"}
        and set(eu) == {"eu"}
        and set(big) == {"big-spend"}
        and set(none) == {""}
    )
    assert bodies(postgres, schema, "eu_orders") == [b"eu-big", b"eu-small"]
    assert bodies(postgres, schema, "big_orders") == [b"eu-big", b"us-big"]
    assert bodies(postgres, schema, "unrouted") == [b"us-small"]

    def counted():
        status = topics.get("orders").get("status") or {}
        return status if status.get("published") == 4 else None

    status = wait_for(counted, 30, "the topic's counts")
    assert status["unrouted"] == 1 and status["subscriptions"] == 2 and status["rulesVersion"] >= 1
    assert {r["subscription"]: r["routed"] for r in status["routes"]} == {"eu": 2, "big-spend": 2}
    assert wait_for(lambda: subs.get("eu")["status"].get("routed") == 2 or None, 30, "eu's count")
    assert subs.get("big-spend")["status"]["queueName"] == "big_orders"
    shown = subprocess.run(["kubectl", "--kubeconfig", kube.kubeconfig, "-n", cluster.ns, "get", "topics,subscriptions"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "PUBLISHED" in shown and "UNROUTED" in shown and "ROUTED" in shown and "DROPPED" in shown, shown


def test_the_dbq_topics_spark_source_reads_topics_and_subscriptions_with_their_counts(shop, kube, spark):
    from dbq.spark import register

    cluster, _, _ = shop
    cluster.of("subscriptions").create(subscription("orphan", "no-topic", "eu-orders"))
    with connect_topic_resource("orders", cluster.ns, api_client=cluster.api) as publisher:
        publisher.publish_many([b"a", b"b", b"c"], headers={"region": "eu", "amount": 2000})
    topics = cluster.of("topics")
    wait_for(
        lambda: (topics.get("orders").get("status") or {}).get("published") == 3 or None, 30, "the counts"
    )
    wait_for(
        lambda: cluster.of("subscriptions").get("big-spend")["status"].get("routed") == 3 or None,
        30,
        "routed",
    )
    register(spark)
    df = (
        spark.read.format("dbq-topics")
        .option("kubeconfig", kube.kubeconfig)
        .option("namespace", cluster.ns)
        .load()
    )
    rows = {(r["topic"], r["subscription"]): r for r in df.collect()}
    assert set(rows) == {("orders", "eu"), ("orders", "big-spend"), ("no-topic", "orphan")}
    eu, big, orphan = rows["orders", "eu"], rows["orders", "big-spend"], rows["no-topic", "orphan"]
    assert eu["ready"] is True and eu["published"] == 3 and eu["unrouted"] == 0 and eu["rules_version"] >= 1
    assert (eu["queue"], eu["routed"], eu["subscription_ready"]) == ("eu-orders", 3, True)
    assert (big["on_full"], big["routed"], big["dropped"]) == ("Drop", 3, 0)
    assert orphan["ready"] is None and orphan["backend"] is None
    assert orphan["subscription_ready"] is False and orphan["subscription_reason"] == "TopicNotFound"


def test_a_subscription_added_changed_and_removed_changes_the_routing(shop):
    cluster, postgres, schema = shop
    subs = cluster.of("subscriptions")
    cluster.create(ring("all-orders", schema))
    subs.create(subscription("all", "orders", "all-orders"))
    subs.wait_condition("all", "Ready", "True", timeout=90, reason="Bound")
    with connect_topic_resource("orders", cluster.ns, api_client=cluster.api) as publisher:
        assert set(publisher.publish(b"one", headers={"region": "us"})) == {"all"}
        subs.patch("all", {"spec": {"filter": {"subject": [{"prefix": "order."}]}}})
        wait_for(lambda: (subs.get("all").get("status") or {}).get("observedGeneration") == 2 or None, 60,
                 "the changed filter in force")  # fmt: skip
        assert set(publisher.publish(b"other", subject="other")) == {""}
        assert set(publisher.publish(b"two", subject="order.created")) == {"all"}
        subs.delete("all")
        wait_for(lambda: not subs.exists("all"), 60, "the subscription gone")
        assert set(publisher.publish(b"three", subject="order.created")) == {""}
    assert bodies(postgres, schema, "all_orders") == [b"one", b"two"]


def test_deleting_a_topic_with_subscriptions_is_blocked_until_they_go(shop, postgres):
    cluster, _, schema = shop
    topics, subs = cluster.of("topics"), cluster.of("subscriptions")
    topics.delete("orders")
    blocked = topics.wait_condition("orders", "DeletionBlocked", "True", timeout=60, reason="TopicInUse")
    assert "big-spend, eu" in blocked["message"] and "force-delete" in blocked["message"]
    assert any(e.reason == "DeletionBlocked" for e in topics.events("orders"))
    assert routine_exists(postgres, schema, "orders_publish")
    for name in ("eu", "big-spend"):
        subs.delete(name)
    wait_for(lambda: not topics.exists("orders"), 90, "the topic deleted once its subscriptions went")
    assert not routine_exists(postgres, schema, "orders_publish")


def test_a_deleted_queue_leaves_its_subscription_not_ready_and_the_others_routed(shop):
    cluster, postgres, schema = shop
    subs = cluster.of("subscriptions")
    cluster.delete("big-orders")
    wait_for(lambda: not cluster.exists("big-orders"), 90, "the queue deleted")
    ready = subs.wait_condition("big-spend", "Ready", "False", timeout=60, reason="QueueNotFound")
    assert "big-orders" in ready["message"]
    assert cluster.of("topics").condition("orders", "Degraded")["status"] == "True"
    with connect_topic_resource("orders", cluster.ns, api_client=cluster.api) as publisher:
        assert set(publisher.publish(b"after", headers={"region": "eu", "amount": 5000})) == {"eu"}
    assert bodies(postgres, schema, "eu_orders") == [b"after"]


def test_a_subscription_to_a_queue_of_another_schema_is_stalled_with_the_reason(shop):
    cluster, _, schema = shop
    subs = cluster.of("subscriptions")
    cluster.create(ring("elsewhere", f"{schema}_x"))
    cluster.wait_condition("elsewhere", "Ready", "True", timeout=60)
    subs.create(subscription("lost", "orders", "elsewhere"))
    stalled = subs.wait_condition("lost", "Stalled", "True", timeout=60, reason="InvalidSpec")
    assert "schema" in stalled["message"] and "elsewhere" in stalled["message"]
    subs.create(subscription("orphan", "no-such-topic", "eu-orders"))
    orphan = subs.wait_condition("orphan", "Ready", "False", timeout=60, reason="TopicNotFound")
    assert "no-such-topic" in orphan["message"]


def test_dbq_publish_prints_where_each_message_went(shop, kube):
    cluster, postgres, schema = shop
    environ = {**os.environ, "KUBECONFIG": kube.kubeconfig}
    done = subprocess.run([sys.executable, "-m", "dbq.cli", "publish", "orders", "hello", "-H", "region=eu", "-n",
                           cluster.ns, "-o", "json"], env=environ, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [set(r) for r in json.loads(done.stdout)["routed"]] == [{"eu"}]
    url = subprocess.run([sys.executable, "-m", "dbq.cli", "publish", "orders", "-s", "x", "--url", postgres.url,
                          "--schema", schema], input="a\nb\n", env=environ, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert url.returncode == 0 and url.stdout.splitlines()[0].startswith("(unrouted queue)="), url
    missing = subprocess.run([sys.executable, "-m", "dbq.cli", "publish", "nope", "m", "-n", cluster.ns],
                             env=environ, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode != 0 and "no Topic nope" in missing.stderr


@pytest.mark.parametrize(
    ("kind", "doc", "words"),
    [
        ("topics", topic("bad-backend", "s", backend="sqlserver", design="ring"), "sqlserver topics are not provided"),
        ("subscriptions", subscription("two-ops", "t", "q", filter={"headers": [{"key": "a", "eq": 1, "gt": 0}]}),
         "exactly one operator"),
        ("subscriptions", subscription("bad-value", "t", "q", filter={"headers": [{"key": "a", "eq": 1.5}]}),
         "spec.filter.headers[0].eq in body must be of type integer,string"),
        ("subscriptions", subscription("bad-full", "t", "q", onFull="Block"), "onFull"),
        ("subscriptions", subscription("has.dot", "t", "q"), "metadata.name"),
    ],
)  # fmt: skip
def test_admission_refuses_bad_topics_and_subscriptions_by_field(env, kind, doc, words):
    cluster, _, _ = env
    with pytest.raises(ApiException) as refused:
        cluster.of(kind).create(doc)
    assert refused.value.status == 422 and words in refused.value.body, refused.value.body


def test_admission_keeps_a_subscription_s_references_immutable(env):
    cluster, _, _ = env
    subs = cluster.of("subscriptions")
    subs.create(subscription("fixed", "some-topic", "some-queue"))
    with pytest.raises(ApiException) as refused:
        subs.patch("fixed", {"spec": {"queue": "other-queue"}})
    assert refused.value.status == 422 and "spec.queue cannot change after creation" in refused.value.body
    subs.patch("fixed", {"spec": {"onFull": "Drop"}})  # what is not a reference may change
    assert subs.get("fixed")["spec"]["onFull"] == "Drop"


def test_a_topic_on_cassandra_routes_into_pipes_queues_and_follows_its_subscriptions(
    env, kube, cassandra, stack
):
    """The same resources on Cassandra: the operator records the rules in the keyspace, a
    publisher routes by them, the status counts, and a Subscription removed stops its copies."""
    cluster, _, _ = env
    host, _ = stack.cassandra.contact
    cluster.secret("events-db", {"url": stack.cassandra.url()})
    keyspace = f"tc_{secrets.token_hex(4)}"
    topics, subs = cluster.of("topics"), cluster.of("subscriptions")
    for name in ("eu-events", "all-events"):
        cluster.create(pipes_queue(name, keyspace))
    topics.create(topic("events", keyspace, backend="cassandra", design="pipes",
                        connection={"secretRef": {"name": "events-db"}, "schema": keyspace}))  # fmt: skip
    subs.create(
        subscription("eu", "events", "eu-events", filter={"headers": [{"key": "region", "eq": "eu"}]})
    )
    subs.create(subscription("all", "events", "all-events"))
    for name in ("eu", "all"):
        subs.wait_condition(name, "Ready", "True", timeout=120, reason="Bound")
    topics.wait_condition("events", "Ready", "True", timeout=90)
    with connect_topic_resource("events", cluster.ns, api_client=cluster.api) as publisher:
        assert set(publisher.publish(b"eu-1", headers={"region": "eu"})) == {"eu", "all"}
        assert set(publisher.publish(b"us-1", headers={"region": "us"})) == {"all"}
    dbq = cli_for(kube, cluster.ns)
    published = dbq("publish", "events", "-H", "region=eu", "-o", "json", stdin="eu-2\n")
    assert published.returncode == 0, published.stderr
    assert set(json.loads(published.stdout)["routed"][0]) == {"eu", "all"}

    def counted():
        status = topics.get("events").get("status") or {}
        return status if status.get("published") == 3 else None

    status = wait_for(counted, 60, "the topic's counts")
    assert {r["subscription"]: r["routed"] for r in status["routes"]} == {"eu": 2, "all": 3}
    assert (status["unrouted"], status["subscriptions"]) == (0, 2) and host in status["endpoint"]
    with connect(stack.cassandra.url(), "eu_events", schema=keyspace) as q:
        got = []  # two publishers, two pipes: a take reads one pipe
        while batch := q.pop_many(10, timeout=1):
            got += [m.body for m in batch]
        assert sorted(got) == [b"eu-1", b"eu-2"]

    version = status["rulesVersion"]
    subs.delete("eu")
    wait_for(lambda: (topics.get("events").get("status") or {}).get("rulesVersion", 0) > version or None, 60,
             "the rules without eu")  # fmt: skip
    with connect_topic_resource("events", cluster.ns, api_client=cluster.api) as publisher:
        assert set(publisher.publish(b"eu-3", headers={"region": "eu"})) == {"all"}
    subs.delete("all")
    topics.delete("events")
    wait_for(lambda: not topics.exists("events") or None, 60, "the topic deleted")
    with connect(stack.cassandra.url(), "all_events", schema=keyspace) as q:
        while q.pop_many(10, timeout=1):  # a Queue is deleted once empty (deletionPolicy DeleteIfEmpty)
            pass
    for name in ("eu-events", "all-events"):
        cluster.delete(name)
        wait_for(lambda name=name: not cluster.exists(name) or None, 90, f"Queue {name} deleted")

    def keyspace_gone() -> bool | None:
        found = cassandra.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
        )
        return not found.all() or None

    wait_for(keyspace_gone, 30, "the keyspace dropped with its last queue and topic")
