"""Online resize of rings: the generations' planning, and grows and shrinks made while producers
and consumers run at full speed, on the real PostgreSQL server, with logins as in production; the
same steps between calls on every ring dialect (SQL Server with DBQ_MSSQL_DSN)."""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyodbc
import pytest

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing, Retired
from dbq.backends.ring_resize import Generation, ResizeState, chunks, place_generation
from dbq.client import QueueFull, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames
from tests.manifests import queue
from tests.sqlserver import MSSQL_DSN, on_sqlserver
from tests.test_access import Accounts
from tests.workers import finish, read_logs, start


# --- planning ----------------------------------------------------------------------------------
def test_a_new_generation_takes_the_lowest_slots_no_generation_alive_holds():
    assert place_generation([], 10) == 0
    assert place_generation([Generation(1, 0, 1000)], 100_000) == 1000
    # retired below: the slots are used again
    assert place_generation([Generation(5000, 1000, 100_000)], 1000) == 0
    assert place_generation([Generation(5000, 1000, 100_000)], 1001) == 101_000
    alive = [Generation(1, 0, 10), Generation(50, 30, 10), Generation(90, 10, 15)]
    assert place_generation(alive, 5) == 25 and place_generation(alive, 6) == 40
    with pytest.raises(ValueError):
        place_generation(alive, 0)


def test_the_oldest_generation_retires_once_every_position_it_holds_is_drawn():
    gens = (Generation(1, 0, 10), Generation(101, 10, 50), Generation(301, 60, 5))
    assert ResizeState(gens, 99).retirable() is None
    assert ResizeState(gens, 99).positions_left() == 201
    assert ResizeState(gens, 100).retirable() == gens[0]
    assert ResizeState(gens[1:], 299).retirable() is None
    assert ResizeState(gens[2:], 0).retirable() is None and ResizeState(gens[2:], 0).positions_left() == 0
    assert chunks(0, 45, 20) == [(0, 20), (20, 40), (40, 45)] and chunks(5, 5, 20) == []


# --- on the real server -----------------------------------------------------------------------------
SCHEMA = f"resize_{secrets.token_hex(3)}"


def backend(postgres, name: str, size: int, **more: object) -> OdbcRing:
    spec = QueueSpec.model_validate(
        {
            **queue()["spec"],
            "connection": {"secretRef": {"name": "s"}, "schema": SCHEMA},
            "ring": {"size": size},
            **more,
        }
    )
    made = open_backend(spec, name, from_url(postgres.url))
    assert isinstance(made, OdbcRing)
    return made


@pytest.fixture(scope="module")
def accounts(postgres) -> Iterator[Accounts]:
    made = Accounts(postgres)
    yield made
    made.close()


def generations(postgres, name: str) -> list[tuple[int, int, int]]:
    cur = postgres.connect().cursor()
    rows = cur.execute(f'SELECT first_pos, slot_base, size FROM "{SCHEMA}"."{name}_gens" ORDER BY first_pos')
    return [tuple(int(v) for v in r) for r in rows.fetchall()]


def slots(postgres, name: str) -> tuple[int, int, int]:
    cur = postgres.connect().cursor()
    row = cur.execute(f'SELECT count(*), min(slot), max(slot) FROM "{SCHEMA}"."{name}_ring"').fetchone()
    return tuple(int(v) for v in row)


def retire_all(ring: OdbcRing, timeout: float = 60) -> Retired:
    deadline = time.monotonic() + timeout
    while (done := ring.retire()) is None or done.resizing:
        assert time.monotonic() < deadline, f"still draining: {done}"
        time.sleep(0.2)
    return done


