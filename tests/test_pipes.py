"""Cassandra pipes queues on the real local Cassandra: planning, provisioning, client semantics,
conservation with 4 pushers and 4 poppers, and killed clients."""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cassandra.cluster import Cluster, NoHostAvailable

from dbq.api.models import DeadLetter, QueueSpec
from dbq.backends import open_backend
from dbq.backends.cassandra import cql
from dbq.backends.cassandra.plan import (
    PipesObserved,
    PipesTarget,
    RecordedPipes,
    TableOptions,
    is_new,
    plan_pipes,
)
from dbq.client import PipeMessage, PipesQueue, QueueError, QueueNotFound, connect
from dbq.client.pipes import tuning as pipes_tuning
from dbq.connection import from_url
from dbq.contract.pipes import PIPES_SCHEMA_VERSION
from dbq.errors import DeadLetterQueueNotFound, InvalidSpec
from dbq.names import QueueNames
from tests.workers import finish, kill, read_logs, start

KEYSPACE = f"dbq_pipes_{uuid.uuid4().hex[:6]}"

# --- planning (pure) ---------------------------------------------------------------------------

NAMES = QueueNames(schema="ks", queue="q")
TARGET = PipesTarget(
    NAMES, {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "1"}, 500, 60000
)
GOOD = TableOptions(cql.GC_GRACE_SECONDS, cql.COMPACTION | cql.COMPACTION_OPTIONS | {"max_threshold": "32"})


def complete(**changes: Any) -> PipesObserved:
    base: dict[str, Any] = dict(
        keyspace_exists=True,
        replication=dict(TARGET.replication),
        tables={
            t: GOOD
            for t in (
                "dbq_queues",
                "dbq_stats_history",
                "q_pipes",
                "q_state",
                "q_waiting",
                "q_pending",
                "q_staged",
                "q_dead",
                "q_delayed",
                "q_archive",
                "q_content",
            )
        },
        recorded=RecordedPipes(PIPES_SCHEMA_VERSION, 500, 60000, max_body_bytes=1 << 20),
        meta_columns=frozenset(
            {
                "queue",
                "schema_version",
                "max_attempts",
                "archive_ttl_s",
                "dead_letter_queue",
                "header_bytes",
                "max_headers",
                "max_body_bytes",
            }
        ),
        dead_columns=frozenset({"bucket", "id", "source"}),
    )
    return PipesObserved(**(base | changes))


def actions(observed: PipesObserved) -> list[str]:
    return [str(s) for s in plan_pipes(TARGET, observed)]


def test_plan_from_nothing_creates_everything_in_order():
    assert actions(PipesObserved()) == [
        "create_keyspace",
        "create_table:dbq_queues",
        "create_table:dbq_stats_history",
        "create_table:q_pipes",
        "create_table:q_state",
        "create_table:q_waiting",
        "create_table:q_pending",
        "create_table:q_staged",
        "create_table:q_dead",
        "create_table:q_delayed",
        "create_table:q_archive",
        "create_table:q_content",
        "record_settings",
    ]


def test_a_queue_is_new_only_when_none_of_its_tables_or_its_metadata_row_exist():
    shared = complete(
        tables={t: GOOD for t in ("dbq_queues", "dbq_stats_history", "other_pipes")}, recorded=None
    )
    assert is_new(TARGET, PipesObserved()) and is_new(TARGET, shared)  # other queues' keyspace and tables
    assert not is_new(TARGET, complete())
    assert not is_new(TARGET, complete(tables={"q_dead": GOOD}, recorded=None))  # its dead letters
    assert not is_new(TARGET, PipesObserved(recorded=complete().recorded))


def test_plan_of_a_complete_queue_is_empty():
    assert actions(complete()) == []


