"""The row contract: read, send and send_batch answer rows and raise errors, for a worker in any
language. On PostgreSQL called as such a worker would: psycopg (and node-postgres) on a login
holding only the send or receive right, never the operator's. The T-SQL twin runs when
DBQ_MSSQL_DSN names a SQL Server (none can run here)."""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyodbc
import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue, connect
from dbq.connection import from_url, odbc
from dbq.contract.ring import HOLE_GRACE_S, RingTarget
from dbq.names import QueueNames
from tests.local import NODE_MODULES
from tests.sqlserver import MSSQL_DSN
from tests.test_access import Accounts
from tests.workers import read_logs

SCHEMA = "rows_q"
WORKER = Path(__file__).with_name("node") / "row_worker.cjs"


class RowQueue:
    """A ring queue made by the operator's login, and a worker's connection to it (send and
    receive rights, nothing else)."""

    def __init__(self, postgres: Any, accounts: Accounts, size: int = 1000, **options: Any) -> None:
        self.name = f"q_{secrets.token_hex(4)}"
        self.backend = OdbcRing(
            from_url(postgres.url), RingTarget(QueueNames(SCHEMA, self.name), size, 64, **options)
        )
        self.backend.apply()
        _, self.url = accounts.login({self.name: ("send", "receive")}, schema=SCHEMA)
        self.db = psycopg.connect(self.url, autocommit=True)
        self.admin = connect(postgres.url, self.name, schema=SCHEMA, smart_batching=False)
        assert isinstance(self.admin, Queue)

    def fn(self, verb: str) -> str:
        return f'"{SCHEMA}"."{self.name}_{verb}"'

    def send(
        self, body: bytes, headers: dict[str, Any] | None = None, delay_ms: int = 0, ttl_ms: int = 0
    ) -> int:
        row = self.db.execute(
            f"SELECT {self.fn('send')}(%s, %s::jsonb, %s, %s)",
            (body, None if headers is None else json.dumps(headers), delay_ms, ttl_ms),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def send_batch(
        self, bodies: list[bytes], headers: list[dict[str, Any] | None] | None = None
    ) -> list[int | None]:
        encoded = None if headers is None else [None if h is None else json.dumps(h) for h in headers]
        rows = self.db.execute(f"SELECT * FROM {self.fn('send_batch')}(%s, %s::jsonb[])", (bodies, encoded))
        return [r[0] for r in rows.fetchall()]

    def read(self, qty: int, visibility_ms: int = 0, wait_ms: int = 0) -> list[dict[str, Any]]:
        cur = self.db.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(
            f"SELECT * FROM {self.fn('read')}(%s, %s, %s)", (qty, visibility_ms, wait_ms)
        ).fetchall()

    def by_id(self, verb: str, ids: list[int] | None, *more: Any) -> list[dict[str, Any]]:
        """delete, archive or set_vt on these ids: the rows they answer."""
        marks = ", %s" * len(more)
        cur = self.db.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(f"SELECT * FROM {self.fn(verb)}(%s::bigint[]{marks})", (ids, *more)).fetchall()

    def close(self) -> None:
        self.db.close()
        self.admin.close()
        self.backend.teardown()
        self.backend.close()


@pytest.fixture(scope="module")
def accounts(postgres) -> Iterator[Accounts]:
    made = Accounts(postgres)
    yield made
    made.close()


@pytest.fixture
def make(postgres, accounts) -> Iterator[Any]:
    made: list[RowQueue] = []

    def new(**options: Any) -> RowQueue:
        made.append(RowQueue(postgres, accounts, **options))
        return made[-1]

    yield new
    for q in made:
        q.close()


def test_rows_carry_id_lease_attempts_times_headers_and_body_in_both_modes(make):
    q = make()
    before = time.time()
    first = q.send(b"one", {"trace": "t-1", "n": 1})
    ids = q.send_batch([b"two", b"three"], [{"n": 2}, None])
    assert ids == [first + 1, first + 2]
    leased = q.read(2, visibility_ms=30_000)
    assert [r["body"] for r in leased] == [b"one", b"two"]
    one = leased[0]
    assert one["msg_id"] == first and one["lease"] > 0 and one["attempts"] == 1
    assert one["headers"] == {"trace": "t-1", "n": 1}
    assert before - 1 < one["enqueued_at"].timestamp() <= time.time()
    assert 29 < one["visible_at"].timestamp() - time.time() <= 30
    popped = q.read(5)  # at most once: no lease, no visibility; the rest of the queue
    assert [(r["msg_id"], r["body"], r["lease"], r["visible_at"], r["headers"]) for r in popped] == [
        (first + 2, b"three", None, None, None)
    ]
    assert q.read(5) == []  # empty: no rows, no status
    assert q.db.execute(f"SELECT {q.fn('ack')}(%s, %s)", (one["msg_id"], one["lease"])).fetchone() == (1,)
    s = q.admin.stats()
    assert (s.pushed, s.acquired, s.popped, s.in_flight, s.depth) == (3, 2, 2, 1, 0)  # popped counts the ack


def test_nacked_and_delayed_messages_come_back_as_rows_with_their_attempts(make):
    q = make()
    q.send(b"later", {"k": "v"}, delay_ms=1500)  # not due before the nack below comes back
    q.send(b"now")
    got = q.read(10, visibility_ms=10_000)
    assert [r["body"] for r in got] == [b"now"]
    q.db.execute(f"SELECT {q.fn('nack')}(%s, %s, 0, 'try again')", (got[0]["msg_id"], got[0]["lease"]))
    again = q.read(10, visibility_ms=10_000)
    assert [(r["body"], r["attempts"]) for r in again] == [(b"now", 2)]
    due = q.read(10, wait_ms=5000)  # waits for it
    assert [(r["body"], r["headers"], r["attempts"]) for r in due] == [(b"later", {"k": "v"}, 0)]


def test_a_run_of_positions_that_will_never_be_written_does_not_hide_the_message_after_it(make):
    q = make()
    for i in range(12):  # each leaves a void position
        q.send(b"d%d" % i, delay_ms=60_000)
    q.send(b"ready")
    assert [r["body"] for r in q.read(5)] == [b"ready"]  # not an empty answer after 5 void positions


def test_a_body_past_a_slot_and_the_archive_go_through_rows(make):
    q = make(archive=True)
    large = os.urandom(200_000)
    q.send_batch([large, b"small"])
    assert [r["body"] for r in q.read(1)] == [large]
    assert [r["body"] for r in q.read(1, visibility_ms=5_000)] == [b"small"]
    assert q.admin.stats().archived == 1
    assert [m.body for m in q.admin.archived(datetime.now(UTC) - timedelta(minutes=1))] == [large]


def test_delete_and_set_vt_find_messages_by_id_with_no_lease_whatever_their_state(make):
    """Ready, delayed and leased messages alike, found by id; a lease held on one is lost; an id
    never sent, or ended already, is left out of the answer; the totals stay exact."""
    q = make()
    a, b, c, d, e = q.send_batch([b"a", b"b", b"c", b"d", b"e"])
    f = q.send(b"f", delay_ms=60_000)
    [leased] = q.read(1, visibility_ms=30_000)
    assert leased["msg_id"] == a
    assert q.by_id("delete", [b, a, f, f + 1000, b]) == [{"msg_id": b}, {"msg_id": a}, {"msg_id": f}]
    assert q.db.execute(f"SELECT {q.fn('ack')}(%s, %s)", (a, leased["lease"])).fetchone() == (
        0,
    )  # lease lost
    s = q.admin.stats()
    assert (s.depth, s.in_flight, s.delayed, s.popped) == (3, 0, 0, 3)
    [later] = q.by_id("set_vt", [c], 60_000)
    assert (later["msg_id"], later["body"], later["lease"], later["attempts"]) == (c, b"c", None, 0)
    assert 59 < later["visible_at"].timestamp() - time.time() <= 60
    assert [r["body"] for r in q.read(10, visibility_ms=30_000)] == [b"d", b"e"]  # c waits
    assert (q.admin.stats().delayed, q.admin.stats().in_flight) == (1, 2)
    moved = q.by_id("set_vt", [c, d], 0)  # c due at once; d's lease ends, ready again
    assert [(r["msg_id"], r["attempts"]) for r in moved] == [(c, 0), (d, 1)]
    again = q.read(10, visibility_ms=30_000)
    assert sorted((r["body"], r["attempts"]) for r in again) == [(b"c", 1), (b"d", 2)]
    assert q.by_id("delete", [c, d, e]) == [{"msg_id": c}, {"msg_id": d}, {"msg_id": e}]
    s = q.admin.stats()
    assert (s.depth, s.in_flight, s.delayed, s.pushed, s.popped) == (0, 0, 0, 6, 6)
    assert q.by_id("delete", []) == [] and q.by_id("delete", None) == [] and q.by_id("set_vt", [a], 0) == []


def test_archive_by_id_keeps_the_message_and_a_queue_without_an_archive_refuses_it(make):
    q = make(archive=True)
    large = os.urandom(200_000)  # its body in the content table: archived and removed with it
    one, two = q.send_batch([large, b"small"])
    q.send(b"delayed", delay_ms=60_000)
    assert q.by_id("archive", [one, two + 1]) == [{"msg_id": one}, {"msg_id": two + 1}]
    assert q.by_id("delete", [two]) == [{"msg_id": two}]  # spec.archive keeps whatever ends
    kept = q.admin.archived(datetime.now(UTC) - timedelta(minutes=1))
    assert sorted(m.body for m in kept) == sorted([large, b"small", b"delayed"])
    assert q.admin.stats().archived == 3 and q.admin.stats().depth == 0
    with q.admin._cursor() as cur:
        assert cur.execute(f'SELECT count(*) FROM "{SCHEMA}"."{q.name}_content"').fetchval() == 0
    plain = make()
    kept_id = plain.send(b"stays")
    with pytest.raises(psycopg.Error) as refused:
        plain.by_id("archive", [kept_id])
    assert refused.value.sqlstate == "55000"
    assert f"queue {plain.name} keeps no archive" in str(refused.value) and "spec.archive.enabled" in str(
        refused.value
    )
    assert [r["body"] for r in plain.read(1)] == [b"stays"]  # nothing changed
    with pytest.raises(psycopg.Error) as refused:
        plain.by_id("set_vt", [kept_id], -1)
    assert refused.value.sqlstate == "22023" and "visibility_ms must be 0 or more, not -1" in str(
        refused.value
    )


def test_deletes_by_id_racing_leased_readers_end_each_message_once(make):
    """3 workers read leased and ack while another deletes random ids: every message ends once,
    by an ack that succeeded or by a delete that answered its id, never both."""
    q = make(size=4000)
    ids = [i for chunk in range(4) for i in q.send_batch([b"m%d" % (chunk * 500 + k) for k in range(500)])]
    acked: list[int] = []
    deleted: list[int] = []
    url = q.url

    def work() -> None:
        with psycopg.connect(url, autocommit=True) as db:
            while rows := db.execute(f"SELECT msg_id, lease FROM {q.fn('read')}(10, 30000)").fetchall():
                for msg_id, lease in rows:
                    if db.execute(f"SELECT {q.fn('ack')}(%s, %s)", (msg_id, lease)).fetchone() == (1,):
                        acked.append(msg_id)

    def delete() -> None:
        rng = random.Random(7)
        with psycopg.connect(url, autocommit=True) as db:
            for _ in range(100):
                chosen = rng.sample(ids, 20)
                got = db.execute(f"SELECT * FROM {q.fn('delete')}(%s::bigint[])", (chosen,)).fetchall()
                deleted.extend(r[0] for r in got)

    threads = [threading.Thread(target=work) for _ in range(3)] + [threading.Thread(target=delete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert (
        not set(acked) & set(deleted) and len(acked) == len(set(acked)) and len(deleted) == len(set(deleted))
    )
    assert sorted(acked + deleted) == sorted(ids) and deleted  # the race was run
    s = q.admin.stats()
    assert (s.depth, s.in_flight, s.popped) == (0, 0, 2000)


def test_read_waits_for_the_first_message_up_to_wait_ms(make):
    q = make()
    started = time.monotonic()
    assert q.read(1, wait_ms=300) == []
    assert 0.28 < time.monotonic() - started < 2
    threading.Timer(0.3, lambda: q.admin.push(b"arrives")).start()
    started = time.monotonic()
    got = q.read(1, wait_ms=10_000)
    assert [r["body"] for r in got] == [b"arrives"] and time.monotonic() - started < 3


def test_a_position_whose_push_is_still_open_is_waited_for_inside_read(make, postgres):
    """A push drew the next position and has not committed: read waits for it there (no status
    code for the caller); one never committed is given up after the hole grace, and delivered to
    whoever reads once it arrives."""
    q = make()
    pusher = psycopg.connect(q.url)  # a transaction left open
    pusher.execute(f"SELECT {q.fn('send')}(%s)", (b"slow",))
    threading.Timer(0.4, pusher.commit).start()
    got = q.read(1, wait_ms=0)
    assert [r["body"] for r in got] == [b"slow"]
    pusher.execute(f"SELECT {q.fn('send')}(%s)", (b"abandoned",))  # open until after the grace
    started = time.monotonic()
    assert q.read(1) == []
    assert HOLE_GRACE_S <= time.monotonic() - started < HOLE_GRACE_S + 2
    pusher.commit()
    assert [r["body"] for r in q.read(1)] == [b"abandoned"]  # the skipped position, found again
    pusher.close()


@pytest.mark.parametrize(
    ("call", "args", "state", "message"),
    [
        ("read", (0, 0, 0), "22023", "qty must be at least 1, not 0"),
        (
            "read",
            (1, -5, 0),
            "22023",
            "visibility_ms must be 0 (at most once) or a lease in milliseconds, not -5",
        ),
        ("read", (1, 0, -1), "22023", "wait_ms must be 0 or more, not -1"),
        ("send", (None, None, 0, 0), "22004", "a body must not be NULL"),
        ("send", (b"x", None, -1, 0), "22023", "delay_ms must be 0 or more, not -1"),
        ("send", (b"x", '["not", "an object"]', 0, 0), "22023", "headers"),
        ("send_batch", ([b"a", b"b"], ['{"a": 1}'], 0, 0), "22023", "got 1 headers for 2 bodies"),
        ("send_batch", ([b"a", None], None, 0, 0), "22004", "a body must not be NULL"),
        ("send_batch", ([b"a"], ["[1]"], 0, 0), "22023", "headers must be a JSON object"),
        ("send_batch", ([b"a"], [json.dumps({"k": "v" * 2000})], 0, 0), "22001", "spec.messages.headerBytes"),
    ],
)
def test_bad_input_is_refused_naming_the_argument_and_changes_nothing(make, call, args, state, message):
    q = make()
    casts = {"read": "%s, %s, %s", "send": "%s, %s::jsonb, %s, %s", "send_batch": "%s, %s::jsonb[], %s, %s"}
    with pytest.raises(psycopg.Error) as refused:
        q.db.execute(f"SELECT * FROM {q.fn(call)}({casts[call]})", args)
    assert refused.value.sqlstate == state and message in str(refused.value)
    s = q.admin.stats()
    assert (s.pushed, s.depth, s.popped, s.acquired) == (0, 0, 0, 0)


def test_a_full_ring_refuses_send_and_a_batch_it_has_no_room_for_naming_spec_ring_size(make):
    q = make(size=4)
    q.send_batch([b"1", b"2", b"3"])
    with pytest.raises(psycopg.Error) as refused:
        q.send_batch([b"4", b"5"])  # refused whole: nothing of it is written
    assert "none of 2 was sent" in str(refused.value)
    q.send(b"4")
    with pytest.raises(psycopg.Error) as refused:
        q.send(b"5")
    for error in (refused.value,):
        assert error.sqlstate == "53400"
        assert f"queue {q.name} is full: its ring holds 4 messages (spec.ring.size)" in str(error)
    assert [r["body"] for r in q.read(10)] == [b"1", b"2", b"3", b"4"]
    s = q.admin.stats()
    assert (s.pushed, s.popped, s.depth) == (4, 4, 0)  # nothing refused was counted


def test_the_row_routines_are_granted_by_right_and_inherited_by_no_one(make, accounts):
    q = make()
    _, monitor = accounts.login({q.name: ("monitor",)}, schema=SCHEMA)
    with psycopg.connect(monitor, autocommit=True) as db:
        for statement in (f"SELECT {q.fn('send')}('x')", f"SELECT * FROM {q.fn('read')}(1, 0)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(statement)
    rows = q.db.execute(
        "SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = ANY(%s)",
        (SCHEMA, [f"{q.name}_{v}" for v in ("read", "send", "send_batch", "check_send")]),
    ).fetchall()
    assert sorted(rows) == sorted(
        (f"{q.name}_{v}", False) for v in ("read", "send", "send_batch", "check_send")
    )


@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_node_workers_on_the_row_contract_lose_and_duplicate_nothing(make, tmp_path, mode):
    """4 producers and 4 workers in Node (node-postgres from npm), each one statement a call, on
    a ring that laps 8 times (a producer meeting a full ring sends again); in leased mode every
    tenth message is nacked once and comes back."""
    q = make(size=500)
    stop, n = tmp_path / "stop", 4000
    logs = [tmp_path / f"w{i}.log" for i in range(8)]
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}

    def node(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["node", str(WORKER), *args], env=env, stderr=subprocess.PIPE)

    senders = [
        node("send", q.url, SCHEMA, q.name, str(logs[i]), str(n // 4), "25", f"p{i}") for i in range(4)
    ]
    readers = [
        node("read", q.url, SCHEMA, q.name, str(logs[4 + i]), mode, "20", str(stop), "10") for i in range(4)
    ]
    for p in senders:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode() if p.stderr else ""
    stop.touch()
    for p in readers:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode() if p.stderr else ""
    seen = read_logs(logs)
    assert len(seen["P"]) == n and sum(seen["P"].values()) == n
    delivered = seen["A"] if mode == "leased" else seen["G"]
    assert delivered == seen["P"]  # each once: nothing lost, nothing twice
    if mode == "leased":
        assert len(seen["N"]) == n // 10 and not seen["L"]
        assert all(seen["G"][b] == 2 for b in seen["N"])  # a nacked message came back once
    s = q.admin.stats()
    assert (s.depth, s.in_flight) == (0, 0)


@pytest.mark.skipif(not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here")
def test_the_row_procedures_on_sqlserver_answer_rows_in_both_modes():
    """The T-SQL twin: send, send_batch (bodies end to end with their lengths), read, ack; set_vt,
    delete and archive by id."""
    names = QueueNames(SCHEMA, f"q_{secrets.token_hex(4)}")
    backend = OdbcRing(from_url(MSSQL_DSN), RingTarget(names, 100, 64))
    backend.apply()
    conn = odbc.connect(from_url(MSSQL_DSN))
    conn.autocommit = True
    fn = f"[{SCHEMA}].[{names.queue}_"
    try:
        first = conn.execute(f"EXEC {fn}send] ?, ?", b"one", '{"n": 1}').fetchone()[0]
        ids = [r[0] for r in conn.execute(f"EXEC {fn}send_batch] ?, ?", b"twothree", "3,5").fetchall()]
        assert ids == [first + 1, first + 2]
        leased = conn.execute(f"EXEC {fn}read] ?, ?", 2, 30_000).fetchall()
        assert [(bytes(r.body), r.attempts) for r in leased] == [(b"one", 1), (b"two", 1)]
        assert json.loads(leased[0].headers) == {"n": 1} and leased[0].lease > 0
        assert conn.execute(f"EXEC {fn}ack] ?, ?", leased[0].msg_id, leased[0].lease).fetchone()[0] == 1
        popped = conn.execute(f"EXEC {fn}read] ?, ?", 5, 0).fetchall()
        assert [(bytes(r.body), r.lease) for r in popped] == [(b"three", None)]
        assert conn.execute(f"EXEC {fn}read] ?, ?, ?", 5, 0, 200).fetchall() == []
        # by id, with no lease: the leased "two" and a new "four" (ids comma-separated)
        four = conn.execute(f"EXEC {fn}send] ?", b"four").fetchone()[0]
        hidden = conn.execute(f"EXEC {fn}set_vt] ?, ?", f"{four},{four + 99}", 60_000).fetchall()
        assert [(r.msg_id, bytes(r.body), r.lease) for r in hidden] == [(four, b"four", None)]
        assert conn.execute(f"EXEC {fn}read] ?, ?", 5, 0).fetchall() == []  # four waits
        gone = conn.execute(f"EXEC {fn}delete] ?", f"{four},{leased[1].msg_id},{four + 99}").fetchall()
        assert [r.msg_id for r in gone] == [four, leased[1].msg_id]
        with pytest.raises(pyodbc.Error, match="keeps no archive"):
            conn.execute(f"EXEC {fn}archive] ?", str(first)).fetchall()
    finally:
        conn.close()
        backend.teardown()
        backend.close()