def test_a_ring_grows_and_shrinks_between_calls_and_keeps_order_leases_and_counts(postgres, accounts):
    name = "steps"
    backend(postgres, name, 16).apply()
    _, url = accounts.login({name: ("send", "receive", "monitor")}, SCHEMA)
    with connect(url, name, schema=SCHEMA, smart_batching=False) as q:
        q.push_many([f"a{i}".encode() for i in range(16)])
        with pytest.raises(QueueFull):  # 16 slots, all taken
            q.push(b"full", timeout=0)
        held = q.acquire(timeout=0)
        assert held is not None and held.body == b"a0"
        grown = backend(postgres, name, 40).resize()
        assert grown is not None and (grown.from_size, grown.to_size) == (16, 40)
        assert generations(postgres, name) == [(1, 0, 16), (17, 16, 40)]
        q.push_many([f"b{i}".encode() for i in range(40)], timeout=0)  # the new generation's 40 slots
        with pytest.raises(QueueFull):
            q.push(b"full again", timeout=0)
        s = q.stats()
        assert (s.depth, s.in_flight) == (55, 1)
        # The older generation drains first, in push order; the lease taken in it is acked after.
        got = [m.body.decode() for m in q.pop_many(20, timeout=0)]
        assert got == [f"a{i}" for i in range(1, 16)] + [f"b{i}" for i in range(5)]
        done = backend(postgres, name, 40).retire()
        assert done is not None and (done.retired, done.alive, done.leased) == (
            1,
            1,
            0,
        )  # the lease moved with it
        assert generations(postgres, name) == [(17, 16, 40)] and slots(postgres, name) == (40, 16, 55)
        held.ack()  # LeaseLost otherwise
        # A shrink: pushes past the boundary land in 16 slots while 35 messages drain.
        shrunk = backend(postgres, name, 16).resize()
        assert shrunk is not None and shrunk.to_size == 16
        assert generations(postgres, name) == [(17, 16, 40), (57, 0, 16)]
        q.push_many([f"c{i}".encode() for i in range(16)], timeout=0)
        with pytest.raises(QueueFull):
            q.push(b"c16", timeout=0)
        with pytest.raises(pyodbc.Error, match="holds 16 messages"):
            postgres.connect().cursor().execute(f'SELECT "{SCHEMA}"."{name}_send"(?)', b"refused").fetchall()
        draining = backend(postgres, name, 16).retire()
        assert draining is not None and draining.positions_left == 35
        rest = [m.body.decode() for m in q.pop_many(100, timeout=0)]
        assert rest == [f"b{i}" for i in range(5, 40)] + [f"c{i}" for i in range(16)]
        done = retire_all(backend(postgres, name, 16))
        assert done.alive == 1 and slots(postgres, name) == (16, 0, 15)
        s = q.stats()
        assert (s.depth, s.in_flight, s.pushed, s.popped) == (0, 0, 72, 72)


@pytest.mark.parametrize("dialect", ["postgres", on_sqlserver("sqlserver")])
def test_every_dialect_grows_and_shrinks_a_ring_between_calls_in_push_order(request, dialect: str):
    """The steps above through the backend and the client alone, so that they run on SQL Server too
    (here on PostgreSQL, which proves the test; with DBQ_MSSQL_DSN on SQL Server)."""
    url = request.getfixturevalue("postgres").url if dialect == "postgres" else MSSQL_DSN
    target = RingTarget(QueueNames(SCHEMA, f"each_{secrets.token_hex(3)}"), 16, 100, resize=True)

    def sized(size: int) -> OdbcRing:
        return OdbcRing(from_url(url), replace(target, size=size))

    sized(16).apply()
    try:
        with connect(url, target.names.queue, schema=SCHEMA, smart_batching=False) as q:
            q.push_many([f"a{i}".encode() for i in range(16)])
            held = q.acquire(timeout=0)
            assert held is not None and held.body == b"a0"
            grown = sized(40).resize()
            assert grown is not None
            assert (grown.from_size, grown.to_size, grown.positions_left) == (16, 40, 15)
            q.push_many([f"b{i}".encode() for i in range(40)], timeout=0)
            with pytest.raises(QueueFull):
                q.push(b"full", timeout=0)
            got = [m.body.decode() for m in q.pop_many(20, timeout=0)]
            assert got == [f"a{i}" for i in range(1, 16)] + [f"b{i}" for i in range(5)]
            done = sized(40).retire()
            assert done is not None and (done.retired, done.alive) == (1, 1)
            held.ack()  # its lease moved to the spill table with the older ring
            assert sized(16).resize() is not None
            q.push_many([f"c{i}".encode() for i in range(16)], timeout=0)
            with pytest.raises(QueueFull, match="16"):
                q.push(b"c16", timeout=0)
            rest = [m.body.decode() for m in q.pop_many(100, timeout=0)]
            assert rest == [f"b{i}" for i in range(5, 40)] + [f"c{i}" for i in range(16)]
            assert retire_all(sized(16)).alive == 1
            s = q.stats()
            assert (s.depth, s.in_flight, s.pushed, s.popped) == (0, 0, 72, 72)
    finally:
        sized(16).teardown()