def test_plan_repairs_drift_and_follows_spec_changes():
    nts = {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3"}
    steps = plan_pipes(TARGET, complete(replication=nts))
    assert [str(s) for s in steps] == ["alter_keyspace"]
    assert "nodetool repair" in steps[0].why
    tables = complete().tables | {"q_waiting": TableOptions(864000, GOOD.compaction)}
    tables.pop("q_pending")
    assert actions(complete(tables=tables)) == ["tune_table:q_waiting", "create_table:q_pending"]
    stcs = TableOptions(cql.GC_GRACE_SECONDS, {"class": "SizeTieredCompactionStrategy"})
    assert actions(complete(tables=complete().tables | {"q_pipes": stcs})) == ["tune_table:q_pipes"]
    assert actions(complete(recorded=RecordedPipes(PIPES_SCHEMA_VERSION, 100, 60000))) == ["record_settings"]


def test_a_body_limit_past_what_a_pipe_stores_is_refused_by_name():
    """spec.messages.maxBytes: up to 8 MiB on pipes (a Spark job stages a body in one Cassandra
    mutation), and headerBytes up to 16 KiB (headers move in logged batches, which Cassandra
    refuses past 50 KiB); a smaller limit is recorded for the clients."""
    with pytest.raises(InvalidSpec, match=r"spec\.messages\.maxBytes is 8388609, .* at most 8388608 bytes"):
        plan_pipes(
            PipesTarget(NAMES, TARGET.replication, 500, 60000, max_body_bytes=(8 << 20) + 1), complete()
        )
    with pytest.raises(InvalidSpec, match=r"spec\.messages\.headerBytes is 20000, .* at most 16384 bytes"):
        plan_pipes(PipesTarget(NAMES, TARGET.replication, 500, 60000, header_bytes=20_000), complete())
    smaller = PipesTarget(NAMES, TARGET.replication, 500, 60000, max_body_bytes=4096)
    [step] = plan_pipes(smaller, complete())
    assert str(step) == "record_settings" and "bodies of at most 4096 bytes" in step.why


def test_plan_upgrades_a_version_5_queue_in_place():
    """Version 6 keeps bodies past 32 KiB in chunks: the content table."""
    tables = dict(complete().tables)
    tables.pop("q_content")
    old = complete(tables=tables, recorded=RecordedPipes(5, 500, 60000, max_body_bytes=32 << 10))
    steps = plan_pipes(TARGET, old)
    assert [str(s) for s in steps] == ["create_table:q_content", "record_settings"]
    assert "schema version 6" in steps[-1].why and "bodies of at most 1048576 bytes" in steps[-1].why


def test_plan_upgrades_a_version_1_queue_in_place():
    """Version 2 adds dead letters, delayed delivery and the archive: three tables, and two
    metadata columns added to the existing table."""
    tables = dict(complete().tables)
    for table in ("q_dead", "q_delayed", "q_archive"):
        tables.pop(table)
    old = complete(tables=tables, recorded=RecordedPipes(1, 500, 60000), meta_columns=frozenset({"queue"}))
    assert actions(old) == [
        "add_meta_columns", "create_table:q_dead", "create_table:q_delayed", "create_table:q_archive",
        "record_settings",
    ]  # fmt: skip
    with_dead_letters = PipesTarget(NAMES, TARGET.replication, 500, 60000, max_attempts=5)
    assert [str(s) for s in plan_pipes(with_dead_letters, complete())] == ["record_settings"]


def test_plan_upgrades_a_version_2_queue_in_place():
    """Version 3 names the source queue of each dead letter (spec.deadLetter.queue): a metadata
    column, a dead table column, and the older dead letters named this queue's."""
    old = complete(
        recorded=RecordedPipes(2, 500, 60000),
        meta_columns=frozenset({"queue", "schema_version", "max_attempts", "archive_ttl_s"}),
        dead_columns=frozenset({"bucket", "id"}),
    )
    assert actions(old) == ["add_meta_columns", "add_dead_source", "source_dead_letters", "record_settings"]


def test_plan_upgrades_a_version_3_queue_in_place():
    """Version 4 adds message headers: a headers column in each message table (existing rows:
    none), and their limits in the metadata row."""
    old = complete(
        recorded=RecordedPipes(3, 500, 60000, header_bytes=0, max_headers=0),
        meta_columns=frozenset(
            {"queue", "schema_version", "max_attempts", "archive_ttl_s", "dead_letter_queue"}
        ),
        headerless=frozenset({"q_waiting", "q_pending", "q_dead", "q_delayed", "q_archive"}),
    )
    steps = plan_pipes(TARGET, old)
    assert [str(s) for s in steps] == [
        "add_meta_columns", "add_headers:q_waiting", "add_headers:q_pending", "add_headers:q_dead",
        "add_headers:q_delayed", "add_headers:q_archive", "record_settings",
    ]  # fmt: skip
    assert "headers of at most 1024 bytes and 32 keys" in steps[-1].why


def test_plan_waits_for_the_queue_keeping_the_dead_letters():
    keeper = QueueNames("errors", "dlq")
    kept = PipesTarget(NAMES, TARGET.replication, 500, 60000, max_attempts=2, dead_letter_keeper=keeper)
    with pytest.raises(
        DeadLetterQueueNotFound, match=r"queue errors\.dlq must be provisioned.*it is not provisioned"
    ):
        plan_pipes(kept, complete())
    assert [str(s) for s in plan_pipes(kept, complete(keeper_version=PIPES_SCHEMA_VERSION))] == [
        "record_settings"
    ]


def test_replication_follows_the_spec():
    spec = QueueSpec.model_validate(
        {"backend": "cassandra", "design": "pipes", "connection": {"secretRef": {"name": "s"}},
         "pipes": {"replication": {"datacenters": {"dc2": 2, "dc1": 3}}}}
    )  # fmt: skip
    assert cql.replication_map(spec.pipes.replication) == {
        "class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3", "dc2": "2",
    }  # fmt: skip
    with pytest.raises(ValueError, match="datacenter name"):
        QueueSpec.model_validate(
            {"backend": "cassandra", "design": "pipes", "connection": {"secretRef": {"name": "s"}},
             "pipes": {"replication": {"datacenters": {"dc1') AND x = ('": 1}}}}
        )  # fmt: skip


# --- provisioning on Cassandra -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cass_url(cassandra, stack) -> Iterator[str]:
    yield stack.cassandra.url()
    cassandra.execute(f'DROP KEYSPACE IF EXISTS "{KEYSPACE}"', timeout=120)  # many queues' tables


def spec_for(**pipes: Any) -> QueueSpec:
    return QueueSpec.model_validate(
        {"backend": "cassandra", "design": "pipes", "connection": {"secretRef": {"name": "s"}, "schema": KEYSPACE},
         "pipes": pipes}
    )  # fmt: skip


MakeQueue = Callable[..., PipesQueue]


@pytest.fixture
def make_queue(cass_url) -> Iterator[MakeQueue]:
    made: list[PipesQueue] = []

    def make(max_pushes: int = 500, max_push_time: str = "1m", **options: Any) -> PipesQueue:
        name = f"q_{uuid.uuid4().hex[:8]}"
        backend = open_backend(
            spec_for(maxPushesPerPipe=max_pushes, maxPushTime=max_push_time), name, from_url(cass_url)
        )
        backend.apply()
        backend.close()
        q = connect(cass_url, name, schema=KEYSPACE, **({"pop_timeout": 0.2} | options))
        assert isinstance(q, PipesQueue)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


def test_provision_is_idempotent_repairs_drift_and_tears_down(cass_url, cassandra):
    settings = from_url(cass_url)
    backend = open_backend(spec_for(), "provision_me", settings)
    try:
        first = backend.apply()
        assert [str(s) for s in first.steps][-1] == "record_settings"
        assert first.created
        assert backend.plan(backend.observe()) == []
        again = backend.apply()
        assert not again.changed and not again.created
        table = f'"{KEYSPACE}"."provision_me_waiting"'
        options = cassandra.execute(
            "SELECT gc_grace_seconds, compaction FROM system_schema.tables WHERE keyspace_name = %s"
            " AND table_name = 'provision_me_waiting'", (KEYSPACE,)
        ).one()  # fmt: skip
        assert options.gc_grace_seconds == cql.GC_GRACE_SECONDS
        assert options.compaction["class"].endswith("LeveledCompactionStrategy")
        # Drift: a table dropped by hand, another one's gc_grace changed.
        cassandra.execute(f'DROP TABLE "{KEYSPACE}"."provision_me_pending"')
        cassandra.execute(f"ALTER TABLE {table} WITH gc_grace_seconds = 864000")
        assert [str(s) for s in backend.plan(backend.observe())] == [
            "tune_table:provision_me_waiting",
            "create_table:provision_me_pending",
        ]
        backend.apply()
        assert backend.plan(backend.observe()) == []
        # A spec change that needs no new objects is recorded, and the client sees it.
        changed = open_backend(spec_for(maxPushesPerPipe=7), "provision_me", settings)
        assert [str(s) for s in changed.apply().steps] == ["record_settings"]
        changed.close()
        with connect(cass_url, "provision_me", schema=KEYSPACE) as q:
            assert isinstance(q, PipesQueue) and q.max_pushes_per_pipe == 7
            q.push(b"x")
        assert backend.depth().depth == 1
    finally:
        backend.teardown()
        backend.close()
    tables = {r.table_name for r in cassandra.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (KEYSPACE,))}  # fmt: skip
    assert (
        not {"provision_me_pipes", "provision_me_state", "provision_me_waiting", "provision_me_pending"}
        & tables
    )


