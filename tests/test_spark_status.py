"""`dbq-queues`, `dbq-stats` and `dbq-archive` on local Spark, after a known workload on three
queues (two rings on PostgreSQL, pipes on Cassandra; ring-a and pipes-c archive) reconciled and
measured by the real operator."""

from __future__ import annotations

import re
import secrets
import time
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from dbq.client import connect
from dbq.errors import InvalidSpec
from dbq.spark import register
from dbq.spark.health import health
from docgen.examples import in_namespace, pages_with_examples
from tests.manifests import pipes_queue, queue
from tests.operator_harness import Operator, operator_namespace, wait_for

# name -> (pushed, popped) of the workload
WORKLOAD = {"ring-a": (30, 10), "ring-b": (5, 0), "pipes-c": (20, 5)}
ARCHIVED = ("ring-a", "pipes-c")  # with spec.archive


@pytest.fixture(scope="module")
def fleet(kube, postgres, cassandra, stack, spark, tmp_path_factory):
    cluster = operator_namespace(kube, postgres, "dbq-spark")
    cluster.secret("events-db", {"url": stack.cassandra.url()})
    schema, keyspace = f"spark_{secrets.token_hex(3)}", f"spark_{secrets.token_hex(3)}"
    every_5s = {"stats": {"interval": "5s"}}
    archive = {"archive": {"enabled": True}}
    for name in ("ring-a", "ring-b"):
        doc = queue(name, ring={"size": 2048}, **every_5s, **(archive if name in ARCHIVED else {}))
        doc["spec"]["connection"] = {"secretRef": {"name": "orders-db"}, "schema": schema}
        cluster.create(doc)
    cluster.create(pipes_queue("pipes-c", keyspace, **every_5s, **archive))
    operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("spark") / "operator.log")
    operator.start()
    for name in WORKLOAD:
        cluster.wait_condition(name, "Ready", "True", timeout=90)
    urls = {"ring-a": postgres.url, "ring-b": postgres.url, "pipes-c": stack.cassandra.url()}
    for name, (pushed, popped) in WORKLOAD.items():
        where = keyspace if name == "pipes-c" else schema
        with connect(urls[name], name.replace("-", "_"), schema=where) as q:
            q.push_many([b"m%d" % i for i in range(pushed)], headers={"n": 7, "from": name})
            taken = 0
            while taken < popped:
                taken += len(q.pop_many(popped - taken))

    def measured() -> bool:
        stats = {n: cluster.get(n).get("status", {}).get("stats") or {} for n in WORKLOAD}
        return all((s.get("pushed"), s.get("popped")) == WORKLOAD[n] for n, s in stats.items())

    wait_for(measured, 60, "status.stats with the workload's totals")
    time.sleep(6)  # one more sample in the history
    register(spark)
    yield cluster, kube, schema, keyspace, postgres, cassandra
    cluster.force_delete_all(120)
    operator.stop()


def test_dbq_queues_is_the_status_of_every_queue(fleet, spark):
    cluster, kube, *_ = fleet
    df = (
        spark.read.format("dbq-queues")
        .option("kubeconfig", kube.kubeconfig)
        .option("namespace", cluster.ns)
        .load()
    )
    # The rates' window still slides (every 5 s), so the status may be rewritten during the read.
    before = {name: cluster.get(name)["status"]["stats"]["pushRate"] for name in WORKLOAD}
    rows = {r["name"]: r for r in df.collect()}
    assert set(rows) == set(WORKLOAD)
    for name, (pushed, popped) in WORKLOAD.items():
        row, status = rows[name], cluster.get(name)["status"]
        assert row["ready"] is True and row["reason"] == "Provisioned" and row["namespace"] == cluster.ns
        assert (row["pushed"], row["popped"], row["depth"]) == (pushed, popped, pushed - popped)
        assert row["observed_generation"] == row["generation"] == 1 and row["ready_changed_at"] is not None
        assert row["measured_at"] is not None and row["push_rate"] in (
            before[name],
            status["stats"]["pushRate"],
        )
    assert rows["pipes-c"]["design"] == "pipes" and rows["ring-a"]["backend"] == "postgres"
    everywhere = spark.read.format("dbq-queues").option("kubeconfig", kube.kubeconfig).load()
    assert everywhere.filter(f"namespace = '{cluster.ns}'").count() == 3  # every namespace by default


