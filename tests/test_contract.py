"""The queue contract every design keeps, run on each of them: the ring on PostgreSQL, pipes on
Cassandra, the ring on SQL Server when DBQ_MSSQL_DSN is set (it cannot run on this machine).

Push/pop order, acquire/ack/nack, lease expiry, TTL, oversize bodies, batches, exact totals,
repair idempotence, a client shared by threads, and conservation with 4 pushers and 4 poppers
in both delivery modes. Design-specific behaviour is tested beside each design
(test_ring_client.py, test_pipes.py).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dbq.api.limits import MAX_PIPES_BODY_BYTES
from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.client import (
    AnyQueue,
    LeaseLost,
    MessageTooLarge,
    PipesQueue,
    Queue,
    QueueError,
    QueueNotFound,
    connect,
)
from dbq.client.pipes import tuning as pipes_tuning
from dbq.connection import from_url, odbc
from dbq.connection.tls import ca_file
from dbq.contract.pipes import INLINE_BODY_BYTES
from dbq.names import QUOTE
from tests.queue_worker import name_of
from tests.sqlserver import MSSQL_DSN, on_sqlserver
from tests.test_tls import cassandra_tls_of
from tests.workers import finish, read_logs, start

SCHEMA = f"contract_{secrets.token_hex(3)}"


@dataclass
class Design:
    name: str
    url: str
    spec: dict[str, Any]  # backend, design and design-specific settings of the Queue
    max_body: int  # the largest body the queue accepts
    in_row: int  # the largest body kept in its message's row (ring.messageBytes, or pipes' inline bodies)
    lease_slack: float  # how long past a lease's end before it is surely expired
    messages: int  # for the conservation test

    def repair(self, q: AnyQueue) -> int:
        """Run the design's repair; how many things it repaired."""
        if isinstance(q, Queue):
            r = q.repair(orphan_grace=0)
            return r.expired_leases + r.orphans + r.expired + r.holes
        p = q.repair()
        return p.rolled_back + p.finished_pipes


SUITE = "dbq-contract"  # the application name of the suite's PostgreSQL sessions

# spec.messages.maxBytes of the designs' queues: past 1 MiB, so that the largest body differs from it.
MAX_BODY = (1 << 20) + 7


def _ring(url: str, name: str) -> Design:
    spec = {"backend": name, "design": "ring", "ring": {"size": 1000, "messageBytes": 100},
            "messages": {"maxBytes": MAX_BODY}}  # fmt: skip
    return Design(f"ring-{name}", url, spec, max_body=MAX_BODY, in_row=100, lease_slack=0.2, messages=100_000)


@pytest.fixture(
    scope="module",
    params=[
        "ring-postgres",
        "pipes-cassandra",
        on_sqlserver("ring-sqlserver"),
    ],
)
def design(request) -> Iterator[Design]:
    """Each design on its server; the stack's PostgreSQL and Cassandra over TLS, verifying the
    server with the stack's CA (every client, worker process and shell of the suite)."""
    stack = request.getfixturevalue("stack")
    verified = f"sslmode=verify-full&sslrootcert={ca_file(stack.postgres.tls.ca_pem())}"
    if request.param == "ring-postgres":
        url = f"{request.getfixturevalue('postgres').url}?{verified}&application_name={SUITE}"
        yield _ring(url, "postgres")
    elif request.param == "ring-sqlserver":
        yield _ring(MSSQL_DSN, "sqlserver")
    else:
        request.getfixturevalue("cassandra")
        spec = {"backend": "cassandra", "design": "pipes", "pipes": {"maxPushesPerPipe": 500},
                "messages": {"maxBytes": MAX_PIPES_BODY_BYTES}}  # fmt: skip
        url = stack.cassandra.url(verified)
        yield Design("pipes-cassandra", url, spec, MAX_PIPES_BODY_BYTES, INLINE_BODY_BYTES,
                     1.0 + pipes_tuning.SKEW_S + 0.2, messages=50_000)  # fmt: skip
        # Dozens of queues of eleven tables each: dropping them outlasts the driver's 10 s default.
        request.getfixturevalue("cassandra").execute(f'DROP KEYSPACE IF EXISTS "{SCHEMA}"', timeout=120)


MakeQueue = Callable[..., AnyQueue]


