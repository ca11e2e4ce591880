"""The fleet-health job on a prepared fleet, measured by the real operator: one queue growing,
one draining at a known pace, one not Ready, one whose message is past the age threshold. It
flags exactly those, and its time to drain is within 10% of the workload's truth (the draining
goes on while the job runs, so that its window holds only paced pops)."""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import pytest

from dbq.client import Queue, connect
from dbq.spark.health import Thresholds, health, summary
from tests.manifests import queue
from tests.operator_harness import Operator, operator_namespace

WORKLOAD_S = 30.0
GROW_MOST = 1000  # pushes to grow-q at the most (its ring holds 1024): about 4 minutes
PUSH_PER_S, POP_PER_S, PREFILL = 4, 10, 1000  # the ring holds 1024


def paced(count: int, per_second: float, action, stop: threading.Event | None = None) -> threading.Thread:
    def run() -> None:
        start = time.monotonic()
        for i in range(count):
            if stop is not None and stop.is_set():
                return
            action()
            time.sleep(max(0.0, start + (i + 1) / per_second - time.monotonic()))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def fleet(kube, postgres, spark, tmp_path_factory):
    cluster = operator_namespace(kube, postgres, "dbq-health")
    schema = f"health_{secrets.token_hex(3)}"
    for name in ("grow-q", "drain-q", "old-q", "broken-q"):
        doc = queue(name, stats={"interval": "5s"}, ring={"size": 1024})
        doc["spec"]["connection"] = {"secretRef": {"name": "orders-db"}, "schema": schema}
        if name == "broken-q":
            doc["spec"]["connection"]["secretRef"]["name"] = "missing-db"
        cluster.create(doc)
    operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("health") / "operator.log")
    operator.start()
    queues: dict[str, Queue] = {}
    # The paced pops and pushes go on until the module is done, so that the health job's window
    # holds no idle tail however long the job takes to start (CI once saw a slope of 3.1 for 4).
    done = threading.Event()
    drainer: threading.Thread | None = None
    grower: threading.Thread | None = None
    try:  # whatever fails here, the operator stops (it would go on writing the queues' status)
        for name in ("grow-q", "drain-q", "old-q"):
            cluster.wait_condition(name, "Ready", "True", timeout=90)
        cluster.wait_condition("broken-q", "Ready", "False", reason="SecretNotFound")
        for n in ("grow-q", "drain-q", "old-q"):
            queues[n] = connect(postgres.url, n.replace("-", "_"), schema=schema)
        queues["old-q"].push(b"forgotten")
        time.sleep(20)
        queues["drain-q"].push_many([b"d"] * PREFILL)
        drainer = paced(PREFILL, POP_PER_S, lambda: queues["drain-q"].pop_many(1), done)
        grower = paced(GROW_MOST, PUSH_PER_S, lambda: queues["grow-q"].push(b"g"), done)
        time.sleep(WORKLOAD_S)
        yield cluster, kube
    finally:
        done.set()
        for thread in (drainer, grower):
            if thread is not None:
                thread.join()
        for q in queues.values():
            q.close()
        cluster.force_delete_all(120)
        operator.stop()


def test_health_flags_exactly_the_troubled_queues(fleet, spark, tmp_path: Path):
    cluster, kube = fleet
    report = health(
        spark, [cluster.ns], window="25s", thresholds=Thresholds(oldest_age_s=40), kubeconfig=kube.kubeconfig
    )
    rows = {r["name"]: r for r in report.collect()}
    flags = {name: {f for f in ("not_ready", "growing", "falling_behind", "past_depth", "past_age") if r[f]}
             for name, r in rows.items()}  # fmt: skip
    assert flags == {
        "grow-q": {"growing", "falling_behind"},
        "drain-q": set(),
        "old-q": {"past_age"},
        "broken-q": {"not_ready"},
    }, {n: (flags[n], rows[n].asDict()) for n in rows}
    drain = rows["drain-q"]
    truth = drain["depth_now"] / POP_PER_S  # nothing pushed: the paced pops, still going, empty it
    print(
        f"time to drain: {drain['time_to_drain_s']:.1f} s, truth {truth:.1f} s (take rate {drain['take_rate']:.2f}/s)"
    )
    assert abs(drain["time_to_drain_s"] - truth) <= 0.10 * truth
    assert rows["grow-q"]["depth_slope_per_s"] == pytest.approx(PUSH_PER_S, rel=0.2)
    assert rows["broken-q"]["reason"] == "SecretNotFound" and rows["broken-q"]["not_ready_for_s"] > 20
    report.write.partitionBy("date").parquet(str(tmp_path / "report"))
    (partition,) = (tmp_path / "report").glob("date=*")
    assert (
        spark.read.parquet(str(tmp_path / "report")).count() == 4
        and partition.name == f"date={drain['date']}"
    )
    table = summary(list(rows.values()))
    assert table.row_count == 4 and "flags" in [c.header for c in table.columns]


def test_no_module_of_the_spark_package_shadows_the_standard_library():
    """spark-submit runs a job by path (`.../dbq/spark/health.py`), which puts that directory
    first on sys.path: a module there named like a standard one (it once was `queue`) breaks
    pyarrow's `from queue import Queue` in the driver."""
    import sys

    import dbq.spark

    package = Path(dbq.spark.__file__).parent
    assert not {p.stem for p in package.glob("*.py")} & set(sys.stdlib_module_names)


def test_the_health_job_runs_with_a_monitor_only_queue_user(fleet, spark):
    """The job reads every queue's history as a QueueUser that may only monitor them, and finds
    what it finds with the Queues' own (the operator's) Secret."""
    cluster, kube = fleet
    users = cluster.of("queueusers")
    users.create({"apiVersion": "dbq.dev/v1alpha1", "kind": "QueueUser", "metadata": {"name": "health-job"},
                  "spec": {"queues": [{"name": n, "rights": ["monitor"]} for n in ("grow-q", "drain-q", "old-q")]}})  # fmt: skip
    users.wait_condition("health-job", "Ready", "True", timeout=60)

    def read(user: str = "") -> dict[str, tuple[object, ...]]:
        rows = health(spark, [cluster.ns], window="10m", kubeconfig=kube.kubeconfig, user=user).collect()
        return {r["name"]: (r["not_ready"], (r["samples"] or 0) > 0, r["past_age"]) for r in rows}

    as_user = read("health-job")
    assert as_user == read() and set(as_user) == {"grow-q", "drain-q", "old-q", "broken-q"}