def test_dbq_stats_has_one_row_per_history_sample(fleet, spark):
    cluster, kube, schema, keyspace, postgres, cassandra = fleet
    until = datetime.now(UTC)
    since = until - timedelta(hours=1)
    df = (
        spark.read.format("dbq-stats")
        .option("kubeconfig", kube.kubeconfig)
        .option("namespace", cluster.ns)
        .option("since", since.isoformat())
        .option("until", until.isoformat())
        .option("partitions", "3")
        .load()
    )
    assert df.rdd.getNumPartitions() == 9  # 3 queues x 3 time slices
    rows = df.collect()
    cur = postgres.connect().cursor()
    truth = {
        name: cur.execute(
            f'SELECT count(*) FROM "{schema}".dbq_stats_history WHERE queue = ? AND at >= ? AND at < ?',
            name.replace("-", "_"), since.replace(tzinfo=None), until.replace(tzinfo=None),
        ).fetchval()
        for name in ("ring-a", "ring-b")
    }  # fmt: skip
    truth["pipes-c"] = cassandra.execute(
        f'SELECT count(*) FROM "{keyspace}".dbq_stats_history WHERE queue = %s AND at >= %s AND at < %s',
        ("pipes_c", since, until),
    ).one()[0]
    counts = {name: sum(1 for r in rows if r["name"] == name) for name in WORKLOAD}
    assert counts == truth and all(n >= 2 for n in counts.values()), (counts, truth)
    for name, (pushed, popped) in WORKLOAD.items():
        last = max((r for r in rows if r["name"] == name), key=lambda r: r["at"])
        assert (last["pushed"], last["popped"], last["depth"]) == (pushed, popped, pushed - popped)


def test_dbq_archive_has_one_row_per_message_taken_from_an_archived_queue(fleet, spark):
    cluster, kube, *_ = fleet
    reader = (
        spark.read.format("dbq-archive").option("kubeconfig", kube.kubeconfig).option("namespace", cluster.ns)
    )
    rows = reader.option("since", "1h").load().collect()
    for name in ARCHIVED:
        mine = [r for r in rows if r["name"] == name]
        popped = WORKLOAD[name][1]
        assert sorted(r["body"] for r in mine) == sorted(b"m%d" % i for i in range(popped)), name
        assert len({r["id"] for r in mine}) == popped and all(r["pushed_at"] <= r["acked_at"] for r in mine)
        assert all(r["headers"] == {"n": "7", "from": name} for r in mine), mine[0]
    assert {r["name"] for r in rows} == set(ARCHIVED)  # ring-b keeps none
    assert {r["design"] for r in rows if r["name"] == "pipes-c"} == {"pipes"}
    later = reader.option("since", (datetime.now(UTC) + timedelta(minutes=1)).isoformat()).load()
    assert later.count() == 0
    with pytest.raises(Exception, match="ring-b keep no archive"):
        reader.option("queues", "ring-a,ring-b").load().collect()


def test_a_bad_option_is_refused_by_name(fleet, spark):
    _, kube, *_ = fleet
    with pytest.raises(Exception, match="unknown option 'sinse'"):
        spark.read.format("dbq-stats").option("kubeconfig", kube.kubeconfig).option(
            "sinse", "1h"
        ).load().collect()
    with pytest.raises(Exception, match="option partitions='0'"):
        spark.read.format("dbq-stats").option("kubeconfig", kube.kubeconfig).option(
            "partitions", "0"
        ).load().collect()
    with pytest.raises(InvalidSpec, match="write an ISO 8601 time"):
        from dbq.spark.options import Options

        Options("dbq-stats", {"since": "yesterday"}, {"since": ""}).time(
            "since", datetime.now(UTC), datetime.now(UTC)
        )


def test_dbq_drains_at_most_limit_messages_each_once(fleet, spark, stack, postgres):
    """Last in this module: it empties the queues the tests above measured."""
    cluster, kube, schema, keyspace, *_ = fleet
    with connect(postgres.url, "ring_b", schema=schema) as q:
        q.push_many([b"r%d" % i for i in range(1000)])  # after the workload's 5
    with connect(stack.cassandra.url(), "pipes_c", schema=keyspace) as q:
        q.push_many([b"p%d" % i for i in range(300)])  # after the workload's 15

    def drain(name: str, limit: int, partitions: int) -> list:
        reader = (
            spark.read.format("dbq").option("kubeconfig", kube.kubeconfig).option("namespace", cluster.ns)
        )
        df = (
            reader.option("queue", name)
            .option("mode", "drain")
            .option("limit", str(limit))
            .option("partitions", str(partitions))
            .load()
        )
        assert df.rdd.getNumPartitions() == partitions
        return df.collect()

    first, rest = drain("ring-b", 600, 3), drain("ring-b", 10_000, 2)
    ids = [r["id"] for r in first + rest]
    assert len(first) == 600 and len(rest) == 405 and len(set(ids)) == 1005
    assert {bytes(r["body"]) for r in first + rest} >= {b"r%d" % i for i in range(1000)}
    pipes = drain("pipes-c", 1000, 2)
    assert len(pipes) == len({r["id"] for r in pipes}) == 315
    with connect(postgres.url, "ring_b", schema=schema) as q:
        assert q.stats().depth == 0
    with pytest.raises(Exception, match="option limit is required"):
        spark.read.format("dbq").option("kubeconfig", kube.kubeconfig).option("queue", "ring-b").option(
            "mode", "drain"
        ).load().collect()


