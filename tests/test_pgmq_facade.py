"""PGMQ 1.13's API on dbq's ring queues (schema pgmq), judged by PGMQ itself: the real PGMQ 1.13
(PyPI `pgmq`'s SQL, installed SQL-only in a database of its own) and the facade answer the same
calls of PGMQ's own Python client, compared answer for answer, in fixed scenarios and in
operation sequences hypothesis draws. The facade is called as an application would: a login
holding only its rights on the queue, never the operator's."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, is_dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from pgmq import Message, PGMQueue
from pgmq.install import get_embedded_install_sql, install_pgmq_sql
from pydantic import ValidationError

from dbq.api.models import Pgmq
from dbq.backends.odbc_ring import OdbcRing
from dbq.backends.postgres import pgmq as pgmq_sql
from dbq.connection import from_url
from dbq.contract.ring import PGMQ_FACADE_VERSION, RingTarget
from dbq.errors import DbqError
from dbq.names import QueueNames, owner_role
from tests.local import CARGO_TARGET, NODE_MODULES, scratch_database
from tests.test_access import Accounts

SCHEMA = "pgmq_q"
NODE_SCENARIO = Path(__file__).with_name("node") / "pgmq_scenario.cjs"
RUST_SCENARIO = CARGO_TARGET / "release" / "pgmq-scenario"
RIGHTS = ("send", "receive", "monitor")
# PGMQ 1.13's functions the facade leaves out: PGMQ's internals (no client calls them) and the
# trigger of notify-on-insert. Every other function is here with PGMQ's exact signature.
LEFT_OUT = {
    "_belongs_to_pgmq",
    "_create_fifo_index_if_not_exists",
    "_ensure_pg_partman_installed",
    "_extension_exists",
    "_get_partition_col",
    "_get_pg_partman_major_version",
    "_get_pg_partman_schema",
    "_send_batch",
    "_validate_batch_params",
    "notify_queue_listeners",
}
SIGNATURES = (
    "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid) FROM pg_proc p"
    " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgmq'"
)


@dataclass
class Mapped:
    """A ring queue the operator's login made with spec.pgmq.name, and a login's url for it."""

    name: str
    backend: OdbcRing
    url: str

    def db(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)


@pytest.fixture(scope="module")
def accounts(postgres) -> Iterator[Accounts]:
    made = Accounts(postgres)
    yield made
    made.close()


@pytest.fixture(scope="module")
def real_pgmq(stack) -> Iterator[Any]:
    """A database of its own holding the real PGMQ 1.13, installed SQL-only from PyPI's pgmq."""
    stack.need("postgres")
    with scratch_database(stack, "dbq_real_pgmq") as db:
        with psycopg.connect(db.admin_url, autocommit=True) as conn:
            install_pgmq_sql(get_embedded_install_sql(), conn=conn)
        yield db


@pytest.fixture(scope="module")
def maker(postgres, accounts) -> Iterator[Callable[..., Mapped]]:
    made: list[Mapped] = []

    def new(size: int = 1000, rights: tuple[str, ...] = RIGHTS, **options: Any) -> Mapped:
        name = f"q_{secrets.token_hex(4)}"
        options.setdefault("pgmq_name", name)
        backend = OdbcRing(from_url(postgres.url), RingTarget(QueueNames(SCHEMA, name), size, 256, **options))
        backend.apply()
        backend.close()  # its session: opened again to tear down
        _, url = accounts.login({name: rights}, schema=SCHEMA)
        made.append(Mapped(name, backend, url))
        return made[-1]

    yield new
    for q in made:
        q.backend.teardown()
        q.backend.close()


@pytest.fixture(scope="module")
def pair(maker, real_pgmq) -> Callable[..., tuple[Any, Any, str]]:
    """A queue of the same name in both, and PGMQ's client on each: (real, facade, name)."""
    clients: list[PGMQueue] = []

    def new(**options: Any) -> tuple[PGMQueue, PGMQueue, str]:
        q = maker(archive=True, **options)
        real = PGMQueue(conn_string=real_pgmq.admin_url, init_extension=False, pool_size=2)
        real.create_queue(q.name)
        facade = PGMQueue(conn_string=q.url, pool_size=2)  # creates the extension, as by default
        facade.create_queue(q.name)  # a Queue stands for it: succeeds, as PGMQ's does
        clients.extend((real, facade))
        return real, facade, q.name

    yield new
    for client in clients:
        client.close()


