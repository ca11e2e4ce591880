"""The `dbq` source read and written by real Spark jobs: peek, a streaming read whose driver is
killed twice (ring: 100,000 messages, pipes: 20,000), a batch write with a failed task, and a
streaming write replayed after a restart. Queues provisioned by the real operator."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from dbq.client import connect
from dbq.contract.headers import StoredHeaders
from dbq.errors import InvalidSpec
from dbq.spark import register
from dbq.spark.options import Options
from dbq.spark.queue_source import QUEUE_OPTIONS, QueueStreamWriter, QueueWriter, StreamReader, move_in_blocks
from dbq.spark.staging import staging_of
from tests.manifests import pipes_queue, queue
from tests.operator_harness import Operator, operator_namespace, wait_for

ROOT = Path(__file__).resolve().parents[1]
QUICK = {
    # stalledAfter: a driver killed inside a ring move leaves its messages as orphans until then
    "timeouts": {"visibility": "5s", "popWait": "0s", "stalledAfter": "10s"},
    "cleanup": {"interval": "5s"},
}
PER_TRIGGER = 5_000


@pytest.fixture(scope="module")
def queues(kube, postgres, cassandra, stack, spark, tmp_path_factory):
    cluster = operator_namespace(kube, postgres, "dbq-sparkq")
    cassandra_url = stack.cassandra.url()
    cluster.secret("events-db", {"url": cassandra_url})
    schema, keyspace = f"sq_{secrets.token_hex(3)}", f"sq_{secrets.token_hex(3)}"
    for name in ("stream-ring", "write-ring"):
        doc = queue(name, ring={"size": 16384, "messageBytes": 64}, **QUICK)
        doc["spec"]["connection"]["schema"] = schema
        cluster.create(doc)
    cluster.create(pipes_queue("stream-pipes", keyspace, **QUICK))
    operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("sparkq") / "operator.log")
    operator.start()
    for name in ("stream-ring", "write-ring", "stream-pipes"):
        cluster.wait_condition(name, "Ready", "True", timeout=90)
    register(spark)
    clients = {
        "stream-ring": lambda: connect(postgres.url, "stream_ring", schema=schema),
        "write-ring": lambda: connect(postgres.url, "write_ring", schema=schema),
        "stream-pipes": lambda: connect(cassandra_url, "stream_pipes", schema=keyspace),
    }
    yield cluster, kube, clients, (postgres, schema)
    cluster.force_delete_all(120)
    operator.stop()


def job(*args: str, log: Path) -> subprocess.Popen:
    """A Spark job in a process group of its own (Python driver and its JVM), logging to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark_jobs", *args],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def batches_with_data(log: Path) -> int:
    return sum(
        1 for line in log.read_text().splitlines() if line.startswith("batch ") and not line.endswith(" 0")
    )