def test_the_spark_guide_runs_as_written(fleet, spark, monkeypatch, capsys):
    """The docs' `<!-- runnable: spark -->` examples, with this module's SparkSession as `spark`
    and its namespace for `shop` (tests/test_docs_examples.py runs the others). Last in the module:
    it takes a while, and the tests above compare rates the statistics ticks keep moving."""
    cluster, kube, *_ = fleet
    monkeypatch.setenv("KUBECONFIG", kube.kubeconfig)
    examples = [e for page in pages_with_examples("spark").values() for e in page]
    assert examples, "the Spark guide lost its runnable example"
    for example in examples:
        code = in_namespace(example.code, cluster.ns)
        exec(compile(code, str(example), "exec"), {"spark": spark})
    shown = capsys.readouterr().out
    for name in WORKLOAD:
        rows = re.findall(rf"^\|\s*{name}\|", shown, re.M)
        assert len(rows) == 2, (name, shown)  # a row in each of the two tables the example shows


def test_a_fleet_with_no_provisioned_queue_reads_as_empty(fleet, spark):
    """Spark calls a reader once with its default partition when partitions() returns none: the
    sources then give an empty DataFrame (they failed with a bare AssertionError), and the health
    job reports the Queues as not Ready."""
    cluster, kube, *_ = fleet
    namespace = f"{cluster.ns}-none"
    client.CoreV1Api(kube.api).create_namespace({"metadata": {"name": namespace}})
    try:
        unprovisioned = queue("never-ready")  # no operator watches this namespace
        client.CustomObjectsApi(kube.api).create_namespaced_custom_object(
            "dbq.dev", "v1alpha1", namespace, "queues", unprovisioned
        )
        for source in ("dbq-stats", "dbq-archive"):
            df = (
                spark.read.format(source)
                .option("kubeconfig", kube.kubeconfig)
                .option("namespace", namespace)
                .load()
            )
            assert df.count() == 0, source
        report = {r["name"]: r for r in health(spark, [namespace], kubeconfig=kube.kubeconfig).collect()}
        assert set(report) == {"never-ready"} and report["never-ready"]["not_ready"]
    finally:
        client.CoreV1Api(kube.api).delete_namespace(namespace)


def queue_user(cluster, name: str, queues: dict[str, list[str]]) -> None:
    """A QueueUser with these rights on these queues, Ready."""
    users = cluster.of("queueusers")
    users.create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser", "metadata": {"name": name},
                  "spec": {"queues": [{"name": q, "rights": r} for q, r in queues.items()]}})  # fmt: skip
    users.wait_condition(name, "Ready", "True", timeout=60)


def test_dbq_stats_reads_as_a_monitor_only_queue_user_what_the_queues_secret_reads(fleet, spark):
    """A Spark job that reads statistics needs no more than `monitor`: with a QueueUser holding only
    that, dbq-stats reads the same samples as with the Queues' own (the operator's) Secret; with a
    QueueUser that may only send, the read is refused."""
    cluster, kube, *_ = fleet
    queue_user(cluster, "spark-monitor", {"ring-a": ["monitor"], "ring-b": ["monitor"]})
    queue_user(cluster, "spark-sender", {"ring-a": ["send"], "ring-b": ["send"]})
    until = datetime.now(UTC)
    since = until - timedelta(hours=1)

    def read(**options: str):
        reader = spark.read.format("dbq-stats").option("kubeconfig", kube.kubeconfig)
        for key, value in {"namespace": cluster.ns, "queues": "ring-a,ring-b", "since": since.isoformat(),
                           "until": until.isoformat(), **options}.items():  # fmt: skip
            reader = reader.option(key, value)
        return sorted((r["name"], r["at"], r["pushed"], r["popped"]) for r in reader.load().collect())

    as_owner = read()
    assert as_owner and read(user="spark-monitor") == as_owner
    with pytest.raises(Exception, match="lacks the monitor right"):
        read(user="spark-sender")