# --- what is compared ------------------------------------------------------------------------
def seen(message: Message | None, since: datetime) -> tuple[Any, ...] | None:
    """A message as both must answer it: vt in whole seconds from the call, times by presence."""
    if message is None:
        return None
    return (
        message.msg_id,
        message.read_ct,
        message.message,
        message.headers,
        round((message.vt - since).total_seconds()),
    )


def answers(call: Callable[[], Any]) -> Any:
    """What a call answered, messages as `seen` shows them; an error as its SQLSTATE class."""
    since = datetime.now().astimezone()
    try:
        answer = call()
    except psycopg.Error as e:
        return ("error", (e.sqlstate or "")[:2])
    if isinstance(answer, Message):
        return seen(answer, since)
    if isinstance(answer, list) and all(isinstance(m, Message) for m in answer):
        # by id: PGMQ answers in the order its UPDATE met the rows, which is not the id's
        return sorted((seen(m, since) for m in answer), key=lambda m: m[0] if m else 0)
    return answer


def counts(client: PGMQueue, name: str) -> tuple[int, int, int]:
    m = client.metrics(name)
    return (m.queue_length, m.queue_visible_length, m.total_messages)


def both(real: PGMQueue, facade: PGMQueue, call: Callable[[PGMQueue], Any]) -> Any:
    """Ask both; assert they answer alike; the answer."""
    expected, got = answers(lambda: call(real)), answers(lambda: call(facade))
    assert got == expected
    return got


# --- the API's shape -------------------------------------------------------------------------
def test_every_function_of_pgmq_1_13_is_here_with_its_signature_or_named_as_left_out(maker, real_pgmq):
    q = maker()
    with psycopg.connect(real_pgmq.admin_url) as db:
        real = set(db.execute(SIGNATURES).fetchall())
    with q.db() as db:
        facade = set(db.execute(SIGNATURES).fetchall())
    missing = {sig for sig in real - facade if sig[0] not in LEFT_OUT}
    assert not missing, f"PGMQ functions the facade lacks or declares otherwise: {sorted(missing)}"
    assert {sig[0] for sig in real if sig[0] in LEFT_OUT} == LEFT_OUT  # each left out exists in PGMQ
    extra = {sig for sig in facade - real if not sig[0].startswith("_dbq_")}
    assert not extra, f"functions PGMQ does not have: {sorted(extra)}"


def test_nothing_in_the_facade_is_executable_by_public_and_a_login_without_rights_calls_none(maker, accounts):
    q = maker()
    with q.db() as db:
        public = db.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'pgmq' AND has_function_privilege('public', p.oid, 'EXECUTE')"
        ).fetchall()
        assert public == []
    other = maker(pgmq_name="")  # a queue with no PGMQ name: its logins get nothing of the facade
    _, url = accounts.login({other.name: RIGHTS}, schema=SCHEMA)
    with psycopg.connect(url, autocommit=True) as db, pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.execute("SELECT * FROM pgmq.read(%s, 30, 1)", (q.name,))