@pytest.fixture
def make_queue(design: Design) -> Iterator[MakeQueue]:
    """A new queue of the design, provisioned as the operator does, and a client of it."""
    made: list[AnyQueue] = []

    def make(spec: dict[str, Any] | None = None, dead_letters_kept_by: AnyQueue | None = None,
             **options: Any) -> AnyQueue:  # fmt: skip
        """`spec`: more of the Queue's spec (e.g. deadLetter); `dead_letters_kept_by`: the queue
        spec.deadLetter.queue names, as the operator resolves it; `options`: the client's."""
        name = f"q_{secrets.token_hex(4)}"
        connection = {"secretRef": {"name": "unused"}, "schema": SCHEMA}
        spec = QueueSpec.model_validate({**design.spec, **(spec or {}), "connection": connection})
        keeper = dead_letters_kept_by.names if dead_letters_kept_by is not None else None
        backend = open_backend(spec, name, from_url(design.url), keeper)
        try:
            backend.apply()
        finally:
            backend.close()
        q = connect(design.url, name, schema=SCHEMA, **({"pop_timeout": 0.2} | options))
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


def drain(q: AnyQueue, batch: int = 100) -> list[bytes]:
    out: list[bytes] = []
    while got := q.pop_many(batch, timeout=0.3):
        out += [m.body for m in got]
    return out


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_one_pusher_one_popper_is_fifo_and_an_empty_pop_waits_its_timeout(make_queue):
    q = make_queue()
    ids = [q.push(b"a"), *q.push_many([b"b", b"c"]), *q.push_many(bodies("m", 50))]
    assert len(set(ids)) == 53
    assert [m.body for m in [q.pop(), *q.pop_many(2)]] == [b"a", b"b", b"c"]  # type: ignore[union-attr]
    assert drain(q, 7) == bodies("m", 50)
    started = time.monotonic()
    assert q.pop(timeout=0.3) is None
    assert 0.3 <= time.monotonic() - started < 1.5
    s = q.stats()
    assert (s.pushed, s.popped, s.acquired, s.depth, s.in_flight) == (53, 53, 0, 0, 0)


def test_acquire_ack_and_nack(make_queue):
    q = make_queue()
    q.push_many([b"one", b"two"])
    m = q.acquire(visibility=30)
    assert m is not None and (m.body, m.attempts) == (b"one", 1) and m.lease
    assert q.stats().in_flight == 1
    m.ack()
    with pytest.raises(LeaseLost, match="acknowledged already"):
        m.ack()  # nothing is leased any more, and nothing changes
    m2 = q.acquire()
    assert m2 is not None and m2.body == b"two"
    m2.nack()  # given back at once: delivered again, same id, one more attempt
    again = q.acquire(timeout=2)
    assert again is not None and (again.id, again.body, again.attempts) == (m2.id, b"two", 2)
    again.ack()
    s = q.stats()
    assert (s.pushed, s.depth, s.in_flight) == (2, 0, 0)
    q.push(b"popped")
    popped = q.pop()
    assert popped is not None
    with pytest.raises(QueueError, match="at-most-once"):
        popped.ack()


def test_a_nack_with_a_delay_is_not_delivered_before_it(make_queue, design):
    q = make_queue()
    q.push(b"later")
    m = q.acquire()
    assert m is not None
    m.nack(delay=1.5)
    design.repair(q)
    assert q.acquire(timeout=0.5) is None  # not before its time
    time.sleep(1.5 + design.lease_slack)
    design.repair(q)  # pipes put deferred messages back on repair; the ring at their time
    back = q.acquire(timeout=2)
    assert back is not None and (back.body, back.attempts) == (b"later", 2)
    back.ack()


def test_a_message_failing_max_attempts_times_is_dead_lettered_once_with_its_error_and_redriven(make_queue):
    q = make_queue(spec={"deadLetter": {"maxAttempts": 3}})
    msg_id = q.push(b"bad")
    for attempt in (1, 2, 3):
        m = q.acquire(timeout=1)
        assert m is not None and (m.id, m.attempts) == (msg_id, attempt)
        assert m.nack(error=f"failure {attempt}") is (attempt == 3)  # the third: dead-lettered
    assert q.acquire(timeout=0.3) is None
    with pytest.raises(LeaseLost):
        m.nack()  # settled already: nothing moves twice
    [dead] = q.dead_letters()
    assert (dead.id, dead.attempts, dead.error, dead.body) == (msg_id, 3, "failure 3", b"bad")
    assert dead.pushed_at <= dead.dead_at
    assert (q.stats().dead, q.stats().in_flight) == (1, 0)
    assert q.redrive() == 1  # back with its id, attempts from zero
    back = q.acquire(timeout=1)
    assert back is not None and (back.id, back.body, back.attempts) == (msg_id, b"bad", 1)
    back.ack()
    assert q.dead_letters() == [] and q.stats().dead == 0