@pytest.mark.parametrize("version", [5, 4, 3, 2, 1])
def test_an_older_queue_is_upgraded_in_place_and_keeps_its_messages_and_leases(cass_url, cassandra, version):
    """Version 6 keeps large bodies in chunks (the content table); version 5 records the largest
    body (a metadata column); version 4 adds headers (a column in each message table, two metadata columns); version 3 names the source queue of each dead letter (a metadata column, a dead table
    column, older dead letters named this queue's); version 2 added dead letters, delayed
    delivery and the archive (three tables, two metadata columns). A queue of either version gets
    them in place, in a keyspace whose metadata table that version made, with its messages,
    leases and dead letters."""
    settings = from_url(cass_url)
    backend = open_backend(spec_for(), "upgrade_me", settings)
    ks = f'"{KEYSPACE}"'
    try:
        backend.apply()
        with connect(cass_url, "upgrade_me", schema=KEYSPACE) as q:
            ids = q.push_many([b"m%d" % i for i in range(10)])
            held = q.acquire_many(3, visibility=60)
        # What the older version had: none of the newer tables and columns.
        cassandra.execute(f"DROP TABLE {ks}.upgrade_me_content")
        if version < 5:
            cassandra.execute(f"ALTER TABLE {ks}.dbq_queues DROP max_body_bytes")
        if version < 4:
            cassandra.execute(f"ALTER TABLE {ks}.dbq_queues DROP (header_bytes, max_headers)")
            for table in ("waiting", "pending", "dead", "delayed", "archive"):
                cassandra.execute(f"ALTER TABLE {ks}.upgrade_me_{table} DROP headers")
        if version < 3:
            cassandra.execute(f"ALTER TABLE {ks}.dbq_queues DROP dead_letter_queue")
        if version == 2:
            cassandra.execute(f"ALTER TABLE {ks}.upgrade_me_dead DROP source")
            cassandra.execute(
                f"INSERT INTO {ks}.upgrade_me_dead (bucket, id, attempts, error, dead_at, body, moving_until)"
                " VALUES (0, now(), 2, 'from version 2', toTimestamp(now()), 0x6f6c64, 0)"
            )
        elif version == 1:
            for table in ("dead", "delayed", "archive"):
                cassandra.execute(f"DROP TABLE {ks}.upgrade_me_{table}")
            cassandra.execute(f"ALTER TABLE {ks}.dbq_queues DROP (max_attempts, archive_ttl_s)")
        cassandra.execute(f"UPDATE {ks}.dbq_queues SET schema_version = {version} WHERE queue = 'upgrade_me'")
        with pytest.raises(
            QueueError, match=f"version {version}, this client speaks pipes version {PIPES_SCHEMA_VERSION}"
        ):
            connect(cass_url, "upgrade_me", schema=KEYSPACE)
        upgraded = open_backend(spec_for().model_copy(update={"dead_letter": DeadLetter(max_attempts=2)}),
                                "upgrade_me", settings)  # fmt: skip
        headers = [
            f"add_headers:upgrade_me_{t}" for t in ("waiting", "pending", "dead", "delayed", "archive")
        ]
        content = "create_table:upgrade_me_content"
        assert [str(s) for s in upgraded.plan(upgraded.observe())] == (
            [content, "record_settings"] if version == 5 else
            ["add_meta_columns", content, "record_settings"] if version == 4 else
            ["add_meta_columns", content, *headers, "record_settings"] if version == 3 else
            ["add_meta_columns", content, "add_dead_source", *headers, "source_dead_letters", "record_settings"]
            if version == 2 else
            ["add_meta_columns", "create_table:upgrade_me_dead", "create_table:upgrade_me_delayed",
             "create_table:upgrade_me_archive", content, *headers[:2], "record_settings"]
        )  # fmt: skip
        upgraded.apply()
        assert upgraded.plan(upgraded.observe()) == []
        upgraded.close()
        with connect(cass_url, "upgrade_me", schema=KEYSPACE) as q:
            assert isinstance(q, PipesQueue) and q.max_attempts == 2
            s = q.stats()
            assert (s.depth, s.in_flight, s.pushed, s.dead) == (7, 3, 10, 1 if version == 2 else 0)
            if version == 2:  # the older dead letter is this queue's
                assert [(d.error, d.source) for d in q.dead_letters()] == [
                    ("from version 2", f"{KEYSPACE}.upgrade_me")
                ]
            for m in held:
                m._queue = q  # the leases, held across the upgrade, are settled by the new client
            q.ack_many(held[1:])
            assert held[0].nack(error="after the upgrade") is False  # its first attempt of two
            rest = []
            while got := q.pop_many(10, timeout=0.5):  # the nacked one went to another pipe
                rest += got
            assert sorted(m.id for m in rest + held[1:]) == sorted(ids)  # none lost, none twice
            large = os.urandom(100_000)  # past 32 KiB: in chunks, in the new table
            q.push(large)
            got = q.pop(timeout=1)
            assert got is not None and got.body == large
    finally:
        backend.teardown()
        backend.close()