def test_a_reconcile_keeps_a_ring_auto_grow_grew_and_shrinks_it_once_auto_grow_is_gone(postgres):
    """A reconcile that read the status before the upkeep recorded a growth asks for the spec's
    size: the ring stays as grown while autoGrow allows its size."""
    name = "regrown"

    def reconciled(**ring: object) -> OdbcRing:
        spec = QueueSpec.model_validate(
            {**queue()["spec"], "connection": {"secretRef": {"name": "s"}, "schema": SCHEMA}, "ring": ring}
        )
        made = open_backend(spec, name, from_url(postgres.url), provisioned=True)
        assert isinstance(made, OdbcRing)
        return made

    grow = {"size": 64, "autoGrow": {"maxSize": 256}}
    reconciled(**grow).apply()
    assert reconciled(**grow).resize(128) is not None  # the upkeep's growth
    assert reconciled(**grow).apply().resized is None  # a reconcile of the status before it
    assert generations(postgres, name)[-1][2] == 128
    shrunk = reconciled(size=64).apply().resized  # autoGrow removed: back to spec.ring.size
    assert shrunk is not None and (shrunk.from_size, shrunk.to_size) == (128, 64)


@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_producers_and_consumers_at_full_speed_lose_and_duplicate_nothing_through_grows_and_a_shrink(
    postgres, accounts, tmp_path: Path, mode: str
):
    """4 pushing processes and 4 taking ones (sending and receiving logins), a repairer as the
    operator; meanwhile the ring grows 50 -> 2,000 -> 20,000, then shrinks to 50, each switch
    made while they run and each older generation retired as soon as it drained."""
    name = f"busy_{mode}"
    backend(postgres, name, 50).apply()
    _, producer = accounts.login({name: ("send",)}, SCHEMA)
    _, worker = accounts.login({name: ("receive",)}, SCHEMA)
    n, stop = 24_000, tmp_path / "stop"
    logs = [tmp_path / f"w{i}.log" for i in range(9)]
    with connect(postgres.url, name, schema=SCHEMA, smart_batching=False) as q:
        pushers = [start("push", q, producer, logs[i], "--prefix", f"p{i}", "--count", str(n // 4), "--batch", "10")
                   for i in range(4)]  # fmt: skip
        poppers = [start("pop", q, worker, logs[4 + i], "--mode", mode, "--batch", "10", "--stop", str(stop))
                   for i in range(4)]  # fmt: skip
        repairer = start("repair", q, postgres.url, logs[8], "--stop", str(stop))
        switches, retired, errors = [], [], []

        def resizer() -> None:
            try:
                for size in (2_000, 20_000, 50):
                    time.sleep(1.5)
                    made = backend(postgres, name, size).resize()
                    assert made is not None
                    switches.append(made)
                    retired.append(retire_all(backend(postgres, name, size), timeout=120))
            except Exception as e:  # reported by the test's thread
                errors.append(e)

        thread = threading.Thread(target=resizer)
        thread.start()
        finish(pushers)
        thread.join(timeout=300)
        stop.touch()
        finish([*poppers, repairer])
        assert not errors, errors
        q.repair(orphan_grace=0.0)
        drained = [m.body.decode() for m in q.pop_many(1000, timeout=0)]
        seen = read_logs(logs)
        delivered = seen["G"] if mode == "amo" else seen["A"]
        delivered.update(drained)
        assert [(s.from_size, s.to_size) for s in switches] == [(50, 2_000), (2_000, 20_000), (20_000, 50)]
        assert all(r.alive == 1 for r in retired)
        assert sum(seen["P"].values()) == n and len(seen["P"]) == n  # every push acknowledged
        assert delivered == seen["P"]  # nothing lost, nothing twice
        s = q.stats()
        assert (s.depth, s.in_flight, s.pushed) == (0, 0, n)
        assert generations(postgres, name)[-1][2] == 50 and slots(postgres, name)[0] == 50


# --- crashes ---------------------------------------------------------------------------------------
STEP = str(Path(__file__).with_name("resize_step.py"))


def step(action: str, url: str, name: str, size: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, STEP, action, url, SCHEMA, name, str(size)], stderr=subprocess.PIPE
    )


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)


def killed_when(proc: subprocess.Popen[bytes], check: Callable[[], bool], what: str) -> None:
    """SIGKILL `proc` as soon as `check` holds (it may have ended already: then it is reaped)."""
    wait_until(lambda: check() or proc.poll() is not None, 120, what)
    proc.kill()
    proc.wait()