def consume_with_kills(
    cluster, kube, name: str, tmp: Path, kills: int = 2, after: Path | None = None
) -> list:
    """Stream `name` into Parquet; SIGKILL the driver after 2 batches with data, `kills` times,
    restarting from the checkpoint; then let it run until the queue stays empty (and, with
    `after`, that file exists: the feeder is done)."""
    common = ["consume", "--kubeconfig", kube.kubeconfig, "--namespace", cluster.ns, "--queue", name,
              "--sink", str(tmp / "sink"), "--checkpoint", str(tmp / "checkpoint"),
              "--per-trigger", str(PER_TRIGGER), "--idle-exit", "25"]  # fmt: skip
    if after is not None:
        common += ["--after", str(after)]
    for run in range(kills):
        log = tmp / f"run{run}.log"
        proc = job(*common, log=log)
        try:
            wait_for(
                lambda p=proc, f=log: batches_with_data(f) >= 2 or p.poll() is not None, 180, "two batches"
            )
            assert proc.poll() is None, log.read_text()[-3000:]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"run {run}: killed after {batches_with_data(log)} batches with data")
    log = tmp / "final.log"
    proc = job(*common, log=log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    return [(bytes(r["body"]), r["id"]) for r in _read_parquet(tmp / "sink")]


def _read_parquet(path: Path) -> list:
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate().read.parquet(str(path)).collect()


def check_consumed(rows: list, bodies: set[bytes], client, kills: int) -> None:
    got = [body for body, _ in rows]
    duplicates = len(got) - len(set(got))
    print(f"{len(got)} rows in the sink, {len(set(got))} distinct, {duplicates} duplicates")
    with client() as q:
        stats = q.stats()
        lost = bodies - set(got)
        assert not lost, f"lost {len(lost)}, from {min(lost)!r} to {max(lost)!r}; the queue: {stats}"
        assert duplicates <= kills * PER_TRIGGER  # only from the kills: at most a batch in flight each
        assert (stats.depth, stats.in_flight) == (0, 0), stats
        # The last batch's rows went when the query next asked for data, the batch being durable.
        assert staging_of(q).last("read:default") is None


def test_a_streaming_read_survives_two_driver_kills_on_a_ring(queues, tmp_path):
    cluster, kube, clients, _ = queues
    total = 100_000
    bodies = {b"s%06d" % i for i in range(total)}

    fed = tmp_path / "fed"

    def feed() -> None:  # the ring holds 16384: pushes wait for room while the stream consumes
        try:
            with clients["stream-ring"]() as q:
                ordered = sorted(bodies)
                for start in range(0, total, 1000):
                    q.push_many(ordered[start : start + 1000], timeout=300)
        finally:
            fed.touch()

    with ThreadPoolExecutor(1) as pool:
        pushed = pool.submit(feed)
        rows = consume_with_kills(cluster, kube, "stream-ring", tmp_path, after=fed)
        pushed.result()  # a pusher that failed says why
    check_consumed(rows, bodies, clients["stream-ring"], kills=2)


def test_a_streaming_read_survives_two_driver_kills_on_pipes(queues, tmp_path):
    cluster, kube, clients, _ = queues
    bodies = {b"p%05d" % i for i in range(20_000)}
    with clients["stream-pipes"]() as q:
        ordered = sorted(bodies)
        for start in range(0, len(ordered), 500):
            q.push_many(ordered[start : start + 500])
    rows = consume_with_kills(cluster, kube, "stream-pipes", tmp_path)
    check_consumed(rows, bodies, clients["stream-pipes"], kills=2)


def test_peek_reads_waiting_messages_and_takes_none(queues, spark):
    cluster, kube, clients, _ = queues
    for name, n in (("write-ring", 30), ("stream-pipes", 25)):
        with clients[name]() as q:
            q.push_many(
                [b"k%d" % i for i in range(n)], headers=[{"i": i} if i % 2 else None for i in range(n)]
            )
            leased = q.acquire_many(5, visibility=60)
        df = (
            spark.read.format("dbq").option("kubeconfig", kube.kubeconfig).option("namespace", cluster.ns)
            .option("queue", name).option("limit", "100").load()
        )  # fmt: skip
        rows = df.collect()
        waiting = {b"k%d" % i for i in range(n)} - {m.body for m in leased}
        assert {bytes(r["body"]) for r in rows} == waiting and len(rows) == n - 5
        for r in rows:  # the headers column: a map of names to text, empty for none
            i = int(bytes(r["body"])[1:])
            assert r["headers"] == ({"i": str(i)} if i % 2 else {}), r
        assert len(spark.read.format("dbq").option("kubeconfig", kube.kubeconfig).option(
            "namespace", cluster.ns).option("queue", name).option("limit", "7").load().collect()) == 7  # fmt: skip
        with clients[name]() as q:
            assert q.stats().depth == n - 5  # nothing taken by peeking
            q.ack_many(leased)
            taken = 0
            while taken < n - 5:
                taken += len(q.pop_many(n))


def test_a_batch_write_with_a_failed_task_pushes_each_row_once(queues, tmp_path):
    cluster, kube, clients, (postgres, schema) = queues
    with clients["write-ring"]() as q:
        pushed_before = q.stats().pushed
    log = tmp_path / "write.log"
    proc = job("write", "--kubeconfig", kube.kubeconfig, "--namespace", cluster.ns, "--queue", "write-ring",
               "--rows", "100000", "--partitions", "4", "--fail-once", str(tmp_path / "failed"), log=log)  # fmt: skip
    # The ring holds 16384: drain while the job's commit pushes.
    got: list[bytes] = []
    with clients["write-ring"]() as q:
        while proc.poll() is None or q.stats().depth:
            got += [m.body for m in q.pop_many(1000, timeout=0.5)]
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert (tmp_path / "failed").exists()  # the failure was injected
    assert "injected task failure" in log.read_text()
    assert len(got) == 100_000 and set(got) == {b"w%d" % n for n in range(100_000)}
    with clients["write-ring"]() as q:
        assert q.stats().pushed - pushed_before == 100_000
    staged = (
        postgres.connect().cursor().execute(f'SELECT count(*) FROM "{schema}".write_ring_staged').fetchval()
    )
    assert staged == 0  # the failed attempt's rows went with the stage


def test_a_replayed_streaming_batch_is_not_pushed_twice(queues):
    """The sink's commit for one batch id, made twice (a replay after a restart), pushes once;
    a task attempt that reported nothing is never pushed."""
    cluster, kube, clients, _ = queues
    from pyspark.sql.types import BinaryType, StructField, StructType

    options = {
        "kubeconfig": kube.kubeconfig,
        "namespace": cluster.ns,
        "queue": "write-ring",
        "sink": "replay",
    }
    schema = StructType([StructField("body", BinaryType())])
    writer = QueueStreamWriter(Options("dbq", options, QUEUE_OPTIONS), schema)
    for _replay in range(2):
        done = writer.write(iter([(b"b7-%d" % i,) for i in range(300)]))
        writer.write(iter([(b"lost-attempt",)]))  # a failed attempt: its message never arrives
        writer.commit([done, None], batchId=7)
    with clients["write-ring"]() as q:
        got = [m.body for m in q.pop_many(1000, timeout=1)]
    assert sorted(got) == sorted(b"b7-%d" % i for i in range(300))
    with pytest.raises(Exception, match="option sink"):
        QueueStreamWriter(Options("dbq", {**options, "sink": ""}, QUEUE_OPTIONS), schema)


def test_a_written_headers_column_becomes_each_messages_headers(queues):
    """A DataFrame with a `headers` map column: each row's map is its message's headers; a
    column of another type is refused by name."""
    cluster, kube, clients, _ = queues
    from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType

    options = Options("dbq", {"kubeconfig": kube.kubeconfig, "namespace": cluster.ns, "queue": "write-ring"},
                      QUEUE_OPTIONS)  # fmt: skip
    schema = StructType(
        [StructField("body", BinaryType()), StructField("headers", MapType(StringType(), StringType()))]
    )
    writer = QueueWriter(options, schema)
    done = writer.write(
        iter([(b"h1", {"trace": "t1", "content-type": "text/plain"}), (b"h2", None), (b"h3", {})])
    )
    writer.commit([done])
    with clients["write-ring"]() as q:
        got = {m.body: m.headers for m in q.pop_many(10, timeout=1)}
    assert got == {b"h1": {"trace": "t1", "content-type": "text/plain"}, b"h2": {}, b"h3": {}}
    # A row's headers are checked when the task stages it: a bad one fails the task, by row.
    for bad, error in (
        ({"bad name": "v"}, "row 2 of this task: header name 'bad name' is not valid"),
        ({"k": None}, "row 2 of this task: header 'k' is a string, integer, float or boolean, not NoneType"),
        ({"dbq-error": "x"}, "row 2 of this task: header 'dbq-error': names starting with 'dbq-'"),
        (
            {"big": "x" * 2000},
            r"row 2 of this task: headers of 2010 bytes .* spec.messages.headerBytes \(1024\)",
        ),
    ):
        with pytest.raises(InvalidSpec, match=error):
            writer.write(iter([(b"fine", None), (b"refused", bad)]))
    with pytest.raises(InvalidSpec, match="column headers is int: make it a map<string,string>"):
        QueueWriter(
            options, StructType([StructField("body", BinaryType()), StructField("headers", IntegerType())])
        )


@pytest.mark.parametrize("name", ["write-ring", "stream-pipes"])
def test_a_stopped_stream_gives_back_what_it_staged_ahead(queues, name):
    """Driven as Spark drives it: the next batch is staged while one runs; at stop, what Spark
    never got goes back onto the queue, and what it got stays staged for a restart."""
    cluster, kube, clients, _ = queues
    options = {"kubeconfig": kube.kubeconfig, "namespace": cluster.ns, "queue": name, "stream": "ahead"}
    bodies = {b"a%04d" % i for i in range(250)}
    # Headers come back as they were, dbq's own keys too (a redriven message's, say).
    stored = '{"dbq-attempts":3,"dbq-error":"boom","trace":"t"}'
    with clients[name]() as q:
        q.push_many(sorted(bodies), headers=[StoredHeaders(stored)] * len(bodies))
    reader = StreamReader(Options("dbq", {**options, "batch": "40"}, QUEUE_OPTIONS))
    end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(100))
    got = [
        bytes(b)
        for p in reader.partitions({"seq": 0}, end)
        for r in reader.read(p)
        for b in r.column("body").to_pylist()
    ]
    assert len(got) == 100 and set(got) <= bodies
    reader._settle()  # the next batch is staged ahead
    with clients[name]() as q:
        ahead = len(staging_of(q).rows("read:ahead", end["seq"], 2**62))
        assert ahead == 100 and q.stats().depth == 50
    reader.stop()
    with clients[name]() as q:
        assert staging_of(q).rows("read:ahead", end["seq"], 2**62) == []  # given back
        assert {r.body for r in staging_of(q).rows("read:ahead", 0, end["seq"])} == set(got)  # kept
        back: list[Any] = []
        while len(back) < 150:
            back += q.pop_many(150, timeout=1)
        assert {m.body for m in back} == bodies - set(got)
        assert all(m.headers == {"dbq-attempts": 3, "dbq-error": "boom", "trace": "t"} for m in back)
        staging_of(q).drop("read:ahead")
    # On an empty queue the offset stays where it is: Spark runs no batch.
    idle = StreamReader(Options("dbq", {**options, "stream": "idle", "batch": "10"}, QUEUE_OPTIONS))
    assert idle.latestOffset({"seq": 7}, ReadMaxRows(100)) == {"seq": 7}
    idle.stop()