def test_a_queue_in_a_new_keyspace_keeps_its_dead_letters_in_another_keyspace(
    cass_url, cassandra, make_queue
):
    """spec.deadLetter.queue across keyspaces: planned before its own keyspace exists."""
    keeper = make_queue()
    other = f"{KEYSPACE}_users"
    spec = QueueSpec.model_validate(
        {"backend": "cassandra", "design": "pipes", "connection": {"secretRef": {"name": "s"}, "schema": other},
         "deadLetter": {"maxAttempts": 1}}
    )  # fmt: skip
    backend = open_backend(spec, "user", from_url(cass_url), keeper.names)
    try:
        backend.apply()
        with connect(cass_url, "user", schema=other) as q:
            q.push(b"bad")
            m = q.acquire(timeout=1)
            assert m is not None and m.nack(error="no") is True
            assert [(d.body, d.source) for d in q.dead_letters()] == [(b"bad", f"{other}.user")]
        assert [(d.body, d.source) for d in keeper.dead_letters(held=True)] == [(b"bad", f"{other}.user")]
    finally:
        backend.teardown()
        backend.close()
        cassandra.execute(f'DROP KEYSPACE IF EXISTS "{other}"', timeout=120)
    assert keeper.dead_letters(held=True) == []  # gone with its queue


def test_unknown_queue_is_named(cass_url, make_queue):
    make_queue()  # the keyspace exists
    with pytest.raises(QueueNotFound, match=f"queue nope is not provisioned in keyspace {KEYSPACE}"):
        connect(cass_url, "nope", schema=KEYSPACE)
    with pytest.raises(QueueNotFound, match="queue nope is not provisioned in keyspace no_such_keyspace"):
        connect(cass_url, "nope", schema="no_such_keyspace")


def test_a_failed_connect_leaves_no_cluster_open(cass_url, make_queue):
    make_queue()  # the keyspace exists

    def open_clusters() -> int:
        gc.collect()
        # type(), not isinstance(): the heap may hold weak proxies whose referent is gone, and
        # isinstance() dereferences them.
        return sum(1 for o in gc.get_objects() if type(o) is Cluster and not o.is_shutdown)

    before = open_clusters()
    for schema in (KEYSPACE, "no_such_keyspace"):
        with pytest.raises(QueueNotFound):
            connect(cass_url, "nope", schema=schema)
    assert open_clusters() == before


def test_unreachable_cluster_is_reported_without_secrets():
    from dbq.client import QueueUnavailable

    with pytest.raises(QueueUnavailable, match="cannot connect") as e:
        connect("cassandra://app:s3cret@127.0.0.1:1", "q")
    assert "s3cret" not in str(e.value)


def test_only_a_connect_failed_by_transient_reads_of_system_tables_is_tried_again():
    """A loaded node may fail one of the control connection's reads ("Replica(s) failed to
    execute read"): such a connect is tried again; a refused socket or bad credentials are not."""
    from cassandra import AuthenticationFailed, ReadFailure, ReadTimeout

    from dbq.connection.cassandra import _transient

    def unavailable(*errors: Exception) -> NoHostAvailable:
        return NoHostAvailable("Unable to connect to any servers", {f"h{i}": e for i, e in enumerate(errors)})

    read_failed = ReadFailure(
        "Replica(s) failed to execute read",
        consistency=1,
        received_responses=0,
        required_responses=1,
        failures=1,
    )
    assert _transient(unavailable(read_failed))
    assert _transient(unavailable(read_failed, ReadTimeout("timed out")))
    assert not _transient(unavailable(read_failed, ConnectionRefusedError(111, "refused")))
    assert not _transient(unavailable(AuthenticationFailed("bad credentials")))
    assert not _transient(unavailable())
    assert not _transient(read_failed)


# --- client semantics --------------------------------------------------------------------------


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def drain(q: PipesQueue, batch: int = 100) -> list[bytes]:
    out: list[bytes] = []
    while got := q.pop_many(batch, timeout=0.3):
        out += [m.body for m in got]
    return out


def test_one_pusher_is_fifo_across_pipe_rotations(make_queue):
    q = make_queue(max_pushes=10)
    ids = q.push_many(bodies("m", 35))
    assert len(set(ids)) == 35 and all(isinstance(i, uuid.UUID) for i in ids)
    q.push(b"last")
    s = q.stats()
    assert (s.pushed, s.depth) == (36, 36)
    assert [p.pushed for p in s.pipes] == [10, 10, 10, 6]
    assert drain(q, 7) == [*bodies("m", 35), b"last"]
    s = q.stats()
    assert (s.pushed, s.popped, s.depth, s.in_flight) == (36, 36, 0, 0)