def test_the_facade_obeys_the_queue_rights_a_sender_cannot_read_through_it(maker, accounts):
    q = maker(rights=("send",))
    with q.db() as db:
        db.execute("SELECT pgmq.send(%s, '{\"a\": 1}')", (q.name,))
        for statement in ("SELECT * FROM pgmq.read(%s, 30, 1)", "SELECT * FROM pgmq.pop(%s)",
                          "SELECT pgmq.purge_queue(%s)", "SELECT * FROM pgmq.metrics(%s)"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(statement, (q.name,))
        assert db.execute("SELECT count(*) FROM pgmq.metrics_all()").fetchone() == (0,)
    _, reader = accounts.login({q.name: ("receive",)}, schema=SCHEMA)
    with psycopg.connect(reader, autocommit=True) as db:
        rows = db.execute("SELECT msg_id, message FROM pgmq.pop(%s)", (q.name,)).fetchall()
    assert rows == [(1, {"a": 1})]


# --- answer for answer beside the real PGMQ -----------------------------------------------------
def test_pgmq_client_gets_the_same_answers_from_the_facade_as_from_pgmq(pair):
    real, facade, name = pair()
    ask = lambda call: both(real, facade, call)  # noqa: E731
    assert ask(lambda c: c.send(name, {"n": 1})) == 1
    assert ask(lambda c: c.send(name, {"n": 2}, headers={"trace": "t-2", "n": 2})) == 2
    assert ask(
        lambda c: c.send_batch(name, [{"n": 3}, [4], "five"], headers=[{"h": 3}, {"h": 4}, {"h": 5}])
    ) == [3, 4, 5]
    assert ask(lambda c: c.send(name, {"later": True}, delay=4)) == 6
    due = time.monotonic() + 4.5
    assert ask(lambda c: c.send_batch(name, [1, 2], delay=30)) == [7, 8]
    assert ask(lambda c: counts(c, name)) == (8, 5, 8)
    first = ask(lambda c: c.read(name, vt=30, qty=2))
    assert [m[0] for m in first] == [1, 2] and first[1][3] == {"trace": "t-2", "n": 2}
    assert ask(lambda c: c.pop(name)) == (3, 0, {"n": 3}, {"h": 3}, 0)
    assert ask(lambda c: c.set_vt(name, 1, 0))[0] == 1  # read again at once, read_ct kept
    again = ask(lambda c: c.read(name, vt=5, qty=10))
    assert [(m[0], m[1], m[4]) for m in again] == [(1, 2, 5), (4, 1, 5), (5, 1, 5)]
    assert ask(lambda c: c.read(name, vt=5, qty=10)) == []
    assert ask(lambda c: c.delete(name, 4)) is True
    assert ask(lambda c: c.delete(name, 4)) is False  # gone already
    assert ask(lambda c: c.delete(name, 999)) is False  # never sent
    assert ask(lambda c: c.delete_batch(name, [5, 998])) == [5]
    assert ask(lambda c: c.archive(name, 1)) is True
    assert ask(lambda c: c.archive_batch(name, [2, 997])) == [2]
    assert ask(lambda c: c.read_with_poll(name, vt=5, qty=1, max_poll_seconds=1)) == []
    time.sleep(max(due - time.monotonic(), 0))  # the delayed message is due
    assert ask(lambda c: c.read_with_poll(name, vt=1, qty=5, max_poll_seconds=1)) == [
        (6, 1, {"later": True}, None, 1)
    ]
    time.sleep(2.2)  # its lease expired: read again with no cleanup run (the operator is not here)
    assert ask(lambda c: [(m.msg_id, m.read_ct) for m in c.read(name, vt=30, qty=5)]) == [(6, 2)]
    assert ask(lambda c: counts(c, name)) == (3, 0, 8)
    assert ask(lambda c: c.purge(name)) == 3
    assert ask(lambda c: counts(c, name)) == (0, 0, 8)
    assert ask(lambda c: c.send(name, {"after": "purge"})) == 9
    assert ask(lambda c: c.pop(name, 5)) == [(9, 0, {"after": "purge"}, None, 0)]


def scenario(client: list[str], url: str, queue: str, create_extension: bool) -> list[Any]:
    """One run of a PGMQ client's scenario program (`client`, its command): its answers."""
    done = subprocess.run(
        [*client, url, queue, "yes" if create_extension else "no"],
        env={**os.environ, "NODE_PATH": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def same_scenario(client: list[str], q: Mapped, real_pgmq: Any) -> list[Any]:
    """The client's scenario against PGMQ (installed SQL-only) and the facade (its extension
    created, as the clients do by default), asserted to answer alike: the facade's answers."""
    expected = scenario(client, real_pgmq.admin_url, q.name, create_extension=False)
    got = scenario(client, q.url, q.name, create_extension=True)
    assert [name for name, _ in got] == [name for name, _ in expected]
    for (name, ours), (_, theirs) in zip(got, expected, strict=True):
        assert ours == theirs, f"{name}: dbq answered {ours!r}, PGMQ {theirs!r}"
    assert dict(got)["send"] == 1 and dict(got)["metrics"][1] > 0
    return [name for name, answer in got if isinstance(answer, str) and answer.startswith("error")]


def test_pgmq_s_node_client_gets_the_same_answers_from_the_facade_as_from_pgmq(maker, real_pgmq):
    errors = same_scenario(["node", str(NODE_SCENARIO)], maker(archive=True), real_pgmq)
    # pgmq-js 1.3.1's setVt passes untyped parameters, which PGMQ 1.13's overloads make
    # ambiguous (42725) on PGMQ itself too; nothing else failed.
    assert errors == ["setVt", "send to a bad name", "read a queue not there"]


def test_pgmq_s_rust_client_gets_the_same_answers_from_the_facade_as_from_pgmq(maker, real_pgmq):
    q = maker(archive=True)
    with psycopg.connect(real_pgmq.admin_url, autocommit=True) as db:  # there, as the Queue is here
        db.execute("SELECT pgmq.create(%s)", (q.name,))
    errors = same_scenario([str(RUST_SCENARIO)], q, real_pgmq)
    assert errors == ["send to a bad name", "read a queue not there"]


def routed(answer: Any) -> Any:
    """Topic answers as both must give them: bindings without their time, rows in order."""
    if isinstance(answer, list) and all(is_dataclass(row) and not isinstance(row, Message) for row in answer):
        return sorted(tuple(v for k, v in vars(row).items() if k != "bound_at") for row in answer)
    return answer


def test_topics_route_as_pgmq_s_with_the_bindings_each_queue_declares(maker, accounts, real_pgmq):
    bindings = {"a": ("#.error", "orders.*"), "b": ("orders.#",)}
    made = {k: maker(archive=True, pgmq_topics=patterns) for k, patterns in bindings.items()}
    a, b = (made[k].name for k in "ab")
    _, url = accounts.login({a: RIGHTS, b: RIGHTS}, schema=SCHEMA)
    real = PGMQueue(conn_string=real_pgmq.admin_url, init_extension=False, pool_size=2)
    facade = PGMQueue(conn_string=url, pool_size=2)
    try:
        ask = lambda call: both(real, facade, lambda c: routed(call(c)))  # noqa: E731
        for k, patterns in bindings.items():
            real.create_queue(made[k].name)
            for pattern in patterns:  # bound on PGMQ; bound again on both, as a client starting does
                real.bind_topic(pattern, made[k].name)
                assert ask(lambda c, p=pattern, q=made[k].name: c.bind_topic(p, q)) is None
        assert ask(lambda c: c.list_topic_bindings(a)) == [("#.error", a, r"^.*\.error$"),
                                                           ("orders.*", a, r"^orders\.[^.]+$")]  # fmt: skip
        assert sorted(r[1] for r in ask(lambda c: c.test_routing("orders.created"))) == sorted([a, b])
        assert ask(lambda c: c.send_topic("orders.created", {"o": 1})) == 2
        assert ask(lambda c: c.send_topic("orders.eu.created", {"o": 2}, headers={"h": 2}, delay=0)) == 1
        assert ask(lambda c: c.send_topic("db.error", {"e": 1})) == 1
        assert ask(lambda c: c.send_topic("nothing.bound", {"x": 1})) == 0
        assert len(ask(lambda c: c.send_batch_topic("orders.new", [{"o": 3}, {"o": 4}]))) == 4
        assert ask(lambda c: c.send_batch_topic("orders.later", [{"o": 5}], delay=30)) == sorted(
            [(a, 5), (b, 5)]
        )
        assert [m[2] for m in ask(lambda c: c.read(a, vt=30, qty=10))] == [
            {"o": 1},
            {"e": 1},
            {"o": 3},
            {"o": 4},
        ]
        assert [(m[2], m[3]) for m in ask(lambda c: c.read(b, vt=30, qty=10))] == [
            ({"o": 1}, None), ({"o": 2}, {"h": 2}), ({"o": 3}, None), ({"o": 4}, None)]  # fmt: skip
        for bad in ("", "a..b", ".a", "a.", "a b", "a*", "x" * 256):
            assert ask(lambda c, k=bad: c.send_topic(k, {"x": 1})) == ("error", "P0")
            assert ask(lambda c, k=bad: c.validate_routing_key(k)) is False
        for bad in ("logs.**", "a#*", "a..b", "bad!"):
            assert ask(lambda c, p=bad: c.bind_topic(p, a)) == ("error", "P0")
            assert ask(lambda c, p=bad: c.validate_topic_pattern(p)) is False
        assert ask(lambda c: c.validate_topic_pattern("a*b.#")) is True
        assert ask(lambda c: c.bind_topic("x.y", "no_such_queue")) == ("error", "P0")
        null = "SELECT pgmq.send_topic(%s, NULL::jsonb)"
        assert ask(lambda c: c._execute_with_result(null, ("orders.x",))) == ("error", "P0")
        assert ask(lambda c: c.unbind_topic("never.bound", a)) is False
        # What differs, on purpose: bindings are the Queue's (spec.pgmq.topics), not made from SQL.
        for call in (lambda c: c.bind_topic("new.pattern", a), lambda c: c.unbind_topic("orders.*", a)):
            with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"spec\.pgmq\.topics"):
                call(facade)
    finally:
        real.close()
        facade.close()


def test_spec_pgmq_topics_are_the_bindings_and_send_topic_needs_send_on_every_queue_reached(maker, accounts):
    q, other = maker(pgmq_topics=("t.*",)), maker(pgmq_topics=("t.*", "u"))
    backend = OdbcRing(q.backend.settings, replace(q.backend.target, pgmq_topics=("t.#", "v.*")))
    try:
        assert [s.action.value for s in backend.plan(backend.observe())] == ["publish_pgmq"]
        backend.apply()
        assert backend.plan(backend.observe()) == []
    finally:
        backend.close()
    with q.db() as db:
        assert db.execute("SELECT pattern FROM pgmq.list_topic_bindings(%s) ORDER BY 1", (q.name,)).fetchall() == [
            ("t.#",), ("v.*",)]  # fmt: skip
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # t.x reaches `other` too
            db.execute("SELECT pgmq.send_topic('t.x', '{}'::jsonb)")
        assert db.execute("SELECT pgmq.send_topic('v.x', '{}'::jsonb)").fetchone() == (1,)
    with other.db() as db:
        assert db.execute("SELECT queue_length FROM pgmq.metrics(%s)", (other.name,)).fetchone() == (0,)
    with pytest.raises(ValidationError, match=r"spec\.pgmq\.topics"):
        Pgmq(name="x", topics=["logs.**"])


def test_bad_input_gets_an_error_of_pgmq_s_class_and_changes_nothing(pair):
    real, facade, name = pair()
    ask = lambda call: both(real, facade, call)  # noqa: E731
    ask(lambda c: c.send(name, {"kept": 1}))
    for bad in ("no_such_queue", "q$x", "q;x", "q--x", "q'x"):
        assert ask(lambda c, bad=bad: c.send(bad, {"a": 1}))[0] == "error"
        assert ask(lambda c, bad=bad: c.read(bad, vt=1, qty=1))[0] == "error"
    raw = "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])"
    uneven = (name, ['{"a": 1}'], ['{"a": 1}', '{"b": 2}'])
    assert ask(lambda c: c._execute_with_result(raw, uneven)) == ("error", "P0")
    assert ask(lambda c: c._execute_with_result(raw, (name, [], None))) == ("error", "P0")
    assert ask(lambda c: c.read(name, vt=30, qty=-1)) == ("error", "22")
    assert ask(lambda c: c.validate_queue_name("x" * 48)) == ("error", "P0")
    assert ask(lambda c: counts(c, name)) == (1, 1, 1)


def test_facade_errors_name_the_queue_and_the_fix_and_touch_no_other_queue(maker):
    q, other = maker(size=4), maker()
    with other.db() as db:
        db.execute("SELECT pgmq.send(%s, '{\"other\": true}')", (other.name,))
    with q.db() as db:

        def refused(statement: str, *args: Any) -> psycopg.Error:
            with pytest.raises(psycopg.Error) as e:
                db.execute(statement, args)
            return e.value

        e = refused("SELECT pgmq.send('no_such_queue', '{}')")
        assert (e.sqlstate, 'no queue "no_such_queue"') == ("42P01", str(e).split(" in this")[0][5:])
        assert "spec.pgmq.name: no_such_queue" in (e.diag.message_hint or "")
        assert refused("SELECT pgmq.send(%s, NULL::jsonb)", q.name).sqlstate == "22004"
        assert refused("SELECT pgmq.send(%s, 'not json')", q.name).sqlstate == "22P02"
        e = refused("SELECT * FROM pgmq.read(%s, -1, 1)", q.name)
        assert (e.sqlstate, "vt must be 0 or more seconds, not -1" in str(e)) == ("22023", True)
        assert refused("SELECT * FROM pgmq.set_vt(%s, 1::bigint, -5)", q.name).sqlstate == "22023"
        assert refused("SELECT pgmq.send(%s, '{}', '[1]'::jsonb)", q.name).sqlstate == "22023"
        assert refused("SELECT * FROM pgmq.read(%s, 30, 1, '{\"a\": 1}')", q.name).sqlstate == "0A000"
        e = refused("SELECT pgmq.create('brand_new')")
        assert e.sqlstate == "0A000" and "spec.pgmq.name: brand_new" in (e.diag.message_hint or "")
        assert refused("SELECT pgmq.drop_queue(%s)", q.name).sqlstate == "0A000"
        e = refused("SELECT pgmq.send_topic('a..b', '{}')")
        assert e.sqlstate == "P0001" and 'routing key "a..b" is refused: it has an empty word' in str(e)
        assert refused("SELECT * FROM pgmq.read_grouped_rr(%s, 30, 1)", q.name).sqlstate == "0A000"
        db.execute("SELECT pgmq.send_batch(%s, ARRAY['1', '2', '3']::jsonb[])", (q.name,))
        e = refused("SELECT pgmq.send_batch(%s, ARRAY['4', '5']::jsonb[])", q.name)
        assert e.sqlstate == "53400" and "spec.ring.size" in str(e)
        db.execute("SELECT pgmq.send(%s, '4')", (q.name,))
        e = refused("SELECT pgmq.send(%s, '5')", q.name)
        assert e.sqlstate == "53400" and "spec.ring.size" in str(e)
        assert db.execute(
            "SELECT queue_length, total_messages FROM pgmq.metrics(%s)", (q.name,)
        ).fetchone() == (4, 4)
        assert [r[0] for r in db.execute("SELECT message FROM pgmq.pop(%s, 9)", (q.name,))] == [1, 2, 3, 4]
    with other.db() as db:
        assert db.execute("SELECT queue_length FROM pgmq.metrics(%s)", (other.name,)).fetchone() == (1,)


def test_a_name_is_one_queue_s_and_follows_spec_pgmq_name(maker, postgres):
    q = maker()
    taken = OdbcRing(
        from_url(postgres.url), RingTarget(QueueNames(SCHEMA, "q_thief"), 16, 256, pgmq_name=q.name)
    )
    with pytest.raises(DbqError) as refused:
        taken.apply()
    assert f"spec.pgmq.name: PGMQ queue name {q.name} is taken by queue {SCHEMA}.{q.name}" in str(
        refused.value
    )
    taken.teardown()
    taken.close()
    renamed = OdbcRing(
        from_url(postgres.url),
        RingTarget(QueueNames(SCHEMA, q.name), 1000, 256, pgmq_name="renamed_" + q.name),
    )
    renamed.apply()
    with q.db() as db:
        names = {r[0] for r in db.execute("SELECT queue_name FROM pgmq.list_queues()")}
    assert "renamed_" + q.name in names and q.name not in names
    renamed.close()


def test_long_names_are_taken_and_queues_are_torn_down_beside_the_facade(maker):
    long_name = "p" * 47  # PGMQ's longest
    q = maker(pgmq_name=long_name)
    with q.db() as db:
        assert db.execute("SELECT pgmq.send(%s, '1')", (long_name,)).fetchone() == (1,)
    # Queues of 38 characters (group roles of 60), without and with a PGMQ name: each torn down
    # with its mapping and grants, and its roles dropped.
    for name, pgmq_name in (("q_" + "x" * 36, ""), ("q_" + "y" * 36, "long_" + "z" * 30)):
        ring = OdbcRing(
            q.backend.settings, RingTarget(QueueNames(SCHEMA, name), 16, 256, pgmq_name=pgmq_name)
        )
        ring.apply()
        ring.teardown()
        ring.close()
    with q.db() as db:
        left = {r[0] for r in db.execute("SELECT queue_name FROM pgmq.list_queues()")}
    assert long_name in left and not any(n.startswith("long_") for n in left)


def refused_apply(url: str) -> str:
    """What applying a queue with spec.pgmq in the database at `url` was refused with."""
    ring = OdbcRing(from_url(url), RingTarget(QueueNames(SCHEMA, "q_here"), 16, 256, pgmq_name="q_here"))
    with pytest.raises(DbqError) as refused:
        ring.apply()
    ring.teardown()
    ring.close()
    return str(refused.value)


def test_a_schema_pgmq_someone_else_made_is_refused_naming_spec_pgmq(stack):
    with scratch_database(stack, "dbq_foreign_pgmq") as db:
        with psycopg.connect(db.admin_url, autocommit=True) as admin:
            admin.execute("CREATE SCHEMA pgmq")  # the superuser's, not dbq's
        assert "spec.pgmq: schema pgmq exists and belongs to another role" in refused_apply(db.url)


def test_an_older_facade_is_never_installed_over_a_newer_one(maker, postgres, monkeypatch):
    q = maker()
    monkeypatch.setattr(pgmq_sql, "PGMQ_FACADE_VERSION", PGMQ_FACADE_VERSION - 1)  # an older operator's
    owner = owner_role(postgres.name, "pgmq")
    older = pgmq_sql.publish(SCHEMA, q.name, q.name, (), [owner], owner, install=True)
    with psycopg.connect(postgres.url) as db, pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        for statement in older:
            db.execute(statement)
    assert "spec.pgmq: this database's PGMQ facade is newer than this operator's" in str(e.value)
    with psycopg.connect(postgres.url) as db:
        assert db.execute("SELECT version FROM pgmq.dbq_facade").fetchone() == (PGMQ_FACADE_VERSION,)


def test_a_database_holding_a_real_pgmq_is_refused_naming_spec_pgmq(real_pgmq):
    assert "spec.pgmq: this database holds a real PGMQ" in refused_apply(real_pgmq.url)


# --- moving from a running PGMQ -------------------------------------------------------------
def test_a_running_pgmq_moves_to_dbq_by_connection_string_and_drain_with_nothing_lost_or_doubled(
    maker, real_pgmq
):
    q = maker(size=4096)
    old = PGMQueue(conn_string=real_pgmq.admin_url, init_extension=False, pool_size=2)
    old.create_queue(q.name)
    old.send_batch(q.name, [{"n": n} for n in range(500)], headers=[{"n": str(n)} for n in range(500)])
    in_flight = old.read(q.name, vt=4, qty=20)  # an old consumer's batch, in flight
    new = PGMQueue(conn_string=q.url, pool_size=2)  # the producers' new connection string
    new.send_batch(q.name, [{"n": n} for n in range(500, 600)])
    drain = subprocess.Popen(
        [str(Path(sys.executable).with_name("dbq")), "pgmq", "drain", "--queue", q.name, "--batch", "64", "--wait", "20"],
        env={**os.environ, "DBQ_PGMQ_FROM": real_pgmq.admin_url, "DBQ_PGMQ_TO": q.url},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for m in in_flight[:10]:  # the old consumer finishes half its batch; the rest comes back at its vt
        assert old.delete(q.name, m.msg_id)
    out, err = drain.communicate(timeout=120)
    assert drain.returncode == 0, err
    assert f"moved 490 messages from PGMQ queue {q.name} to dbq queue {q.name}; 0 left" in out
    received: list[Message] = []
    while batch := new.pop(q.name, 1000):
        received += batch
    numbers = [m.message["n"] for m in received]
    done_by_the_old_consumer = {m.message["n"] for m in in_flight[:10]}
    assert sorted(numbers) == sorted(set(range(600)) - done_by_the_old_consumer)  # none lost, none twice
    moved = [m for m in received if m.message["n"] < 500]
    assert all(m.headers["n"] == str(m.message["n"]) and m.headers["pgmq-msg-id"] for m in moved)
    assert counts(old, q.name) == (0, 0, 500)
    old.close()
    new.close()


def test_drain_leaves_a_message_too_large_for_the_queue_in_pgmq_names_it_and_moves_the_rest(maker, real_pgmq):
    q = maker(header_bytes=256)
    old = PGMQueue(conn_string=real_pgmq.admin_url, init_extension=False, pool_size=2)
    old.create_queue(q.name)
    # 200 bytes of headers fit 256, and do not once the drain adds its two (about 80 bytes)
    old.send_batch(
        q.name,
        [{"n": n} for n in range(30)],
        headers=[{"pad": "x" * (190 if n == 7 else 1)} for n in range(30)],
    )
    drain = [str(Path(sys.executable).with_name("dbq")), "pgmq", "drain", "--queue", q.name, "--batch", "10",
             "--visibility", "1", "--wait", "1"]  # fmt: skip
    env = {**os.environ, "DBQ_PGMQ_FROM": real_pgmq.admin_url, "DBQ_PGMQ_TO": q.url}
    done = subprocess.run(drain, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"moved 29 messages from PGMQ queue {q.name} to dbq queue {q.name}; 1 left" in done.stdout
    assert (
        "left in PGMQ: message 8: dbq: headers of" in done.stderr
        and "spec.messages.headerBytes" in done.stderr
    )
    new = PGMQueue(conn_string=q.url, pool_size=2)
    assert sorted(m.message["n"] for m in new.pop(q.name, 100)) == [n for n in range(30) if n != 7]
    time.sleep(1.5)  # the drain's lease on it runs out
    (kept,) = old.pop(q.name, 10)  # it stayed in PGMQ, whole
    assert (kept.msg_id, kept.message, len(kept.headers["pad"])) == (8, {"n": 7}, 190)
    old.close()
    new.close()


def test_drain_refuses_bad_arguments_naming_them_and_moves_nothing(real_pgmq, maker):
    q = maker()
    dbq = str(Path(sys.executable).with_name("dbq"))
    base = [dbq, "pgmq", "drain", "--from", real_pgmq.admin_url, "--to", q.url, "--queue", q.name]
    for extra, named in ((["--batch", "0"], "--batch"), (["--visibility", "0"], "--visibility")):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and named in done.stderr and real_pgmq.admin_url not in done.stderr
    done = subprocess.run([*base[:-1], "no_such_queue"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "drain of PGMQ queue no_such_queue stopped" in done.stderr
    assert "postgresql://" not in done.stderr + done.stdout  # no URL, and so no password, echoed


# --- operation sequences hypothesis draws, on both ------------------------------------------------
BODIES = st.one_of(
    st.dictionaries(st.text("abc", min_size=1, max_size=3), st.integers(-5, 5), max_size=3),
    st.lists(st.integers(0, 9), max_size=3),
    st.text(max_size=8),
    st.integers(),
)
HEADERS = st.one_of(
    st.none(), st.dictionaries(st.sampled_from(["trace", "kind"]), st.text("xyz", max_size=4), min_size=1)
)


class SameAnswers(RuleBasedStateMachine):
    """Each step on the real PGMQ and on the facade; every answer compared. Reads take every
    visible message (the facade may choose others when it takes fewer: docs), and waits are
    0 or 30 s, so no step depends on the clock."""

    make_pair: Callable[[], tuple[PGMQueue, PGMQueue, str]]

    @initialize()
    def start(self) -> None:
        self.real, self.facade, self.name = type(self).make_pair()
        self.sent = 0

    def teardown(self) -> None:
        if hasattr(self, "name"):
            self.real.close()
            self.facade.close()

    def ask(self, call: Callable[[PGMQueue], Any]) -> Any:
        return both(self.real, self.facade, call)

    def some_id(self, data: st.DataObject) -> int:
        return data.draw(st.integers(1, self.sent + 2))

    @rule(body=BODIES, headers=HEADERS, delay=st.sampled_from([None, 0, 30]))
    def send(self, body: Any, headers: Any, delay: int | None) -> None:
        self.ask(lambda c: c.send(self.name, body, headers=headers, delay=delay))
        self.sent += 1

    @rule(bodies=st.lists(BODIES, min_size=1, max_size=4), delay=st.sampled_from([None, 30]))
    def send_batch(self, bodies: list[Any], delay: int | None) -> None:
        self.ask(lambda c: c.send_batch(self.name, bodies, delay=delay))
        self.sent += len(bodies)

    @rule(vt=st.sampled_from([0, 30]))
    def read(self, vt: int) -> None:
        # vt 0 in raw SQL: PGMQ's client reads `vt or 30`.
        self.ask(
            lambda c: [
                Message.from_row(row, c._json_parser)
                for row in c._execute_with_result("SELECT * FROM pgmq.read(%s, %s, 100)", (self.name, vt))
            ]
        )

    @rule()
    def pop(self) -> None:
        self.ask(lambda c: c.pop(self.name, 100))

    @rule(data=st.data(), verb=st.sampled_from(["delete", "archive"]))
    def by_id(self, data: st.DataObject, verb: str) -> None:
        msg_id = self.some_id(data)
        self.ask(lambda c: getattr(c, verb)(self.name, msg_id))

    @rule(data=st.data(), vt=st.sampled_from([0, 30]))
    def set_vt(self, data: st.DataObject, vt: int) -> None:
        msg_id = self.some_id(data)
        self.ask(lambda c: c.set_vt(self.name, msg_id, vt))

    @rule()
    def purge(self) -> None:
        self.ask(lambda c: c.purge(self.name))

    @invariant()
    def same_counts(self) -> None:
        if hasattr(self, "name"):
            self.ask(lambda c: counts(c, self.name))


def test_operation_sequences_get_the_same_answers_from_the_facade_as_from_pgmq(pair):
    SameAnswers.make_pair = staticmethod(lambda: pair(size=4096))  # type: ignore[method-assign]
    run_state_machine_as_test(
        SameAnswers,
        settings=settings(
            max_examples=int(os.environ.get("DBQ_PGMQ_EXAMPLES", "30")),
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