def test_a_move_that_comes_back_short_leaves_its_share_to_another_mover():
    """CI once staged 60 of 100: one mover found nothing (its pipe was leased by the other
    mover's thread) after the other, counting that move as under way, had stopped at the cap.
    Forced here: the second mover's take waits until the first has taken twice, then finds
    nothing; the first must take the rest."""
    waiting = list(range(250))
    staged: dict[int, int] = {}  # seq -> message
    takes: dict[int, int] = {}  # thread -> takes that found messages
    lock = threading.Lock()
    second_arrived, first_took_twice = threading.Event(), threading.Event()
    leader: list[int] = []

    def take(first: int, want: int) -> int:
        me = threading.get_ident()
        with lock:
            leader[:] = leader or [me]
        if me != leader[0] and not first_took_twice.is_set():
            second_arrived.set()
            first_took_twice.wait(5)
            time.sleep(0.2)  # the first mover meanwhile sees the cap reached
            return 0
        second_arrived.wait(5)
        with lock:
            got = [waiting.pop(0) for _ in range(min(want, len(waiting)))]
            staged.update((first + 1 + i, m) for i, m in enumerate(got))
            takes[me] = takes.get(me, 0) + 1
            if takes[me] == 2:
                first_took_twice.set()
        return len(got)

    with ThreadPoolExecutor(2) as pool:
        last = move_in_blocks(take, 0, 100, 40, pool, 2)
    assert second_arrived.is_set() and first_took_twice.is_set()
    assert sorted(staged.values()) == list(range(100)) and len(waiting) == 150
    assert last == max(staged) == 140  # seqs 41-80 were the empty move's block