def test_pipes_are_served_oldest_first_mostly_fifo(make_queue, cass_url):
    """Two pushers interleave; a popper drains pipe by pipe, oldest pipe first, so a message
    waits behind at most the rest of its pipe's predecessors, never behind newer pipes."""
    q = make_queue(max_pushes=5)
    other = connect(cass_url, q.names.queue, schema=KEYSPACE)
    try:
        for i in range(10):
            q.push(f"a{i}".encode())
            other.push(f"b{i}".encode())
        order = drain(q)
    finally:
        other.close()
    assert order == bodies("a", 5) + bodies("b", 5) + [f"a{i}".encode() for i in range(5, 10)] + [
        f"b{i}".encode() for i in range(5, 10)
    ]


def test_drained_pipes_are_retired_and_totals_survive(make_queue):
    q = make_queue(max_pushes=10)
    q.push_many(bodies("r", 45))
    assert len(drain(q, 10)) == 45
    q.close_pushers()  # the last pipe is finished
    r = q.repair()
    assert r.retired_pipes == 5
    s = q.stats()
    assert (s.pushed, s.popped, s.depth, s.retired_pipes, len(s.pipes)) == (45, 45, 0, 5, 0)
    assert q.repair().retired_pipes == 0


# --- conservation and killed clients -----------------------------------------------------------


