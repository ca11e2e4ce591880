"""The local stack is made of real components: each test proves one of them works end to end."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from dbq.devstack.base import ManagedProcess

TEST_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.stacktest.dbq.dev"},
    "spec": {
        "group": "stacktest.dbq.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_kube_serves_a_crd_and_its_objects(kube):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(kube.api)
    try:
        ext.create_custom_resource_definition(TEST_CRD)
    except ApiException as e:
        assert e.status == 409  # left over from an earlier run: fine, it is the same CRD
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition("widgets.stacktest.dbq.dev")
        conds = {c.type: c.status for c in (crd.status.conditions or [])}
        if conds.get("Established") == "True":
            break
        time.sleep(0.5)
    else:
        pytest.fail("CRD never became Established")

    custom = client.CustomObjectsApi(kube.api)
    name = f"w-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "stacktest.dbq.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": 3},
    }
    # The CRD may be Established a moment before its endpoint is served.
    for _ in range(40):
        try:
            custom.create_namespaced_custom_object("stacktest.dbq.dev", "v1", "default", "widgets", body)
            break
        except ApiException as e:
            if e.status != 404:
                raise
            time.sleep(0.25)
    got = custom.get_namespaced_custom_object("stacktest.dbq.dev", "v1", "default", "widgets", name)
    assert got["spec"] == {"size": 3}
    # The schema is enforced by the real server: size must be >= 1.
    bad = {**body, "metadata": {"name": name + "-bad"}, "spec": {"size": 0}}
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("stacktest.dbq.dev", "v1", "default", "widgets", bad)
    assert err.value.status == 422
    custom.delete_namespaced_custom_object("stacktest.dbq.dev", "v1", "default", "widgets", name)


def test_kubectl_talks_to_the_local_apiserver(kube):
    out = subprocess.run(
        ["kubectl", "--kubeconfig", kube.kubeconfig, "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ok"


def test_postgres_table_through_pyodbc(postgres):
    conn = postgres.admin()  # the server itself, as its superuser (the operator may create nothing in public)
    cur = conn.cursor()
    cur.execute("CREATE TABLE stack_probe (id int PRIMARY KEY, body bytea NOT NULL)")
    cur.executemany("INSERT INTO stack_probe VALUES (?, ?)", [(i, bytes([i]) * i) for i in range(1, 6)])
    rows = cur.execute("SELECT id, body FROM stack_probe ORDER BY id").fetchall()
    assert [(r.id, bytes(r.body)) for r in rows] == [(i, bytes([i]) * i) for i in range(1, 6)]
    version = cur.execute("SELECT current_setting('server_version_num')::int").fetchval()
    assert version >= 150000
    port = cur.execute("SELECT current_setting('port')::int").fetchval()
    assert port != 5432, "tests must use the private cluster, never the system one"
    cur.execute("DROP TABLE stack_probe")


def test_cassandra_keyspace_and_table_through_the_driver(cassandra):
    ks = f"stack_probe_{uuid.uuid4().hex[:8]}"
    cassandra.execute(
        f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
    )
    try:
        cassandra.execute(f"CREATE TABLE {ks}.t (pk text, ck int, v blob, PRIMARY KEY (pk, ck))")
        insert = cassandra.prepare(f"INSERT INTO {ks}.t (pk, ck, v) VALUES (?, ?, ?)")
        for i in range(10):
            cassandra.execute(insert, ("p", i, bytes([i])))
        rows = list(cassandra.execute(f"SELECT ck, v FROM {ks}.t WHERE pk = 'p'"))
        assert [(r.ck, r.v) for r in rows] == [(i, bytes([i])) for i in range(10)]
        version = cassandra.execute("SELECT release_version FROM system.local").one().release_version
        assert version.startswith("5.0.")
    finally:
        cassandra.execute(f"DROP KEYSPACE {ks}")


def test_spark_computes_a_known_result(spark):
    from pyspark.sql import functions as F

    df = spark.range(1, 100_001)
    total = df.select(F.sum("id")).collect()[0][0]
    assert total == 100_000 * 100_001 // 2
    evens = df.filter(F.col("id") % 2 == 0).groupBy((F.col("id") % 10).alias("d")).count().collect()
    assert sorted((r.d, r["count"]) for r in evens) == [
        (0, 10_000),
        (2, 10_000),
        (4, 10_000),
        (6, 10_000),
        (8, 10_000),
    ]
    assert spark.version.startswith("4.")


def test_managed_process_stops_only_its_own_pid(tmp_path):
    """`down` kills by pid file and checks the command line, so a recycled pid is left alone."""
    mine = ManagedProcess("sleeper", tmp_path, marker="dbq-marker-sleep")
    pid = mine.start([sys.executable, "-c", "import time; time.sleep(60)", "dbq-marker-sleep"])
    # Until the child has exec'd, /proc/PID/cmdline is still its parent's (without the marker).
    deadline = time.monotonic() + 5
    while mine.pid() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mine.pid() == pid
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Point the pid file at a process that is not ours: it must not be recognised or killed.
        mine.pid_file.write_text(str(other.pid))
        assert mine.pid() is None
        assert mine.stop() is False
        assert other.poll() is None
        mine.pid_file.write_text(str(pid))
        assert mine.stop() is True
        assert mine.pid() is None
    finally:
        other.kill()
        other.wait()
