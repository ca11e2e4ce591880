"""The ring's own data-plane behaviour: wrap-around, a full ring, the spill table, holes and
orphans, crashes. The tests that do not reach into PostgreSQL run on SQL Server too, when
DBQ_MSSQL_DSN names one (`mssql://user:password@host:1433/db?driver=...`; SQL Server cannot run
on this machine). What every design shares is in test_contract.py."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import (
    LeaseLost,
    Message,
    MessageTooLarge,
    Queue,
    QueueError,
    QueueFull,
    QueueNotFound,
    connect,
)
from dbq.connection import from_url
from dbq.connection.postgres import libpq_options, placeholders
from dbq.contract.ring import RingTarget, call_statement
from dbq.errors import AuthenticationFailed, DatabaseUnreachable
from dbq.names import QueueNames
from tests.sqlserver import MSSQL_DSN, on_sqlserver
from tests.workers import finish, kill, read_logs, start

SCHEMA = "ringq"
MakeQueue = Callable[..., Queue]


@contextmanager
def queues(url: str) -> Iterator[MakeQueue]:
    """Ring queues provisioned at `url` and clients of them; dropped afterwards."""
    opened: list[tuple[Queue, OdbcRing]] = []

    def make(size: int = 1000, message_bytes: int = 100, max_body_bytes: int = 1 << 20, max_attempts: int = 0,
             **options) -> Queue:  # fmt: skip
        name = f"q_{secrets.token_hex(4)}"
        target = RingTarget(QueueNames(SCHEMA, name), size, message_bytes, max_attempts=max_attempts,
                            max_body_bytes=max_body_bytes)  # fmt: skip
        backend = OdbcRing(from_url(url), target)
        backend.apply()
        options.setdefault("pop_timeout", 0.1)
        q = connect(url, name, schema=SCHEMA, **options)
        assert isinstance(q, Queue)
        opened.append((q, backend))
        return q

    yield make
    for q, backend in opened:
        q.close()
        backend.teardown()
        backend.close()


@pytest.fixture(
    params=[
        "postgres",
        on_sqlserver("sqlserver"),
    ]
)
def make_queue(request) -> Iterator[MakeQueue]:
    """On every ring dialect."""
    url = request.getfixturevalue("postgres").url if request.param == "postgres" else MSSQL_DSN
    with queues(url) as make:
        yield make


@pytest.fixture
def pg_queue(postgres) -> Iterator[MakeQueue]:
    """For the tests that reach into PostgreSQL by hand."""
    with queues(postgres.url) as make:
        yield make


def sql(q: Queue, statement: str, *params: object) -> object:
    with q._cursor() as cur:
        return cur.execute(statement, *params).fetchval()


def test_unknown_queue_and_schema_are_named(postgres, pg_queue):
    pg_queue()  # the schema exists
    with pytest.raises(QueueNotFound, match="nope is not provisioned in schema ringq"):
        connect(postgres.url, "nope", schema=SCHEMA)
    with pytest.raises(QueueError, match="cassandra has no ring queues"):
        Queue(from_url("cassandra://127.0.0.1:19042"), QueueNames(schema=SCHEMA, queue="orders"))
    with pytest.raises(ValueError, match="not a safe identifier"):
        connect(postgres.url, "orders; drop table x", schema=SCHEMA)


def test_postgres_statements_take_odbc_placeholders_and_keep_quoted_text():
    assert placeholders("SELECT f(?, ?) WHERE a LIKE 'x%' AND b = '?' AND \"c?\" = ?") == (
        "SELECT f($1, $2) WHERE a LIKE 'x%' AND b = '?' AND \"c?\" = $3"
    )
    assert placeholders("SELECT 'it''s ?', ?") == "SELECT 'it''s ?', $1"


def test_postgres_url_options_libpq_knows_reach_it_and_odbc_ones_stay_with_odbc(postgres, pg_queue):
    assert libpq_options({"SSLMODE": "require", "UseServerSidePrepare": "1"}) == {"sslmode": "require"}
    q = pg_queue()
    named = connect(f"{postgres.url}?application_name=dbq-test-client", q.names.queue, schema=SCHEMA)
    assert isinstance(named, Queue)
    assert sql(named, "SELECT current_setting('application_name')") == "dbq-test-client"
    named.close()
    # The url names no CA (nor the Secret): verify-full reached libpq, which has none to check with.
    with pytest.raises(DatabaseUnreachable, match="no CA was given"):
        connect(f"{postgres.url}?sslmode=verify-full", q.names.queue, schema=SCHEMA)


def test_postgres_errors_name_the_cause_without_the_password(postgres, pg_queue):
    q = pg_queue()
    wrong = dataclasses.replace(from_url(postgres.url), password="not-the-password-42")
    with pytest.raises(AuthenticationFailed) as refused:
        Queue(wrong, q.names)
    assert "not-the-password-42" not in str(refused.value)
    with pytest.raises(DatabaseUnreachable, match=r"127\.0\.0\.1:1/"):
        Queue(dataclasses.replace(wrong, port=1), q.names)


def test_every_byte_value_and_a_large_body_travel_unchanged(pg_queue):
    q = pg_queue(message_bytes=300, max_body_bytes=4 << 20)
    bodies = [bytes(range(256)) * 2, b"\x00" * 5, os.urandom(3 << 20), b""]
    for body in bodies:
        q.push(body, headers={"kind": "bytes", "n": len(body)})
    got = q.pop_many(10)
    assert [m.body for m in got] == bodies
    assert [m.headers for m in got] == [{"kind": "bytes", "n": len(b)} for b in bodies]
    assert sql(q, "SELECT 'a%b' || ?::text", "?") == "a%b?"


def test_redeliveries_are_not_starved_by_a_busy_ring(make_queue):
    """Pops look at the spill table only now and then while the ring has messages (and always
    when it has none), so a nacked message comes back within a few pops even under load."""
    q = make_queue()
    q.push_many([b"%d" % i for i in range(300)])
    m = q.acquire()
    assert m is not None and m.body == b"0"
    m.nack()
    # One pop in eight looks first: the chance of 150 pops all passing it by is (7/8)**150 ~ 2e-9.
    seen = [q.acquire() for _ in range(150)]
    again = [x for x in seen if x is not None and x.body == b"0"]
    assert len(again) == 1 and again[0].attempts == 2
    assert len({x.id for x in seen if x is not None}) == 150  # nothing delivered twice meanwhile


def test_wrap_around_of_a_16_slot_ring_over_10000_messages(make_queue):
    q = make_queue(size=16)
    rng = random.Random(7)
    sent: list[bytes] = []
    got: list[bytes] = []
    while len(got) < 10_000:
        room = 16 - (len(sent) - len(got))
        k = min(rng.randint(0, room), 10_000 - len(sent))
        if k:
            batch = [b"%d" % (len(sent) + i) for i in range(k)]
            q.push(batch[0]) if k == 1 else q.push_many(batch)
            sent += batch
        got += [m.body for m in q.pop_many(rng.randint(1, 16), timeout=0)]
    assert got == sent  # one pusher, one popper: strict order across 625 laps
    s = q.stats()
    assert (s.pushed, s.popped, s.depth) == (10_000, 10_000, 0)


def test_full_ring_waits_for_the_push_timeout_then_raises_and_stores_nothing(make_queue):
    q = make_queue(size=16)
    q.push_many([b"x"] * 16)
    started = time.monotonic()
    with pytest.raises(QueueFull, match=r"stayed full \(16 slots\) for 0.4s") as full:
        q.push_many([b"late1", b"late2"], timeout=0.4)
    assert time.monotonic() - started >= 0.4
    assert full.value.ids == [None, None]
    assert q.stats().pushed == 16
    q.pop()
    assert q.push(b"fits", timeout=0) == 17  # room again: it goes in at once


def test_full_ring_accepts_a_push_as_soon_as_a_slot_frees(make_queue):
    import threading

    q = make_queue(size=16)
    q.push_many([b"x"] * 16)
    threading.Timer(0.3, q.pop).start()
    started = time.monotonic()
    q.push(b"waited", timeout=5)
    assert 0.25 < time.monotonic() - started < 2


def test_ttl_expires_messages_in_ring_and_spill(make_queue):
    q = make_queue()
    q.push(b"short", ttl=0.2)
    q.push(b"long", ttl=60)
    q.push(b"forever")
    nacked = q.push(b"nacked", ttl=0.2)
    time.sleep(0.3)
    bodies = [m.body for m in q.pop_many(10)]
    assert bodies == [b"long", b"forever"]  # the expired ones are skipped and counted
    assert q.stats().expired == 2
    q2 = make_queue(ttl=0.2)  # a queue-wide default TTL (the spec's messageTTL)
    q2.push(b"a")
    m = q2.acquire()
    assert m is not None
    m.nack()
    time.sleep(0.3)
    r = q2.repair()
    assert r.expired == 1 and q2.stats().depth == 0 and nacked == 4


def test_oversize_body_is_refused_with_the_fix_and_changes_nothing(pg_queue, postgres):
    q = pg_queue(message_bytes=64, max_body_bytes=1000)
    q.push(b"y" * 1000)  # exactly the limit is fine (past the slot: beside the ring)
    with pytest.raises(MessageTooLarge, match=r"1001 bytes is larger than spec.messages.maxBytes \(1000\)"):
        q.push_many([b"ok", b"y" * 1001])
    assert q.stats().pushed == 1
    # The routines refuse it too (a client that skips the check), before drawing a position.
    for verb, args in (
        ("push", (b"z" * 1001, 0, None)),
        ("push_many", (b"ok" + b"z" * 1001, "2,1001", 0, None)),
    ):
        with (
            q._cursor() as cur,
            pytest.raises(Exception, match=r"larger than spec\.messages\.maxBytes \(1000\)"),
        ):
            cur.execute(call_statement("postgres", q.names, verb), *args).fetchval()
    assert sql(q, f"SELECT last_value FROM {SCHEMA}.{q.names.push_seq}") == 1
    assert sql(q, f"SELECT count(*) FROM {SCHEMA}.{q.names.content}") == 1
    with pytest.raises(TypeError, match="bytes"):
        q.push("text")  # type: ignore[arg-type]


def test_the_routines_check_headers_and_callers_of_earlier_versions_need_not_pass_them(pg_queue):
    """A client in any language calls the routines: headers too large or not an object are
    refused there too, before a position is drawn; a call without headers (as before version
    16) still pushes."""
    q = pg_queue()
    routine = f"{SCHEMA}.{q.names.routine('push')}"
    many = f"{SCHEMA}.{q.names.routine('push_many')}"
    with q._cursor() as cur:
        with pytest.raises(Exception, match=r"larger than spec\.messages\.headerBytes \(1024\)"):
            cur.execute(f"SELECT {routine}(?, 0, ?)", b"x", json.dumps({"k": "v" * 2000})).fetchval()
        with pytest.raises(Exception, match="must be a JSON object"):
            cur.execute(f"SELECT {routine}(?, 0, ?)", b"x", "[1, 2]").fetchval()
        with pytest.raises(Exception, match="a JSON array of one object"):
            cur.execute(f"SELECT {many}(?, '1', 0, ?)", b"x", '{"k": 1}').fetchval()
        with pytest.raises(Exception, match="headers for 1 messages and 2 bodies"):
            cur.execute(f"SELECT {many}(?, '1,1', 0, ?)", b"xy", '[{"k": 1}]').fetchval()
        assert q.stats().pushed == 0
        assert cur.execute(f"SELECT {routine}(?, 0)", b"old").fetchval() == 1
        assert cur.execute(f"SELECT {many}(?, '1,1', 0, ?)", b"ab", '[null, {"k": 1}]').fetchval() == "2,3"
    assert [(m.body, m.headers) for m in q.pop_many(3)] == [(b"old", {}), (b"a", {}), (b"b", {"k": 1})]


def test_a_pusher_that_drew_a_position_and_died_does_not_block_poppers(pg_queue):
    q = pg_queue(hole_grace=0.3)
    q.push(b"before")
    sql(q, f"SELECT nextval('{SCHEMA}.{q.names.push_seq}')")  # drew 2, never wrote it
    q.push(b"after")
    assert q.pop().body == b"before"  # type: ignore[union-attr]
    started = time.monotonic()
    m = q.pop(timeout=3)
    assert m is not None and m.body == b"after"
    assert time.monotonic() - started < 2  # gave the hole up after hole_grace, not the timeout
    assert q.pop(timeout=0) is None and q.stats().depth == 0


def test_a_popper_that_drew_a_position_and_died_leaves_an_orphan_repair_rescues(pg_queue):
    q = pg_queue()
    q.push_many([b"one", b"two"])
    sql(q, f"SELECT nextval('{SCHEMA}.{q.names.pop_seq}')")  # drew 1, never took it
    assert q.pop().body == b"two"  # type: ignore[union-attr]
    assert q.pop(timeout=0) is None  # "one" is orphaned: its position is spent
    assert q.repair(orphan_grace=60).orphans == 0  # within the grace it is left alone
    assert q.repair(orphan_grace=0).orphans == 1
    assert q.repair(orphan_grace=0).orphans == 0  # idempotent
    assert q.pop().body == b"one"  # type: ignore[union-attr]
    assert q.stats().popped == 2


def test_a_popper_that_gave_up_on_a_late_message_still_gets_it_delivered(pg_queue):
    q = pg_queue(hole_grace=0.05)
    sql(q, f"SELECT nextval('{SCHEMA}.{q.names.push_seq}')")  # a slow pusher holds position 1
    assert q.pop(timeout=0.2) is None  # the popper drew 1, waited, and released it
    # The slow pusher finally writes position 1 (what its place() call does).
    with q._cursor() as cur:
        cur.execute(
            f"SELECT {SCHEMA}.{q.names.routine('place')}(1, ?, 0, now(), ?)", b"late", '{"trace":"t1"}'
        ).fetchval()
    m = q.pop(timeout=1)
    assert m is not None and m.body == b"late" and m.headers == {"trace": "t1"}
    assert q.pop(timeout=0) is None


def test_a_slot_held_by_a_lease_moves_aside_when_the_ring_laps(make_queue):
    q = make_queue(size=16)
    q.push(b"slow")
    held = q.acquire()
    assert held is not None
    for i in range(20):  # lap the ring past the leased slot
        q.push(b"%d" % i)
        assert q.pop() is not None
    held.ack()  # found in the spill table
    assert q.stats().in_flight == 0


# --- conservation and crashes ------------------------------------------------------------------


@pytest.mark.parametrize("large", [0, 65536], ids=["small", "large"])
@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_crash_50_sigkills_during_claims_then_repair(pg_queue, postgres, tmp_path, mode, large):
    """Clients are SIGKILLed at random points (and some server sessions terminated mid-call);
    after repair, every acknowledged push is delivered exactly once (amo: at most once, and only
    messages claimed by a killed popper may be missing) or at least once (leased). `large`:
    every fourth body is that big (its content beside the ring): none is damaged, and once
    drained nothing is left in the content table."""
    q = pg_queue(size=1000, pop_timeout=0.05)
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    stop = tmp_path / "stop"
    logs: list[Path] = []
    visibility = "1.0"

    def spawn(role: str, i: int, gen: int) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{role}{i}-{gen}.log"
        logs.append(log)
        if role == "push":
            args = ["--prefix", f"p{i}g{gen}", "--count", "1000000000", "--batch", "5", "--large", str(large)]
        else:
            args = ["--mode", mode, "--batch", "3", "--stop", str(stop), "--visibility", visibility]
        return start(role, q, postgres.url, log, *args)

    workers = {("push", i): spawn("push", i, 0) for i in range(2)} | {
        ("pop", i): spawn("pop", i, 0) for i in range(3)
    }
    kills = Counter[str]()
    terminations = 0
    gen = 1
    # 50 kills, and on until the pushers have pushed enough: under load a pusher can be killed
    # again before it has started (CI once saw 4 pushes in 50 kills).
    give_up = time.monotonic() + 300
    while (
        sum(kills.values()) < 50 or len(read_logs([p for p in logs if p.name.startswith("push")])["P"]) <= 600
    ):
        assert time.monotonic() < give_up, f"after {kills} kills the pushers had pushed too little"
        time.sleep(rng.uniform(0.05, 0.4))
        for (role, i), proc in list(workers.items()):
            if proc.poll() is not None:  # its session was terminated: it failed, as a client would
                workers[(role, i)] = spawn(role, i, gen)
                gen += 1
        role, i = key = rng.choice([("push", 0), ("push", 1), ("pop", 0), ("pop", 1), ("pop", 2), ("pop", 0)])
        if (
            rng.random() < 0.3
        ):  # end a server session mid-call: its statement rolls back, its positions stay drawn
            pids = sql(q, "SELECT string_agg(pid::text, ',') FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'")  # fmt: skip
            if pids:
                sql(q, f"SELECT pg_terminate_backend({rng.choice(str(pids).split(','))})")
                terminations += 1
        kill([workers[key]])
        kills[role] += 1
        workers[key] = spawn(role, i, gen)
        gen += 1
    kill([proc for key, proc in workers.items() if key[0] == "push"])
    # Recovery: repair rescues orphans and (after the visibility timeout) expired leases; the
    # poppers drain the rest.
    time.sleep(float(visibility) + 0.2)
    q.repair(orphan_grace=0)
    stop.touch()
    for key, proc in workers.items():
        if key[0] == "pop":
            proc.wait(timeout=120)  # a popper may have died with its session terminated: that is fine
    drain = [tmp_path / "drain.log"]
    logs += drain
    q.repair(orphan_grace=0)
    finish([start("pop", q, postgres.url, drain[0], "--mode", mode, "--batch", "3", "--stop", str(stop))])
    seen = read_logs(logs)
    pushed = set(seen["P"])
    assert len(pushed) > 500, "the load was too small to mean anything"
    # The truth, from the rows: nothing left ready or leased.
    truth = sql(q, f"SELECT count(*) FROM {SCHEMA}.{q.names.ring} WHERE state IN (1, 2)")
    assert truth == 0 and sql(q, f"SELECT count(*) FROM {SCHEMA}.{q.names.spill}") == 0
    assert sql(q, f"SELECT count(*) FROM {SCHEMA}.{q.names.content}") == 0  # no body left behind
    assert not seen["B"], f"damaged bodies: {list(seen['B'])[:5]}"
    # stats() reads totals kept in sequences, which a rollback does not undo: a session
    # terminated inside a take of 3 (the poppers' batch) after it counted can leave in flight 3
    # too high, and one terminated inside a push of 5 after it counted leaves the depth 5 too high.
    stats = q.stats()
    assert 0 <= stats.depth <= 5 * terminations and 0 <= stats.in_flight <= 3 * terminations, (
        stats,
        terminations,
    )
    if mode == "amo":
        assert max(seen["G"].values()) == 1, "a message was delivered twice"
        missing = pushed - set(seen["G"])
        # Only a popper killed between the database's answer and its log line can lose one
        # (it had claimed it: at-most-once); a batch of up to 3 per such kill.
        # A terminated session can also have committed its claim just before it ended.
        assert len(missing) <= 3 * (kills["pop"] + terminations), (len(missing), kills, terminations)
    else:
        assert pushed <= set(seen["G"]), f"lost: {sorted(pushed - set(seen['G']))[:10]}"
        assert max(seen["A"].values()) == 1, "a message was acknowledged twice"
    missing_n = len(pushed - set(seen["G"]))
    print(
        f"kills={dict(kills)} terminations={terminations} acknowledged pushes={len(pushed)}"
        f" deliveries={sum(seen['G'].values())} acknowledged pushes never delivered={missing_n}"
    )


# --- smart batching ---------------------------------------------------------------------------
def test_concurrent_single_pushes_share_round_trips_and_each_gets_its_own_id(make_queue):
    q = make_queue(size=8192, message_bytes=64)
    bodies = [b"t%02d-%03d" % (t, i) for t in range(64) for i in range(40)]

    def pusher(t: int) -> list[int]:
        return [q.push(b"t%02d-%03d" % (t, i)) for i in range(40)]

    with ThreadPoolExecutor(64) as pool:
        ids = [i for f in [pool.submit(pusher, t) for t in range(64)] for i in f.result()]
    assert len(set(ids)) == len(bodies)
    assert q._pushes is not None and q._pushes.round_trips < len(bodies) / 2  # shared
    taken = q.pop_many(len(bodies))
    assert sorted(m.body for m in taken) == sorted(bodies)
    assert {m.id for m in taken} == set(ids)  # each caller got its own message's id
    by_thread: dict[bytes, list[int]] = {}
    for m in sorted(taken, key=lambda m: m.id):
        by_thread.setdefault(m.body[:3], []).append(int(m.body[4:]))
    assert all(seq == sorted(seq) for seq in by_thread.values())  # a thread's pushes keep their order


def test_smart_batching_gives_each_caller_its_own_error(make_queue):
    q = make_queue(size=64, message_bytes=16, max_body_bytes=16, push_timeout=0.2)
    results: list[object] = []

    def push(body: bytes) -> None:
        try:
            results.append(q.push(body))
        except (QueueFull, MessageTooLarge) as e:
            results.append(e)

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(push, b"x" * 40)] + [pool.submit(push, b"m%03d" % i) for i in range(100)]:
            f.result()
    too_large = [r for r in results if isinstance(r, MessageTooLarge)]
    full = [r for r in results if isinstance(r, QueueFull)]
    ids = [r for r in results if isinstance(r, int)]
    assert len(too_large) == 1 and len(ids) == 64 and len(full) == 100 - 64
    assert sorted(m.id for m in q.pop_many(100)) == sorted(ids)  # stored exactly those


def test_concurrent_single_pops_share_round_trips_and_take_no_message_nobody_gets(make_queue):
    """64 threads each popping one message at a time while 8 push: every message reaches exactly
    one caller, and the popped total counts exactly the messages callers received."""
    q = make_queue(size=4096, message_bytes=64, pop_timeout=0)
    pushed = [b"p%d-%04d" % (t, i) for t in range(8) for i in range(300)]
    received: list[list[bytes]] = [[] for _ in range(64)]
    calls = [0] * 64
    pushing = threading.Event()
    pushing.set()

    def pusher(t: int) -> None:
        for i in range(300):
            q.push(b"p%d-%04d" % (t, i))

    def popper(t: int) -> None:
        while pushing.is_set() or q.stats().depth:
            m = q.pop(timeout=0.05)
            calls[t] += 1
            if m is not None:
                received[t].append(m.body)

    with ThreadPoolExecutor(72) as pool:
        poppers = [pool.submit(popper, t) for t in range(64)]
        for f in [pool.submit(pusher, t) for t in range(8)]:
            f.result()
        pushing.clear()
        for f in poppers:
            f.result()
    got = [b for part in received for b in part]
    assert sorted(got) == sorted(pushed)  # none lost, none twice
    stats = q.stats()
    assert stats.popped == len(pushed) and stats.depth == 0  # none taken that nobody received
    assert q._pops is not None and q._pops.round_trips < sum(calls) / 2  # shared
    for part in received:  # a thread receives messages in the ring's order
        for t in range(8):
            mine = [b for b in part if b.startswith(b"p%d-" % t)]
            assert mine == sorted(mine)


def test_concurrent_acquires_and_acks_share_round_trips_and_a_lost_lease_is_the_callers_own(make_queue):
    q = make_queue(size=4096, message_bytes=64, pop_timeout=1, visibility=30)
    q.push_many([b"m%04d" % i for i in range(1600)])
    acked: list[list[bytes]] = [[] for _ in range(16)]

    def consumer(t: int) -> None:
        while (m := q.acquire(timeout=0.2)) is not None:
            m.ack()
            acked[t].append(m.body)

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(consumer, t) for t in range(16)]:
            f.result()
    got = [b for part in acked for b in part]
    assert sorted(got) == [b"m%04d" % i for i in range(1600)]
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.acquired) == (0, 0, 1600)
    assert q._acquires is not None and q._acquires.round_trips < 1600
    assert q._acks is not None and q._acks.round_trips < 1600
    # An ack whose lease expired fails for its caller only, while others' acks in flight stand.
    q.push_many([b"late", b"ok1", b"ok2"])
    late = q.acquire(visibility=1)
    held = [q.acquire(), q.acquire()]
    time.sleep(1.2)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(m.ack) for m in [late, *held]]
    with pytest.raises(LeaseLost) as lost:
        futures[0].result()
    assert lost.value.messages == [late]
    assert [f.result() for f in futures[1:]] == [None, None]


def test_acquires_with_their_own_visibility_share_round_trips_with_that_visibility(make_queue):
    """32 threads, half acquiring with visibility=2 and half with 30: each message reaches one
    caller, the calls share round trips, and each lease lasts what its caller asked."""
    q = make_queue(size=1024, message_bytes=16, pop_timeout=1)
    q.push_many([b"m%04d" % i for i in range(320)])
    taken: list[list[Message]] = [[] for _ in range(32)]

    def consumer(t: int) -> None:
        for _ in range(10):
            m = q.acquire(timeout=1, visibility=2 if t % 2 else 30)
            assert m is not None
            taken[t].append(m)

    with ThreadPoolExecutor(32) as pool:
        for f in [pool.submit(consumer, t) for t in range(32)]:
            f.result()
    assert sorted(m.body for part in taken for m in part) == [b"m%04d" % i for i in range(320)]
    assert q._acquires is not None and q._acquires.round_trips < 320 / 2  # shared
    short = {m.id for t, part in enumerate(taken) if t % 2 for m in part}
    time.sleep(2.3)
    assert q.repair().expired_leases == len(short)  # the 2 s leases lapsed, the 30 s ones hold
    assert {m.id for m in q.pop_many(400)} == short


def test_pushes_with_a_ttl_or_a_delay_share_round_trips_with_the_same_options(make_queue):
    q = make_queue(size=1024, message_bytes=16, pop_timeout=0)

    def pusher(t: int) -> list[int]:
        options = {"ttl": 60.0} if t % 2 else {"delay": 3.0}  # 640 pushes from 32 threads took 0.6 s in CI
        return [q.push(b"t%02d-%02d" % (t, i), **options) for i in range(20)]

    with ThreadPoolExecutor(32) as pool:
        ids = [f.result() for f in [pool.submit(pusher, t) for t in range(32)]]
    assert len({i for part in ids for i in part}) == 640
    assert q._pushes is not None and q._pushes.round_trips < 640 / 2  # shared
    now = q.pop_many(1000)
    assert sorted(m.id for m in now) == sorted(i for t, part in enumerate(ids) if t % 2 for i in part)
    time.sleep(3.1)
    later = q.pop_many(1000, timeout=1)
    assert sorted(m.id for m in later) == sorted(i for t, part in enumerate(ids) if not t % 2 for i in part)


def test_a_push_on_a_full_ring_keeps_its_own_timeout_with_smart_batching(make_queue):
    q = make_queue(size=64, message_bytes=16)
    q.push_many([b"x"] * 64)
    took: dict[float, float] = {}

    def push(timeout: float) -> None:
        started = time.monotonic()
        with pytest.raises(QueueFull):
            q.push(b"late", timeout=timeout)
        took[timeout] = time.monotonic() - started

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(push, 0.2), pool.submit(push, 1.2)]:
            f.result()
    assert 0.2 <= took[0.2] < 1.0 and took[1.2] >= 1.2
    assert q.stats().depth == 64  # neither stored


def test_threads_taking_turns_keep_their_connections(make_queue):
    """Calls that go alone (acquire_many) between shared acks: the connections they come back
    with stay in the pool past pool_size, instead of one opened and closed a call."""
    q = make_queue(size=4096, message_bytes=16, pool_size=2)
    q.push_many([b"m"] * 2000)
    connect = q._connect
    opened = [0]

    def counting() -> Any:
        opened[0] += 1
        return connect()

    q._connect = counting  # type: ignore[method-assign]

    def consumer() -> None:
        while got := q.acquire_many(1, timeout=0):
            got[0].ack()

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(consumer) for _ in range(16)]:
            f.result()
    assert q.stats().acquired == 2000
    assert opened[0] <= 16  # at most one a thread


def test_smart_batching_can_be_turned_off(make_queue):
    q = make_queue(smart_batching=False)
    assert q._pushes is None and q._pops is None and q._acks is None and q.push(b"a") > 0


def test_an_ack_on_the_common_path_acks_and_moves_the_totals(make_queue):
    """On SQL Server the ack read @@ROWCOUNT after an IF, which may reset it: the common ack
    would have answered "lease lost" and left the totals unmoved."""
    q = make_queue()
    q.push(b"one")
    m = q.acquire(timeout=5)
    assert m is not None
    m.ack()
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.acquired, stats.popped) == (0, 0, 1, 1)
    with pytest.raises(LeaseLost):
        m.ack()


def test_delayed_messages_pushed_in_bulk_are_delivered_once_due_without_a_pause(make_queue):
    """Each delayed message spends a position that pops skip (void). A pop used to give up after
    1000 of them and answer "empty", and looked for due messages with a scan of the spill table:
    5,000 due messages took seconds to start coming, then came about 500 a second."""
    q = make_queue(size=1024, message_bytes=16, pop_timeout=0)
    ids = [i for _ in range(10) for i in q.push_many([b"d"] * 500, delay=0.01)]
    time.sleep(0.05)
    first = q.pop_many(500)  # no wait: the messages are due
    assert len(first) == 500
    rest = []
    while got := q.pop_many(500):
        rest += got
    assert sorted(m.id for m in first + rest) == sorted(ids)  # each once
    assert q.stats().depth == 0


def test_a_year_long_ttl_delay_and_visibility_are_taken(make_queue):
    """DATEADD(millisecond, ...) takes an int (about 596 hours): SQL Server adds seconds, then
    the milliseconds left."""
    year = 8760 * 3600.0
    q = make_queue()
    q.push(b"kept a year", ttl=year)
    m = q.acquire(timeout=5, visibility=year)
    assert m is not None and m.body == b"kept a year"
    m.extend(year)
    assert m.nack(delay=year) is False
    stats = q.stats()
    assert (stats.delayed, stats.depth, stats.in_flight) == (1, 0, 0)
    assert q.pop(timeout=0.2) is None


@pytest.mark.skipif(not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here")
def test_a_user_with_only_execute_on_the_schema_pushes_and_pops():
    """The procedures run WITH EXECUTE AS OWNER: a user without VIEW DEFINITION still has them
    read sys.sequences (metadata visibility), so positions and totals are right."""
    with queues(MSSQL_DSN) as make:
        q = make()
        user = f"dbq_app_{secrets.token_hex(3)}"
        with q._cursor() as cur:
            cur.execute(f"CREATE USER [{user}] WITHOUT LOGIN")
            try:
                cur.execute(f"GRANT EXECUTE ON SCHEMA::[{SCHEMA}] TO [{user}]")
                cur.execute(f"EXECUTE AS USER = N'{user}'")
                try:
                    call = call_statement("sqlserver", q.names, "push")
                    pushed = cur.execute(call, b"as the app", 0).fetchall()
                    assert int(pushed[0][0]) > 0
                    stats = cur.execute(call_statement("sqlserver", q.names, "stats")).fetchall()[0]
                    assert (int(stats[0]), int(stats[2])) == (1, 1)  # depth, pushed
                finally:
                    cur.execute("REVERT")
            finally:
                cur.execute(f"DROP USER [{user}]")