def test_a_ring_move_waits_for_a_position_being_written(queues):
    """A pusher that has drawn its position but not committed: the move waits for it rather
    than leaving the message behind until a pop finds the ring empty."""
    _, _, clients, (postgres, schema) = queues
    with clients["write-ring"]() as q:
        conn = postgres.connect()
        conn.autocommit = False  # the pusher's transaction stays open
        conn.cursor().execute(f'SELECT "{schema}".write_ring_push(?, 0)', b"late").fetchall()
        threading.Timer(0.3, conn.commit).start()
        staged = staging_of(q).take("read:late", 0, 10)
        assert staged == 1 and [r.body for r in staging_of(q).rows("read:late", 0, 10)] == [b"late"]
        staging_of(q).drop("read:late")
        conn.close()


def test_bad_options_are_refused_by_name(queues, spark):
    cluster, kube, *_ = queues
    base = spark.read.format("dbq").option("kubeconfig", kube.kubeconfig).option("namespace", cluster.ns)
    with pytest.raises(Exception, match="option mode='tail'"):
        base.option("queue", "write-ring").option("mode", "tail").load().collect()
    with pytest.raises(InvalidSpec, match="unknown option 'maxBytesPerTrigger'"):
        StreamReader(Options("dbq", {"queue": "write-ring", "maxBytesPerTrigger": "1m"}, QUEUE_OPTIONS))
    with pytest.raises(InvalidSpec, match="options mode and limit are for batch reads"):
        StreamReader(Options("dbq", {"queue": "write-ring", "limit": "10"}, QUEUE_OPTIONS))
    df = spark.createDataFrame([(1,)], "body int")
    with pytest.raises(Exception, match="cast it to binary or string"):
        df.write.format("dbq").option("kubeconfig", kube.kubeconfig).option("queue", "write-ring").mode(
            "append"
        ).save()
    with pytest.raises(Exception, match='mode\\("append"\\)'):
        spark.createDataFrame([(b"x",)], "body binary").write.format("dbq").option(
            "queue", "write-ring"
        ).mode("overwrite").save()