def test_two_redrives_at_once_move_each_dead_letter_once(make_queue, design):
    q = make_queue(spec={"deadLetter": {"maxAttempts": 1}})
    ids = q.push_many(bodies("d", 40))
    for m in q.acquire_many(40):
        assert m.nack(error="no") is True
    assert len(q.dead_letters(limit=100)) == 40
    moved: list[int] = []

    def redrive() -> None:
        with connect(design.url, q.names.queue, schema=SCHEMA) as other:
            moved.append(other.redrive(limit=100))

    threads = [threading.Thread(target=redrive) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    back = drain_taken(q)
    assert sum(moved) == 40 and sorted(m.id for m in back) == sorted(ids)  # each once
    assert q.dead_letters() == []


def test_dead_letters_kept_by_another_queue_move_there_once_and_back(make_queue, design):
    """spec.deadLetter.queue: two queues keep their dead letters in a third one's table (by nack,
    and by repair of an expired lease), each once, with its error and its own id (the ring's ids
    of the two collide there); each lists, counts, redrives and purges only its own; the keeper
    holds them all with their source and counts none as its own."""
    keeper = make_queue()
    a = make_queue({"deadLetter": {"maxAttempts": 1}}, dead_letters_kept_by=keeper)
    b = make_queue({"deadLetter": {"maxAttempts": 1}}, dead_letters_kept_by=keeper)
    a_id, b_id = a.push(b"from a"), b.push(b"from b")
    m = a.acquire(timeout=1)
    assert m is not None and m.nack(error="a said no") is True
    assert b.acquire(visibility=1) is not None
    time.sleep(1 + design.lease_slack)
    design.repair(b)
    assert [(d.id, d.error, d.body, d.source) for d in a.dead_letters()] == [
        (a_id, "a said no", b"from a", a.names.qualified)
    ]  # fmt: skip
    assert [(d.id, d.error, d.source) for d in b.dead_letters()] == [
        (b_id, "lease expired (visibility timeout)", b.names.qualified)
    ]  # fmt: skip
    held = keeper.dead_letters(held=True)
    assert sorted((d.source, d.body) for d in held) == sorted(
        [(a.names.qualified, b"from a"), (b.names.qualified, b"from b")]
    )
    assert keeper.dead_letters() == [] and keeper.stats().dead == 0
    assert (a.stats().dead, b.stats().dead) == (1, 1)
    assert a.redrive() == 1  # back to a, with its id
    back = a.pop(timeout=1)
    assert back is not None and (back.id, back.body) == (a_id, b"from a")
    assert [d.id for d in b.dead_letters()] == [b_id]  # b's untouched
    assert b.purge_dead_letters() == 1
    assert keeper.dead_letters(held=True) == [] and (a.stats().dead, b.stats().dead) == (0, 0)


def test_a_queue_torn_down_takes_its_dead_letters_from_the_queue_keeping_them(make_queue, design):
    keeper = make_queue()
    gone, stays = (
        make_queue({"deadLetter": {"maxAttempts": 1}}, dead_letters_kept_by=keeper) for _ in range(2)
    )
    for q in (gone, stays):
        q.push(b"x")
        m = q.acquire(timeout=1)
        assert m is not None and m.nack(error="no") is True
    spec = QueueSpec.model_validate(
        {**design.spec, "connection": {"secretRef": {"name": "unused"}, "schema": SCHEMA}}
    )
    backend = open_backend(
        spec, gone.names.queue, from_url(design.url)
    )  # as deletion opens it: no keeper given
    try:
        backend.teardown()
    finally:
        backend.close()
    assert [d.source for d in keeper.dead_letters(held=True)] == [stays.names.qualified]


def test_headers_travel_with_their_message_through_every_path(make_queue, design):
    """Pushed headers come back on pop, acquire, peek, smart-batched and batched pushes, a nacked
    redelivery, an expired lease's redelivery, a delayed delivery, a dead letter (with dbq's
    reason and attempts added), a redrive (without them again) and the archive; a message without headers has none;
    headers past the spec's limits are refused with nothing written."""
    q = make_queue(
        spec={
            "deadLetter": {"maxAttempts": 2},
            "archive": {"enabled": True},
            "messages": {"headerBytes": 128, "maxHeaders": 4},
        }
    )
    since = datetime.now(UTC) - timedelta(seconds=5)
    trace = {"traceparent": "00-4bf92f3577b34da6-00f067aa0ba902b7-01", "n": 7, "ratio": 0.25, "urgent": True}
    with pytest.raises(ValueError, match=r"spec.messages.headerBytes \(128\)"):
        q.push(b"too much", headers={"k": "x" * 200})
    with pytest.raises(ValueError, match=r"spec.messages.maxHeaders \(4\)"):
        q.push_many([b"a"], headers={str(i): i for i in range(5)})
    with pytest.raises(ValueError, match="'dbq-error'"):
        q.push(b"mine", headers={"dbq-error": "x"})
    with pytest.raises(ValueError, match="header name 'a b' is not valid"):
        q.push(b"spaced", headers={"a b": 1})
    assert q.stats().pushed == 0  # nothing written
    q.push(b"plain")
    q.push_many([b"one", b"two"], headers=[trace, {"only": "two"}])
    popped = q.pop_many(3)
    assert [(m.body, m.headers) for m in popped] == [
        (b"plain", {}),
        (b"one", trace),
        (b"two", {"only": "two"}),
    ]
    with ThreadPoolExecutor(8) as pool:  # single pushes from threads share round trips
        list(pool.map(lambda i: q.push(b"t%d" % i, headers={"i": i}), range(8)))
    got: dict[bytes, dict] = {}
    for _ in range(20):  # a pop_many may come back with part of them (pipes: from one pipe)
        got |= {m.body: m.headers for m in q.pop_many(8 - len(got), timeout=0.5)}
        if len(got) == 8:
            break
    assert got == {b"t%d" % i: {"i": i} for i in range(8)}
    q.push(b"leased", headers=trace)
    assert [m.headers for m in q.peek(5)] == [trace]
    m = q.acquire(timeout=10, visibility=30)  # a loaded machine: the default 1 s wait ran out in CI
    assert m is not None and m.headers == trace
    assert m.nack() is False  # attempt 1 of 2: delivered again, headers and all
    m = q.acquire(timeout=10, visibility=30)
    assert m is not None and m.headers == trace and m.attempts == 2
    assert m.nack(error="handler failed") is True  # attempt 2 of 2: dead-lettered
    [dead] = q.dead_letters()
    assert dead.headers == trace | {"dbq-error": "handler failed", "dbq-attempts": 2}
    assert q.redrive() == 1  # back as pushed: dbq's dead-letter keys go
    again = q.acquire(visibility=1)
    assert again is not None and again.body == b"leased" and again.headers == trace
    time.sleep(1 + design.lease_slack)  # its lease expires: repair makes it ready again
    design.repair(q)
    again = q.acquire(visibility=30)
    assert again is not None and again.headers == trace and again.attempts == 2
    assert again.nack() is True  # dead again, no reason given: none recorded
    [dead] = q.dead_letters()
    assert dead.headers == trace | {"dbq-attempts": 2}
    assert q.redrive() == 1
    again = q.pop(timeout=1)
    assert again is not None and again.headers == trace
    q.push(b"later", headers={"when": "delayed"}, delay=0.1)
    time.sleep(0.5)
    design.repair(q)  # pipes move due messages on repair
    later = q.pop(timeout=1)
    assert later is not None and later.headers == {"when": "delayed"}
    kept = {a.body: a.headers for a in q.archived(since)}
    assert kept[b"one"] == trace and kept[b"plain"] == {} and kept[b"later"] == {"when": "delayed"}
    assert kept[b"leased"] == trace


def test_an_expired_lease_counts_as_an_attempt_and_repair_dead_letters_it(make_queue, design):
    q = make_queue(spec={"deadLetter": {"maxAttempts": 1}})
    msg_id = q.push(b"slow")
    assert q.acquire(visibility=1) is not None
    time.sleep(1 + design.lease_slack)
    design.repair(q)
    [dead] = q.dead_letters()
    assert (dead.id, dead.attempts, dead.error) == (msg_id, 1, "lease expired (visibility timeout)")
    assert q.acquire(timeout=0.3) is None
    assert q.purge_dead_letters() == 1 and q.dead_letters() == []
    s = q.stats()
    assert (s.depth, s.in_flight, s.dead) == (0, 0, 0)


def test_dead_letters_from_a_shell_list_redrive_and_purge(make_queue, design):
    """`dbq dead-letters list|redrive|purge` (ids are whole numbers on the ring, UUIDs on pipes)."""
    q = make_queue(spec={"deadLetter": {"maxAttempts": 3}})
    ids = q.push_many([b"x", b"y"])
    for _ in range(6):
        m = q.acquire(timeout=1)
        assert m is not None
        m.nack(error="handler said no")

    def dbq(*args: str) -> Any:
        done = subprocess.run([sys.executable, "-m", "dbq.cli", "dead-letters", *args, q.names.queue,
                               "--url", design.url, "--schema", SCHEMA, "-o", "json"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    shown = [i if isinstance(i, int) else str(i) for i in ids]
    assert [(d["id"], d["attempts"], d["error"], d["body"]) for d in dbq("list")] == [
        (shown[0], 3, "handler said no", "x"), (shown[1], 3, "handler said no", "y")
    ]  # fmt: skip
    assert dbq("redrive", "--id", str(ids[1])) == {"redriven": 1}
    assert dbq("purge") == {"purged": 1}
    assert q.dead_letters() == []
    m = q.acquire(timeout=1)
    assert m is not None and (m.id, m.attempts) == (ids[1], 1)
    m.ack()


def test_headers_from_a_shell_push_pop_and_dead_letters(make_queue, design):
    """`dbq push -H name=value`, `dbq pop` (headers in -o json, or as JSON before the body with
    --show-headers) and `dbq dead-letters list` (with dbq's reason); a malformed or refused
    header names --header, a bad --ttl names --ttl."""
    q = make_queue(spec={"deadLetter": {"maxAttempts": 1}})

    def run(*args: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dbq.cli", *args, q.names.queue, "--url", design.url, "--schema", SCHEMA, *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    for args, hint, why in (
        (("-H", "novalue"), "--header", "is not NAME=VALUE"),
        (("-H", "dbq-error=x"), "--header", "dbq's own"),
        (("-H", "a=b", "--ttl", "-1"), "--ttl", "--ttl must be a number of seconds >= 0"),
    ):
        refused = run("push", extra=(*args, "body"))
        assert refused.returncode == 2 and hint in refused.stderr and why in refused.stderr, refused.stderr
    assert q.stats().pushed == 0
    pushed = run("push", extra=("-H", "content-type=text/plain", "-H", "trace=t1", "one", "two", "three"))
    assert pushed.returncode == 0, pushed.stderr
    q.push(b'{"a": 1}\tlooks like headers')
    popped = run("pop", extra=("-o", "json"))
    assert [(m["body"], m["headers"]) for m in json.loads(popped.stdout)] == [
        ("one", {"content-type": "text/plain", "trace": "t1"})
    ]
    assert run("pop").stdout == "two\n"  # bodies alone, one per line
    shown = {run("pop", extra=("--show-headers", "--timeout", "5")).stdout for _ in range(2)}  # two pipes
    assert shown == {
        '{"content-type": "text/plain", "trace": "t1"}\tthree\n',
        '{}\t{"a": 1}\tlooks like headers\n',
    }, shown
    q.push(b"doomed", headers={"trace": "t2"})
    m = q.acquire(visibility=30)
    assert m is not None and m.nack(error="no") is True
    listed = json.loads(run("dead-letters", "list", extra=("-o", "json")).stdout)
    assert [d["headers"] for d in listed] == [{"trace": "t2", "dbq-error": "no", "dbq-attempts": 1}]


def test_a_delayed_message_is_never_delivered_early_and_comes_at_the_first_repair_after_it(
    make_queue, design
):
    q = make_queue()
    pushed_at = time.monotonic()
    [later] = q.push_many([b"later"], delay=1.0)
    now = q.push(b"now")
    s = q.stats()
    assert (s.depth, s.delayed) == (1, 1)  # apart from the ready ones
    first = q.pop(timeout=0.2)
    assert first is not None and first.body == b"now"  # nothing waits for the delayed one
    design.repair(q)
    assert q.pop(timeout=0.2) is None  # not before its time
    time.sleep(max(0.0, pushed_at + 1.0 - time.monotonic()))
    design.repair(q)  # pipes move due messages on repair (the operator's cleanup); the ring at their time
    got = q.pop(timeout=1)
    assert got is not None and (got.id, got.body) == (later, b"later")
    assert time.monotonic() - pushed_at >= 1.0
    s = q.stats()
    assert (s.depth, s.delayed, s.pushed) == (0, 0, 2) and now != later


def test_archived_messages_equal_the_acked_and_popped_ones_and_go_after_the_retention(make_queue):
    q = make_queue(spec={"archive": {"enabled": True, "retention": "1h"}})
    since = datetime.now(UTC) - timedelta(seconds=5)
    if isinstance(q, PipesQueue):
        # What a 6 s retention would record (the spec's least is 1m): long enough for the rows
        # of the first pops to outlive the rest of the test on a loaded CI machine (2 s did not).
        q.archive.ttl_s = 6
    ids = q.push_many(bodies("a", 40))
    taken = [q.pop() for _ in range(5)] + q.pop_many(10)
    for m in [q.acquire() for _ in range(5)]:
        assert m is not None
        m.ack()
        taken.append(m)
    leased = q.acquire_many(10)
    q.ack_many(leased)
    nacked = q.acquire()
    assert nacked is not None
    nacked.nack()  # not archived: given back
    taken += leased + drain_taken(q)
    last_archived = time.monotonic()
    assert sorted(m.id for m in taken if m) == sorted(ids)
    kept = q.archived(since, limit=100)
    assert sorted(m.id for m in kept) == sorted(ids)  # each once, by every path
    assert {m.id: m.attempts for m in kept}[nacked.id] == 1 and {m.body for m in kept} == set(bodies("a", 40))
    if isinstance(q, PipesQueue):
        # Each row lives for the retention (a TTL).
        time.sleep(max(0.0, last_archived + q.archive.ttl_s + 0.5 - time.monotonic()))
    else:
        assert q.scavenge_archive(retention=0) == 40  # cleanup removes those past the retention
    assert q.archived(since, limit=100) == []


def drain_taken(q: AnyQueue) -> list[Any]:
    out: list[Any] = []
    while got := q.pop_many(100, timeout=0.3):
        out += got
    return out


def test_an_expired_lease_is_delivered_again_and_its_late_ack_refused(make_queue, design):
    q = make_queue()
    q.push(b"slow")
    m = q.acquire(visibility=1)
    assert m is not None
    time.sleep(1 + design.lease_slack)
    # Past its visibility timeout a lease is lost, whether or not a repair ran since.
    with pytest.raises(LeaseLost, match="no lease: it expired") as lost:
        m.ack()
    assert lost.value.messages == [m]
    with pytest.raises(LeaseLost):
        m.nack()
    assert design.repair(q) == 1
    assert design.repair(q) == 0  # idempotent: nothing left to repair
    with pytest.raises(LeaseLost):
        m.ack()
    again = q.acquire()
    assert again is not None and (again.id, again.body, again.attempts) == (m.id, b"slow", 2)
    again.ack()
    s = q.stats()
    assert (s.depth, s.in_flight) == (0, 0)


def test_ack_many_reports_exactly_the_expired_leases(make_queue, design):
    q = make_queue()
    q.push_many(bodies("x", 6))
    short = q.acquire_many(3, visibility=1)
    long = q.acquire_many(3, visibility=30)
    assert sorted(m.body for m in short + long) == bodies("x", 6)
    time.sleep(1 + design.lease_slack)
    design.repair(q)
    with pytest.raises(LeaseLost) as lost:
        q.ack_many(short + long)
    assert sorted(m.body for m in lost.value.messages) == sorted(m.body for m in short)
    s = q.stats()
    assert (s.depth, s.in_flight) == (3, 0)  # the expired three are ready again, the others acked


def test_ttl_expires_messages_and_counts_them(make_queue):
    q = make_queue()
    q.push_many([b"old", b"older"], ttl=0.5)
    q.push(b"fresh", ttl=60)
    q.push(b"forever")
    time.sleep(0.7)
    assert drain(q) == [b"fresh", b"forever"]
    s = q.stats()
    assert (s.pushed, s.expired, s.popped, s.depth) == (4, 2, 2, 0)


def test_an_oversize_body_is_refused_and_stores_nothing(make_queue, design):
    q = make_queue()
    q.push(b"y" * design.max_body)  # up to the limit is fine
    with pytest.raises(MessageTooLarge, match=rf"spec.messages.maxBytes \({design.max_body}\)"):
        q.push_many([b"ok", b"x" * (design.max_body + 1)])
    with pytest.raises(MessageTooLarge, match=r"spec\.messages\.maxBytes"):
        q.push(b"x" * (design.max_body + 1))
    assert q.stats().pushed == 1
    with pytest.raises(TypeError, match="bytes"):
        q.push("text")  # type: ignore[arg-type]


def content_rows(q: AnyQueue, design: Design) -> int:
    """Bodies kept beside the queue's messages: rows of the ring's content table, or partitions
    of the pipes' content table other than the archive's copies."""
    if isinstance(q, PipesQueue):
        keys = {r[0] for r in q.session.execute(f"SELECT DISTINCT id FROM {q.db.cql.content}")}
        return len(keys - {r[0] for r in q.session.execute(f"SELECT acked FROM {q.db.cql.archive}")})
    quote = QUOTE["sqlserver" if design.name == "ring-sqlserver" else "postgres"]
    with q._cursor() as cur:
        table = f"{quote(q.names.schema)}.{quote(q.names.content)}"
        return int(cur.execute(f"SELECT count(*) FROM {table}").fetchval())


def test_large_bodies_round_trip_byte_for_byte_on_every_path(make_queue, design):
    """Bodies one byte past what a message's row holds (a ring's slot, pipes' inline bodies), of
    64 KiB, 1 MiB and spec.messages.maxBytes come back byte for byte from pop and pop_many,
    acquire and its redelivery, a dead letter and its redrive, peek and the archive, mixed with
    small ones in batches; one past maxBytes is refused with nothing written; once every message
    has ended (taken, dead, expired), no body is left beside the queue's messages."""
    q = make_queue(spec={**design.spec, "deadLetter": {"maxAttempts": 2}, "archive": {"enabled": True}})
    since = datetime.now(UTC) - timedelta(seconds=5)
    sizes = [n for n in (design.in_row + 1, 64 << 10, 1 << 20) if n < design.max_body] + [design.max_body]

    def body(n: int) -> bytes:
        return secrets.token_bytes(n)

    kept: list[bytes] = []  # what the archive must hold: each body popped or acked
    with pytest.raises(MessageTooLarge, match=r"spec\.messages\.maxBytes"):
        q.push_many([b"ok", b"x" * (design.max_body + 1)])
    assert q.stats().pushed == 0 and content_rows(q, design) == 0  # nothing written
    for n in sizes:  # one by one
        one = body(n)
        q.push(one, headers={"size": n})
        m = q.pop(timeout=1)
        assert m is not None and m.body == one and m.headers == {"size": n}, n
        kept.append(one)
    batch = [b"first", *(body(n) for n in sizes), b"last"]
    q.push_many(batch)  # a batch, mixed
    got: list[bytes] = []
    while len(got) < len(batch):
        got += [m.body for m in q.pop_many(10, timeout=1)]
    assert got == batch
    kept += batch
    one = body(sizes[1] if len(sizes) > 1 else sizes[0])
    q.push(one)
    assert [m.body for m in q.peek(5)] == [one]
    m = q.acquire(visibility=30)
    assert m is not None and m.body == one and m.nack() is False  # attempt 1 of 2: again
    m = q.acquire(visibility=30)
    assert m is not None and m.body == one and m.nack(error="too big to handle") is True  # dead
    [dead] = q.dead_letters()
    assert dead.body == one
    assert q.redrive() == 1
    again = q.acquire(visibility=30)
    assert again is not None and again.body == one
    again.ack()
    kept.append(one)
    two = [body(sizes[0]), body(sizes[-1])]
    q.push_many(two)
    held = q.acquire_many(2, visibility=30)
    assert [m.body for m in held] == two
    q.ack_many(held)
    kept += two
    q.push(body(sizes[-1]), ttl=0.3)  # expires unread
    time.sleep(0.5 + design.lease_slack)
    design.repair(q)
    assert q.pop(timeout=0.2) is None and q.stats().expired == 1
    assert sorted(a.body for a in q.archived(since)) == sorted(kept)
    assert content_rows(q, design) == 0  # every message ended: no body left beside the messages


def test_batches_keep_order_and_binary_bodies(make_queue):
    q = make_queue()
    sent = [b"", b"\x00\xff,", bytes(range(64)), *bodies("b", 97)]
    ids = q.push_many(sent)
    assert len(ids) == 100 and len(set(ids)) == 100
    leased = q.acquire_many(40)
    assert [m.body for m in leased] == sent[:40]
    q.ack_many(leased)
    assert [m.body for m in q.pop_many(100)] == sent[40:]
    s = q.stats()
    assert (s.pushed, s.acquired, s.depth, s.in_flight) == (100, 40, 0, 0)


def test_a_client_shared_by_threads(make_queue):
    q = make_queue()
    got: list[bytes] = []
    lock = threading.Lock()

    def push(t: int) -> None:
        for i in range(100):
            q.push(b"%d-%d" % (t, i))

    def pop() -> None:
        idle = 0
        while idle < 5:
            batch = q.pop_many(10, timeout=0.1)
            idle = 0 if batch else idle + 1
            with lock:
                got.extend(m.body for m in batch)

    threads = [threading.Thread(target=push, args=(t,)) for t in range(4)]
    threads += [threading.Thread(target=pop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(got) == sorted(b"%d-%d" % (t, i) for t in range(4) for i in range(100))


def where_they_are(q: AnyQueue, missing: Counter[str]) -> str:
    """For a failed conservation check: the messages not delivered and, on pipes, the state of
    each pipe that still has some, and where its rows lie against its cursor."""
    out = [f"not delivered: {sorted(missing)[:5]}... ({sum(missing.values())})"]
    if isinstance(q, PipesQueue):
        pipes = q.leases.live_pipes()
        for (pipe, status), state in zip(pipes, q.leases.states([p for p, _ in pipes]), strict=True):
            if state is None or (state.remaining <= 0 and status != "drained"):
                continue
            rows = q.db.rows(q.db.cql.read_head, pipe, 100_000)
            after = [r for r in rows if state.cursor is None or r[0].time > state.cursor.time]
            out.append(f"{status} {state}: {len(rows)} rows, {len(after)} after the cursor")
    return "\n".join(out)


@pytest.mark.parametrize("large", [0, 65536], ids=["small", "large"])
@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_conservation_4_pushers_4_poppers(make_queue, design, tmp_path, mode, large):
    """Separate processes push and take concurrently while a fifth repairs: the multiset
    delivered (amo: popped; leased: acknowledged) equals the multiset pushed. `large`: every
    fourth body is that big (kept beside the ring, or in chunks on pipes), none damaged, and
    none left behind."""
    q = make_queue()
    n = 4000 if large else design.messages
    large = min(large, design.max_body)
    stop = tmp_path / "stop"
    logs = [tmp_path / f"w{i}.log" for i in range(9)]
    pushers = [
        start(
            "push",
            q,
            design.url,
            logs[i],
            "--prefix",
            f"p{i}",
            "--count",
            str(n // 4),
            "--batch",
            "40",
            "--large",
            str(large),
        )
        for i in range(4)
    ]
    poppers = [
        start("pop", q, design.url, logs[4 + i], "--mode", mode, "--batch", "40", "--stop", str(stop))
        for i in range(4)
    ]
    repairer = start("repair", q, design.url, logs[8], "--stop", str(stop))
    finish(pushers)
    stop.touch()
    finish([*poppers, repairer])
    left = q.stats()
    # A ring position drawn by a call that was rolled back (a deadlock victim, retried) is an
    # orphan only repair rescues; the repairer stopped with the poppers, so one last pass.
    design.repair(q)
    (tmp_path / "drain.log").write_text(
        "".join(f"G {name}\nA {name}\n" for name in (name_of(m.body) for m in q.pop_many(1000, timeout=0)))
    )
    seen = read_logs([*logs, tmp_path / "drain.log"])
    print(f"{design.name} {mode}: left for the final repair: depth={left.depth} in_flight={left.in_flight}")
    delivered = seen["G"] if mode == "amo" else seen["A"]
    assert not seen["B"], f"damaged bodies: {list(seen['B'])[:5]}"
    assert sum(seen["P"].values()) == n and len(seen["P"]) == n
    # the multiset delivered equals the multiset pushed
    assert delivered == seen["P"], where_they_are(q, seen["P"] - delivered)
    s = q.stats()
    assert (s.pushed, s.depth, s.in_flight) == (n, 0, 0)
    if mode == "amo":
        assert s.popped == n
    if isinstance(q, PipesQueue):
        assert s.retired_pipes > 0  # the repairer retired drained pipes meanwhile
    assert content_rows(q, design) == 0


def test_bad_arguments_are_refused_by_name_and_change_nothing(make_queue, design):
    q = make_queue()
    q.push(b"kept")
    refused = {
        "timeout": [
            lambda: q.pop(timeout=-1),
            lambda: q.acquire(timeout=-0.5),
            lambda: q.push_many([b"x"], timeout=-1),
        ],
        "visibility": [lambda: q.acquire(visibility=0), lambda: q.acquire_many(2, visibility=-3)],
        "ttl": [lambda: q.push(b"x", ttl=-1)],
        "n": [lambda: q.pop_many(0), lambda: q.acquire_many(-2)],
    }
    for name, calls in refused.items():
        for call in calls:
            with pytest.raises(ValueError, match=rf"^{name} must be"):
                call()
    s = q.stats()
    assert (s.pushed, s.depth, s.popped, s.acquired) == (1, 1, 0, 0)
    m = q.acquire()
    assert m is not None
    with pytest.raises(ValueError, match=r"^delay must be"):
        m.nack(delay=-1)
    m.ack()
    with pytest.raises(ValueError, match=r"^visibility must be"):
        connect(design.url, q.names.queue, schema=SCHEMA, visibility=-1)


def test_a_queue_is_reached_by_its_resource_name_and_a_missing_one_is_named(make_queue, design):
    q = make_queue()
    q.push(b"one name")
    # The Queue resource's metadata.name (with '-') names the same queue as its objects' name.
    with connect(design.url, q.names.queue.replace("_", "-"), schema=SCHEMA) as same:
        m = same.pop()
        assert m is not None and m.body == b"one name"
    endpoint = from_url(design.url).endpoint
    password = from_url(design.url).password
    for queue, schema in (("nope", SCHEMA), ("nope", "no_such_schema")):
        with pytest.raises(
            QueueNotFound, match=f"queue nope is not provisioned in (schema|keyspace) {schema}"
        ) as e:
            connect(design.url, queue, schema=schema)
        assert endpoint in str(e.value) and (not password or password not in str(e.value))
    with pytest.raises(
        ValueError, match=r"queue name 'Orders\.EU' is not a safe identifier.*such as 'orders_eu'"
    ):
        connect(design.url, "Orders.EU", schema=SCHEMA)


def test_every_connection_of_the_suite_is_encrypted(make_queue, design):
    """The urls ask for verify-full, so a connection that is not encrypted and verified fails;
    the servers' own views confirm it for the sessions open now."""
    q = make_queue()
    q.push(b"over tls")
    assert q.pop(timeout=1) is not None
    if isinstance(q, PipesQueue):
        sessions = cassandra_tls_of(q.session)
    else:
        with odbc.connect(from_url(design.url)) as conn:
            rows = conn.cursor().execute(
                "SELECT s.ssl::int FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
                " WHERE a.application_name = ? AND a.datname = current_database() AND a.pid <> pg_backend_pid()",
                SUITE,
            )
            sessions = [bool(r[0]) for r in rows.fetchall()]  # the client's, not this check's
    assert sessions and all(sessions), sessions