def test_popper_killed_holding_pending_messages_gets_them_delivered_again(make_queue, cass_url, tmp_path):
    q = make_queue()
    q.push_many(bodies("k", 30))
    log = tmp_path / "victim.log"
    victim = start(
        "pop",
        q,
        cass_url,
        log,
        "--mode",
        "leased",
        "--batch",
        "10",
        "--visibility",
        "2",
        "--ack-delay",
        "3600",
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not read_logs([log])["G"]:  # one batch, then it sleeps
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    held = set(read_logs([log])["G"])
    assert held and not read_logs([log])["A"]
    assert q.stats().in_flight == len(held)
    assert q.repair().rolled_back == 0  # not yet: the leases run for the visibility timeout
    # The worker's visibility is 2 s, but its pipe stays leased for up to PIPE_LEASE_S: the
    # rollback needs the pipe's lease, so that no two repairs push a message back twice.
    time.sleep(max(2.0, pipes_tuning.PIPE_LEASE_S) + pipes_tuning.SKEW_S + 0.2)
    assert q.repair().rolled_back == len(held)
    rest = drain(q)
    assert sorted(rest) == sorted(bodies("k", 30))  # the held ones again, the others once
    s = q.stats()
    assert (s.depth, s.in_flight, s.requeued) == (0, 0, len(held))


def test_pusher_killed_mid_pipe_is_finished_by_the_reaper(make_queue, cass_url, tmp_path, monkeypatch):
    monkeypatch.setattr(pipes_tuning, "FINISH_GRACE_S", 1.0)  # this process decides when it is finished
    q = make_queue(max_pushes=1000, max_push_time="1s")
    log = tmp_path / "pusher.log"
    pusher = start("push", q, cass_url, log, "--prefix", "d", "--count", "100000", "--batch", "5")
    while len(read_logs([log])["P"]) < 200:
        time.sleep(0.02)
    pusher.send_signal(signal.SIGKILL)
    pusher.wait()
    pushed = read_logs([log])["P"]
    got = drain(q)
    assert Counter(b.decode() for b in got) >= pushed  # every acknowledged push is delivered
    active = [p for p in q.stats().pipes if p.status == "active"]
    assert active, "the killed pusher's last pipe should still be marked active"
    time.sleep(1.0 + 1.0 + 0.2)
    r = q.repair()
    assert r.finished_pipes >= 1
    r2 = q.repair()  # now drained, then retired
    s = q.stats()
    assert s.pipes == () and s.depth == 0 and r.retired_pipes + r2.retired_pipes >= 1
    assert s.pushed == len(got) and s.popped == len(got)


def stored_bodies(q: PipesQueue) -> int:
    """Messages whose bodies are in chunks in the content table (partitions of it)."""
    return len(list(q.session.execute(f"SELECT DISTINCT id FROM {q.db.cql.content}")))


def test_an_ack_right_after_its_take_ends_the_message_for_good(make_queue):
    """A lightweight transaction writes with whole-millisecond timestamps: a pending row written
    with the client's microseconds, and acked within that millisecond, used to outlive its ack
    and be delivered again after its visibility timeout. 400 acks right after their takes: none
    comes back."""
    q = make_queue(smart_batching=False)
    q.push_many([b"%d" % i for i in range(400)])
    taken = 0
    while m := q.acquire(timeout=0.5, visibility=1):
        m.ack()
        taken += 1
    assert taken == 400
    time.sleep(1 + pipes_tuning.SKEW_S + 0.2)
    assert q.repair().rolled_back == 0
    assert q.acquire(timeout=0.5) is None
    s = q.stats()
    assert (s.depth, s.in_flight, s.requeued) == (0, 0, 0)


def test_bodies_a_failed_push_or_take_left_half_stored_or_half_deleted_are_removed_by_repair(
    make_queue, monkeypatch
):
    """A push whose rows fail to land after its chunks were stored, and a pop and an ack whose
    chunks fail to be deleted, leave their chunks marked; repair deletes them once the marks'
    deadline passes, and nothing else."""
    monkeypatch.setattr(pipes_tuning, "ENDING_S", 1.0)
    q = make_queue(smart_batching=False)
    large = os.urandom(100_000)
    real_batch = q.db.batch

    def rows_fail(parts: Any, logged: bool = False, conditional: bool = False) -> bool:
        parts = list(parts)
        if any(text == q.db.cql.push for text, _ in parts):
            raise QueueError("the rows' batch failed")
        return real_batch(parts, logged, conditional)

    monkeypatch.setattr(q.db, "batch", rows_fail)
    with pytest.raises(QueueError, match="the rows' batch failed"):
        q.push_many([b"small", large])
    monkeypatch.setattr(q.db, "batch", real_batch)
    assert stored_bodies(q) == 1 and q.stats().depth == 0  # its chunks, and no message
    q.push_many([large, large, b"kept"])
    real_drop = q.reader.content.drop
    monkeypatch.setattr(q.reader.content, "drop", lambda keys: (_ for _ in ()).throw(QueueError("down")))
    m = q.pop(timeout=1)  # its chunks are not deleted: marked, for repair
    held = q.acquire(timeout=1, visibility=30)
    assert m is not None and m.body == large and held is not None and held.body == large
    monkeypatch.setattr(q.settler.content, "drop", lambda keys: (_ for _ in ()).throw(QueueError("down")))
    held.ack()  # acked, but its chunks stay
    monkeypatch.setattr(q.reader.content, "drop", real_drop)
    monkeypatch.setattr(q.settler.content, "drop", real_drop)
    assert stored_bodies(q) == 3
    assert q.stats().in_flight == 0  # the marks of chunks on their way out hold no message
    assert q.repair().ended == 0  # not before the deadline
    time.sleep(1.0 + pipes_tuning.SKEW_S + 0.2)
    assert q.repair().ended == 3
    assert stored_bodies(q) == 0
    rest = q.pop(timeout=1)
    assert rest is not None and rest.body == b"kept"
    s = q.stats()
    assert (s.depth, s.in_flight, s.pushed, s.popped, s.acquired) == (0, 0, 3, 2, 1)


@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_sigkills_during_large_pushes_and_takes_lose_nothing_and_leave_no_body_behind(
    make_queue, cass_url, tmp_path, monkeypatch, mode
):
    """Pushers and poppers are SIGKILLed at random while every fourth body is 64 KiB (stored in
    chunks, between its chunks and its row, or its row and the chunks' deletion, at any point):
    after repair every acknowledged push is delivered (leased: acknowledged once; amo: at most
    once, and only what a killed popper had taken may be missing), no body is damaged, and no
    chunk is left in the content table."""
    monkeypatch.setattr(pipes_tuning, "FINISH_GRACE_S", 1.0)  # this process's repair decides
    # A popper killed between taking a lease over (to nack or roll back) and pushing the message
    # again leaves it in flight until RETAKE_AFTER_S: 2 s here (Cassandra itself is not killed,
    # so no batch of theirs can land later), within the wait before the first repair.
    retake = 2.0
    monkeypatch.setattr(pipes_tuning, "RETAKE_AFTER_S", retake)
    q = make_queue(max_pushes=200, max_push_time="2s")
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    stop = tmp_path / "stop"
    logs: list[Path] = []
    ending = 2.0  # the workers' ENDING_S: repair finishes what they left this long after

    def spawn(role: str, i: int, gen: int) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{role}{i}-{gen}.log"
        logs.append(log)
        if role == "push":
            args = ["--prefix", f"p{i}g{gen}", "--count", "1000000000", "--batch", "5", "--large", "65536"]
        else:
            args = ["--mode", mode, "--batch", "3", "--stop", str(stop), "--visibility", "1"]
        return start(
            role, q, cass_url, log, *args, "--pipes-ending", str(ending), "--pipes-retake", str(retake)
        )

    workers = {("push", i): spawn("push", i, 0) for i in range(2)} | {
        ("pop", i): spawn("pop", i, 0) for i in range(2)
    }
    kills = Counter[str]()
    gen = 1
    give_up = time.monotonic() + 300
    while (
        sum(kills.values()) < 30 or len(read_logs([p for p in logs if p.name.startswith("push")])["P"]) <= 400
    ):
        assert time.monotonic() < give_up, f"after {kills} kills the pushers had pushed too little"
        time.sleep(rng.uniform(0.1, 0.5))
        role, i = key = rng.choice([("push", 0), ("push", 1), ("pop", 0), ("pop", 1)])
        kill([workers[key]])
        kills[role] += 1
        workers[key] = spawn(role, i, gen)
        gen += 1
    kill([proc for key, proc in workers.items() if key[0] == "push"])
    # Past the marks' deadlines, the killed poppers' pipe leases and visibility, and the pushers'
    # pipes' maxPushTime: repair finishes half-stored and half-deleted bodies and rolls back.
    time.sleep(max(ending, retake, pipes_tuning.PIPE_LEASE_S, 2.0 + 1.0) + pipes_tuning.SKEW_S + 0.2)
    first = q.repair()
    stop.touch()
    for key, proc in workers.items():
        if key[0] == "pop":
            proc.wait(timeout=120)
    drain = tmp_path / "drain.log"
    logs.append(drain)
    finish([start("pop", q, cass_url, drain, "--mode", mode, "--batch", "3", "--stop", str(stop))])
    time.sleep(ending + pipes_tuning.SKEW_S)
    last = q.repair()
    seen = read_logs(logs)
    pushed = set(seen["P"])
    print(f"kills={dict(kills)} pushed={len(pushed)} first repair={first} last repair={last}")
    assert len(pushed) > 400, "the load was too small to mean anything"
    assert not seen["B"], f"damaged bodies: {list(seen['B'])[:5]}"
    s = q.stats()
    assert (s.depth, s.in_flight) == (0, 0), s
    assert stored_bodies(q) == 0  # no chunk left behind
    if mode == "amo":
        assert max(seen["G"].values()) == 1, "a message was delivered twice"
        missing = pushed - set(seen["G"])
        # Only a popper killed between the take and its log line loses what it took (up to 3).
        assert len(missing) <= 3 * kills["pop"], (len(missing), kills)
    else:
        assert pushed <= set(seen["G"]), f"lost: {sorted(pushed - set(seen['G']))[:10]}"
        twice = [name for name, n in seen["A"].items() if n > 1]
        assert not twice, f"acknowledged twice: {twice[:5]}"


def test_settings_of_other_backends_are_refused(postgres):
    with pytest.raises(QueueError, match="no pipes queues"):
        PipesQueue(from_url(postgres.url), QueueNames(schema="x", queue="y"))


def test_the_example_manifest_is_a_valid_pipes_queue():
    import yaml

    from tests.operator_harness import ROOT

    docs = list(yaml.safe_load_all((ROOT / "manifests/examples/queue-cassandra.yaml").read_text()))
    spec = QueueSpec.model_validate(docs[1]["spec"])
    assert (spec.backend, spec.design, spec.pipes.max_pushes_per_pipe) == ("cassandra", "pipes", 500)


def test_cli_stats_watch_prints_rates_while_messages_flow(make_queue, cass_url):
    import json

    from click.testing import CliRunner

    from dbq.cli import main as cli

    q = make_queue()
    stop = threading.Event()

    def push() -> None:
        while not stop.is_set():
            q.push(b"w")
            time.sleep(0.01)

    pusher = threading.Thread(target=push)
    pusher.start()
    try:
        out = CliRunner().invoke(
            cli, ["stats", q.names.queue, "--url", cass_url, "--schema", KEYSPACE, "-w", "0.5", "--samples", "4",
                  "-o", "json"],
        )  # fmt: skip
    finally:
        stop.set()
        pusher.join()
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    assert len(lines) == 4 and lines[0]["pushRate"] == 0.0
    assert lines[-1]["pushed"] > lines[0]["pushed"] and 10 < lines[-1]["pushRate"] < 150


def test_a_large_rollback_goes_in_batches_cassandra_accepts(make_queue, cass_url):
    """500 leases past their deadline come back: rows and the pending rows they replace go in
    logged batches under Cassandra's batch_size_fail_threshold (a single one was refused); their
    headers count in a batch's size (small bodies with 1 KiB of headers each)."""
    q = make_queue(max_pushes=1000)
    trace = {"trace": "t" * 1000}
    q.push_many(bodies("big", 500), headers=trace)
    held = q.acquire_many(500, visibility=1)
    assert len(held) == 500
    other = connect(cass_url, q.names.queue, schema=KEYSPACE, pop_timeout=0.2)
    try:
        time.sleep(pipes_tuning.PIPE_LEASE_S + pipes_tuning.SKEW_S + 0.2)
        assert other.repair().rolled_back == 500
        back = []
        while got := other.pop_many(100, timeout=0.3):
            back += got
        assert sorted(m.body for m in back) == sorted(bodies("big", 500))
        assert all(m.headers == trace for m in back)
    finally:
        other.close()


def test_concurrent_single_pushes_share_round_trips_on_pipes(make_queue):
    q = make_queue(max_pushes=100_000, smart_batching=True)
    bodies = [b"t%02d-%03d" % (t, i) for t in range(32) for i in range(30)]

    def pusher(t: int) -> list[uuid.UUID]:  # half with a ttl: they share round trips among them
        return [q.push(b"t%02d-%03d" % (t, i), ttl=600 if t % 2 else None) for i in range(30)]

    with ThreadPoolExecutor(32) as pool:
        ids = [i for f in [pool.submit(pusher, t) for t in range(32)] for i in f.result()]
    assert len(set(ids)) == len(bodies)
    assert q._pushes is not None and q._pushes.round_trips < len(bodies) / 2
    taken: list = []
    while len(taken) < len(bodies):
        got = q.pop_many(500, timeout=1)
        assert got, f"{len(taken)} of {len(bodies)}"
        taken += got
    assert sorted(m.body for m in taken) == sorted(bodies) and {m.id for m in taken} == set(ids)


def test_the_threads_of_a_smart_batching_client_take_through_its_one_lease(make_queue):
    """With smart batching a client leases one pipe for all its threads' takes, single or batch;
    without, each thread leases a pipe of its own, and a second thread finds the only one taken."""
    sent = bodies("m", 20)  # one pipe
    for smart in (True, False):
        q = make_queue(smart_batching=smart)
        q.push_many(sent)
        first = q.pop()
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(q.pop_many, 5).result()
        assert first is not None and first.body == sent[0]
        assert [m.body for m in second] == (sent[1:6] if smart else [])
        assert [m.body for m in q.pop_many(5)] == (sent[6:11] if smart else sent[1:6])


def test_concurrent_single_acquires_and_acks_share_round_trips_on_pipes(make_queue):
    q = make_queue(max_pushes=100_000, smart_batching=True, pop_timeout=0.5)
    bodies = [b"m%04d" % i for i in range(800)]
    q.push_many(bodies)
    acked: list[list[bytes]] = [[] for _ in range(16)]
    calls = [0] * 16

    def consumer(t: int) -> None:
        while (m := q.acquire(visibility=60 if t % 2 else None)) is not None:  # half with their own
            calls[t] += 1
            m.ack()
            acked[t].append(m.body)

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(consumer, t) for t in range(16)]:
            f.result()
    assert sorted(b for part in acked for b in part) == bodies  # each once, none lost
    # Shared: on average more than 1.5 calls a round trip (about 4 on an idle machine, 2 under the
    # full suite's load, where the threads come back from their acks one at a time).
    assert q._acquires is not None and q._acquires.round_trips < sum(calls) * 2 / 3
    assert q._acks is not None and q._acks.round_trips < len(bodies) * 2 / 3
    assert q.pop(timeout=0) is None and q.stats().in_flight == 0