# (phase, from size, to size): where the process making the resize is killed
PHASES = [
    ("preparing", 1_000, 300_000),  # some of the new slots written, no switch yet
    ("switched", 1_000, 2_000),  # the new generation recorded
    ("draining", 1_000, 2_000),  # the older ring still holds messages
    ("dropping", 300_000, 1_000),  # the older ring retired, its slots being deleted
]


@pytest.mark.parametrize(("phase", "before", "after"), PHASES, ids=[p[0] for p in PHASES])
def test_a_resize_killed_at_any_step_completes_when_run_again_and_loses_nothing(
    postgres, accounts, tmp_path: Path, phase: str, before: int, after: int
):
    """Producers and leased consumers run throughout; the process resizing (or retiring) is
    SIGKILLed in `phase`, then a new one finishes the work: one ring of the new size, every
    message delivered once."""
    name = f"crash_{phase}"
    backend(postgres, name, before).apply()
    _, producer = accounts.login({name: ("send",)}, SCHEMA)
    _, worker = accounts.login({name: ("receive",)}, SCHEMA)
    rows = f'SELECT count(*) FROM "{SCHEMA}"."{name}_ring"'
    gens = f'SELECT count(*) FROM "{SCHEMA}"."{name}_gens"'
    cur = postgres.connect().cursor()
    n, stop = 4_000, tmp_path / "stop"
    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    with connect(postgres.url, name, schema=SCHEMA, smart_batching=False) as q:
        q.push_many([f"early{i}".encode() for i in range(1000)])  # the older ring holds messages
        pushers = [start("push", q, producer, logs[i], "--prefix", f"p{i}", "--count", str(n // 2), "--batch", "5")
                   for i in range(2)]  # fmt: skip
        poppers = [start("pop", q, worker, logs[2 + i], "--mode", "leased", "--batch", "5", "--stop", str(stop))
                   for i in range(2)]  # fmt: skip
        if phase == "preparing":
            killed_when(step("resize", postgres.url, name, after),
                        lambda: cur.execute(rows).fetchval() > before + 20_000, "some slots prepared")  # fmt: skip
            assert cur.execute(gens).fetchval() == 1  # not switched
        elif phase == "switched":
            killed_when(step("resize", postgres.url, name, after), lambda: cur.execute(gens).fetchval() == 2,
                        "switched")  # fmt: skip
        else:
            assert step("resize", postgres.url, name, after).wait(timeout=300) == 0
            if phase == "draining":
                retiring = step("retire", postgres.url, name, after)
                time.sleep(0.3)
                assert cur.execute(gens).fetchval() == 2  # still draining when killed
                retiring.kill()
                retiring.wait()
            else:
                killed_when(step("retire", postgres.url, name, after),
                            lambda: cur.execute(gens).fetchval() == 1 and cur.execute(rows).fetchval() < before,
                            "the older slots being deleted")  # fmt: skip
        # A new process (the operator restarted) finishes the work.
        assert step("resize", postgres.url, name, after).wait(timeout=300) == 0
        assert step("retire", postgres.url, name, after).wait(timeout=300) == 0
        finish(pushers)
        stop.touch()
        finish(poppers)
        q.repair(orphan_grace=0.0)
        drained = [m.body.decode() for m in q.pop_many(5000, timeout=0)]
    assert generations(postgres, name)[-1][2] == after and cur.execute(gens).fetchval() == 1
    assert cur.execute(rows).fetchval() == after
    seen = read_logs(logs)
    delivered = seen["A"]
    delivered.update(drained)
    assert sum(seen["P"].values()) == n  # every push acknowledged
    pushed = seen["P"] + Counter(f"early{i}" for i in range(1000))
    assert delivered == pushed  # nothing lost, nothing twice


def test_a_snapshot_held_through_a_shrink_delays_neither_traffic_nor_the_older_ring_s_retirement(postgres):
    """A REPEATABLE READ transaction (a Spark job's, say) holds its snapshot of the ring while it
    shrinks: pushes and pops go on, the switch and the retirement take no lock it holds, and the
    snapshot still reads the rows as they were."""
    name = "held"
    backend(postgres, name, 20_000).apply()
    ring_rows = f'SELECT count(*) FROM "{SCHEMA}"."{name}_ring"'
    with connect(postgres.url, name, schema=SCHEMA, smart_batching=False) as q:
        q.push_many([f"old{i}".encode() for i in range(100)])
        reader = pyodbc.connect(postgres.odbc, autocommit=False)
        snapshot = reader.cursor()
        snapshot.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert snapshot.execute(ring_rows).fetchval() == 20_000  # the snapshot is taken, its lock held
        started = time.monotonic()
        assert backend(postgres, name, 1_000).resize() is not None
        q.push_many([f"new{i}".encode() for i in range(100)])
        got = [m.body.decode() for m in q.pop_many(300, timeout=0)]
        assert got == [f"old{i}" for i in range(100)] + [f"new{i}" for i in range(100)]
        done = retire_all(backend(postgres, name, 1_000), timeout=60)
        took = time.monotonic() - started
        assert done.alive == 1 and took < 30, took  # not held back by the snapshot
        assert snapshot.execute(ring_rows).fetchval() == 20_000  # its view is unchanged
        reader.rollback()
        reader.close()
    assert postgres.connect().cursor().execute(ring_rows).fetchval() == 1_000


def test_dead_letters_and_the_archive_go_on_through_a_resize(postgres):
    """Leases taken in the older ring end after the switch as a nack to the dead letters and an
    ack to the archive; what is popped from both rings is archived."""
    more = {"deadLetter": {"maxAttempts": 1}, "archive": {"enabled": True, "retention": "1h"}}
    name = "kept"
    backend(postgres, name, 16, **more).apply()
    since = datetime.now(UTC) - timedelta(minutes=1)
    with connect(postgres.url, name, schema=SCHEMA, smart_batching=False) as q:
        q.push_many([f"a{i}".encode() for i in range(16)])
        dying, done = q.acquire(timeout=0), q.acquire(timeout=0)
        assert dying is not None and done is not None
        assert backend(postgres, name, 32, **more).resize() is not None
        q.push_many([f"b{i}".encode() for i in range(32)], timeout=0)
        assert dying.nack(error="broken") is True  # acquired once, maxAttempts 1: dead-lettered
        done.ack()
        assert len(q.pop_many(100, timeout=0)) == 14 + 32
        assert retire_all(backend(postgres, name, 32, **more)).alive == 1
        dead = q.dead_letters()
        assert [(d.body, d.error) for d in dead] == [(b"a0", "broken")]
        assert len(q.archived(since, limit=100)) == 1 + 14 + 32


def test_leases_of_a_killed_client_in_the_older_ring_come_back_once_after_their_lease(postgres):
    """A client acquires messages in the ring, then is SIGKILLed; the ring grows and the older
    one retires while they are leased (they move to the spill table with their lease); once the
    leases run out they are delivered again, each once."""
    name = "orphaned"
    backend(postgres, name, 16).apply()
    with connect(postgres.url, name, schema=SCHEMA, smart_batching=False) as q:
        q.push_many([f"a{i}".encode() for i in range(10)])
        holder = subprocess.Popen([sys.executable, "-c", (
            "import time\n"
            "from dbq.client import connect\n"
            f"q = connect({postgres.url!r}, {name!r}, schema={SCHEMA!r}, smart_batching=False)\n"
            "held = [q.acquire(timeout=0, visibility=3) for _ in range(4)]\n"
            "print(' '.join(m.body.decode() for m in held), flush=True)\n"
            "time.sleep(600)\n"
        )], stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert holder.stdout is not None
        leased = holder.stdout.readline().split()
        holder.kill()
        holder.wait()
        assert leased == ["a0", "a1", "a2", "a3"]
        assert backend(postgres, name, 64).resize() is not None
        rest = [m.body.decode() for m in q.pop_many(100, timeout=0)]
        assert rest == [f"a{i}" for i in range(4, 10)]
        done = retire_all(backend(postgres, name, 64))
        assert done.alive == 1  # retired while the four were still leased
        back: list[str] = []
        deadline = time.monotonic() + 30
        while len(back) < 4 and time.monotonic() < deadline:
            q.repair()  # the operator's cleanup: leases past their end come back
            got = q.acquire(timeout=1)
            if got is not None:
                back.append(got.body.decode())
                got.ack()
        assert sorted(back) == leased
        assert q.acquire(timeout=0) is None
        s = q.stats()
        assert (s.depth, s.in_flight) == (0, 0)