def test_smart_batched_takes_lease_spare_pipes_beside_the_first_and_a_single_taker_keeps_fifo(make_queue):
    q = make_queue(max_pushes=50, smart_batching=True, pop_timeout=0.5)
    sent = bodies("s", 600)  # 12 pipes of 50
    q.push_many(sent)
    # One thread alone: every take goes through the first lease, in push order.
    assert [m.body for m in (q.pop() for _ in range(120))] == sent[:120]  # type: ignore[union-attr]
    spares_held = [0]
    done = threading.Event()

    def watch() -> None:  # how many spare leases held a pipe at once, at the most
        while not done.is_set():
            spares_held[0] = max(spares_held[0], sum(s.lease is not None for s in q.leases._slots[1:]))
            time.sleep(0.001)

    taken: list[list[bytes]] = [[] for _ in range(8)]
    # Until all are taken: on a loaded machine a pipe can stay out of reach longer than one
    # pop's timeout (another taker's lease on it, a scan for spare pipes not due yet).
    deadline = time.monotonic() + 60

    def taker(t: int) -> None:
        while sum(map(len, taken)) < len(sent) - 120 and time.monotonic() < deadline:
            if (m := q.pop()) is not None:
                taken[t].append(m.body)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(taker, t) for t in range(8)]:
            f.result()
    done.set()
    watcher.join()
    assert sorted(b for part in taken for b in part) == sorted(sent[120:])  # each once, none lost
    assert spares_held[0] >= 1  # takes ran beside the first lease, on other pipes


def test_a_take_whose_reads_outlasted_its_lease_renews_it_or_leaves_the_pipe_to_its_new_lessee(
    make_queue, cass_url
):
    q = make_queue(smart_batching=False)
    q.push_many([b"a", b"b", b"c"])
    assert q.pop().body == b"a"  # type: ignore[union-attr]
    lease = q.leases.current()
    assert lease is not None
    # As if reading had taken past the part of the lease a take may use: renewed, then taken.
    lease.until = time.monotonic() - 1
    assert q.pop().body == b"b"  # type: ignore[union-attr]
    assert q.leases.current() is lease and lease.until > time.monotonic()
    # Now it ran out, and another consumer claimed the pipe meanwhile: the late take gives up.
    q.db.cas(q.db.cql.release, lease.state.pipe, lease.owner)
    other = connect(cass_url, q.names.queue, schema=KEYSPACE, smart_batching=False)
    try:
        assert other.pop().body == b"c"  # type: ignore[union-attr]
        lease.until = time.monotonic() - 1
        assert q.pop(timeout=0) is None and q.leases.current() is None
    finally:
        other.close()
    assert q.stats().popped == 3


def test_acquires_sharing_a_round_trip_each_lease_for_their_callers_visibility(make_queue, cass_url):
    q = make_queue(max_pushes=100_000, smart_batching=True, pop_timeout=1)
    q.push_many(bodies("v", 64))
    held: list[tuple[int, PipeMessage]] = []
    start = threading.Barrier(16)

    def consumer(t: int) -> None:
        start.wait()  # all at once: calls that overlap share a round trip
        for _ in range(4):
            m = q.acquire(visibility=2 if t % 2 else 60)
            assert m is not None
            held.append((t, m))

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(consumer, t) for t in range(16)]:
            f.result()
    assert sorted(m.body for _, m in held) == sorted(bodies("v", 64))
    # Shared, whatever the visibility: how much depends on how the threads overlap (a loaded
    # machine runs them more one after another), so the bound only rules out one call a trip.
    assert q._acquires is not None and q._acquires.round_trips <= 64 * 3 / 4
    short = sorted(m.body for t, m in held if t % 2)
    q.close()  # gives its pipe lease back, so that another client may roll back
    other = connect(cass_url, q.names.queue, schema=KEYSPACE, pop_timeout=0.2)
    try:
        time.sleep(2 + pipes_tuning.SKEW_S + 0.2)
        assert other.repair().rolled_back == len(short)  # the 2 s leases lapsed, the 60 s ones hold
        assert sorted(drain(other)) == short
    finally:
        other.close()


def test_clients_on_one_session_prepare_each_statement_once(make_queue):
    q = make_queue()
    q.push(b"first")
    assert q.pop(timeout=1) is not None
    prepared: list[str] = []
    prepare = q.session.prepare
    q.session.prepare = lambda text, *a, **k: prepared.append(text) or prepare(text, *a, **k)  # counts
    try:
        other = PipesQueue.over(q.session, q.settings, q.names)
        other.push(b"second")
        got = other.pop(timeout=1)
        assert got is not None and got.body == b"second"
        assert prepared == []  # the first client's statements served the second
        other.close()
    finally:
        del q.session.prepare


def test_consume_holds_at_most_its_credit_and_every_message_ends_handled_once_or_failed_again(make_queue):
    """The worker loop on pipes: nack (no error text, no dead letters) puts a failed message back;
    every message is handled once in the end, and never more than `credit` are held."""
    q = make_queue()
    bodies = [b"p%d" % i for i in range(200)]
    q.push_many(bodies)
    handled: Counter[bytes] = Counter()
    failed_once: set[bytes] = set()
    lock = threading.Lock()

    def handler(m) -> None:
        with lock:
            if m.body not in failed_once and len(failed_once) < 20:
                failed_once.add(m.body)
                raise RuntimeError("first delivery of some fails")
            handled[m.body] += 1

    # backoff 0: a pipes nack with a delay waits for the next repair (the operator's cleanup)
    stats = q.consume(handler, concurrency=4, credit=5, backoff=0, max_messages=220)
    assert stats.most_in_hand <= 5
    assert (stats.failed, stats.handled) == (20, 200)
    assert set(handled) == set(bodies) and max(handled.values()) == 1
