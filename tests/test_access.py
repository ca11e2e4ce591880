"""Who may do what, on the real PostgreSQL: each right alone lets a login call its routines and
nothing else, in the client and directly in SQL; the operator provisions without superuser and
cannot grant itself more; logins are rotated and dropped with their sessions.

Logins are made as the operator makes a QueueUser's (`dbq.backends.postgres.access.PgLogins`, the
role helper); the QueueUser resource itself is tested with the operator in test_operator.py.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from dbq.api.filters import Filter
from dbq.backends.odbc_ring import OdbcRing
from dbq.backends.odbc_topic import OdbcTopic
from dbq.backends.postgres.access import PgLogins
from dbq.client import Queue, connect, connect_topic
from dbq.connection import from_url, odbc
from dbq.contract.access import QUEUE_RIGHTS, Right
from dbq.contract.ring import RingTarget
from dbq.contract.topics import Route, TopicNames, TopicTarget
from dbq.errors import AccessHelperMissing, AuthenticationFailed, PermissionDenied
from dbq.names import QueueNames, group_role, login_role
from tests.workers import conserve_through_logins

SCHEMA = "access_q"


@pytest.fixture(scope="module")
def queues(postgres) -> Iterator[dict[str, QueueNames]]:
    """Ring queues (with dead letters and an archive; `conserve` for the conservation runs alone)
    and a topic routing to `orders`, made by the operator's login."""
    made = {}
    for name in ("orders", "other", "conserve"):
        names = QueueNames(SCHEMA, name)
        dead_letters = 0 if name == "conserve" else 1  # a nacked message comes back, as in the contract suite
        target = RingTarget(names, 1000, 64, max_attempts=dead_letters, archive=True)
        OdbcRing(from_url(postgres.url), target).apply()
        made[name] = names
    route = Route("all", made["orders"], Filter())
    OdbcTopic(from_url(postgres.url), TopicTarget(TopicNames(SCHEMA, "events"), (route,))).apply()
    yield made


class Accounts:
    """Logins made through the role helper, on the operator's connection; dropped at the end."""

    def __init__(self, postgres: Any) -> None:
        self.postgres = postgres
        self.conn = odbc.connect(from_url(postgres.url))
        self.logins = PgLogins(self.conn.cursor())
        self.made: list[str] = []

    def login(self, rights: dict[str, tuple[str, ...]], schema: str = SCHEMA) -> tuple[str, str]:
        """A new login holding `rights` (entity -> rights; a topic as `topic:NAME`) on entities of
        `schema`: its name and url."""
        name = login_role("access-test", secrets.token_hex(4))
        password = secrets.token_urlsafe(24)
        self.logins.set_login(name, password, 20)
        for entity, given in rights.items():
            for right in given:
                self.logins.grant(name, group_role(self.postgres.name, schema, entity, right))
        self.made.append(name)
        settings = from_url(self.postgres.url)
        return name, f"postgresql://{name}:{password}@{settings.host}:{settings.port}/{settings.database}"

    def close(self) -> None:
        for name in self.made:
            self.logins.drop(name)
        self.conn.close()


@pytest.fixture(scope="module")
def accounts(postgres, queues) -> Iterator[Accounts]:
    made = Accounts(postgres)
    yield made
    made.close()


def owner(postgres, queue: str = "orders") -> Queue:
    return connect(postgres.url, queue, schema=SCHEMA, smart_batching=False)  # type: ignore[return-value]


# Each client call, and the right it needs.
CALLS: dict[str, tuple[Right, Callable[[Queue], object]]] = {
    "push": (Right.SEND, lambda q: q.push(b"by-login")),
    "push_many": (Right.SEND, lambda q: q.push_many([b"a", b"b"])),
    "pop": (Right.RECEIVE, lambda q: q.pop(timeout=0)),
    "acquire": (Right.RECEIVE, lambda q: q.acquire(timeout=0)),
    "peek": (Right.PEEK, lambda q: q.peek(5)),
    "stats": (Right.MONITOR, lambda q: q.stats()),
    "history": (
        Right.MONITOR,
        lambda q: q.history(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC)),
    ),
    "dead_letters": (Right.MANAGE, lambda q: q.dead_letters()),
    "redrive": (Right.MANAGE, lambda q: q.redrive()),
    "purge": (Right.MANAGE, lambda q: q.purge_dead_letters()),
    "archived": (Right.MANAGE, lambda q: q.archived(datetime.now(UTC) - timedelta(hours=1))),
    "repair": (Right.MANAGE, lambda q: q.repair()),
}


def state(q: Queue) -> tuple[int, ...]:
    s = q.stats()
    return (s.pushed, s.popped, s.acquired, s.depth, s.in_flight, s.dead, s.archived)


@pytest.mark.parametrize("right", [str(r) for r in QUEUE_RIGHTS])
def test_each_right_alone_calls_its_routines_and_is_refused_the_others_naming_the_right(
    postgres, queues, accounts, right
):
    _, url = accounts.login({"orders": (right,)})
    with owner(postgres) as admin:
        admin.push_many([b"one", b"two"])
        with connect(url, "orders", schema=SCHEMA, smart_batching=False) as q:
            for call, (needed, do) in CALLS.items():
                before = state(admin)
                if needed == right:
                    do(q)  # allowed: raises nothing
                    continue
                with pytest.raises(PermissionDenied) as refused:
                    do(q)
                assert refused.value.right == needed, call
                assert refused.value.queue == f"{SCHEMA}.orders"
                assert f"lacks the {needed} right on {SCHEMA}.orders" in str(refused.value)
                assert state(admin) == before, f"{call} refused changed the queue"
            # Another queue: nothing at all, not even its description.
            with pytest.raises(PermissionDenied):
                connect(url, "other", schema=SCHEMA)
        admin.pop_many(100, timeout=0)


# Statements a login must never get through, whatever its right (the ring's table, its routines'
# definitions, the schema, another queue's routine).
ATTACKS = [
    f'SELECT * FROM "{SCHEMA}".orders_ring',
    f'UPDATE "{SCHEMA}".orders_ring SET state = 0',
    f'TRUNCATE "{SCHEMA}".orders_ring',
    f'DROP TABLE "{SCHEMA}".orders_ring',
    f'DROP SCHEMA "{SCHEMA}" CASCADE',
    f'ALTER FUNCTION "{SCHEMA}".orders_push(bytea, bigint, text) SECURITY INVOKER',
    f'CREATE FUNCTION "{SCHEMA}".orders_evil() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$',
    f'CREATE TABLE "{SCHEMA}".orders_evil (x int)',
    f"SELECT nextval('\"{SCHEMA}\".orders_push_seq')",
    f"SELECT \"{SCHEMA}\".other_push('\\x00'::bytea, 0, NULL)",
    f"SELECT \"{SCHEMA}\".orders_place(1, '\\x00'::bytea, 0, now(), NULL)",  # internal: granted to no one
    f'SELECT * FROM "{SCHEMA}".dbq_queues',
    f'SELECT * FROM "{SCHEMA}".dbq_stats_history',
    "CREATE TABLE public.evil (x int)",
    "CREATE SCHEMA evil",
    "GRANT pg_execute_server_program TO CURRENT_USER",
    "COPY (SELECT 1) TO PROGRAM 'true'",
]


@pytest.mark.parametrize("right", [*(str(r) for r in QUEUE_RIGHTS), "publish"])
def test_a_login_of_any_one_right_cannot_read_change_or_drop_anything_directly(
    postgres, queues, accounts, right
):
    entity = "topic:events" if right == "publish" else "orders"
    _, url = accounts.login({entity: (right,)})
    with owner(postgres) as admin:
        before = state(admin)
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in ATTACKS:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with owner(postgres) as admin:
        assert state(admin) == before


def test_a_function_or_table_placed_earlier_in_the_callers_path_is_never_used_by_a_routine(
    postgres, queues, accounts
):
    """The pg_temp and search_path hijack: the routines pin their path (pg_catalog, the queue's
    schema, pg_temp last), so a caller's own nextval, coalesce or table of a routine's name is
    never reached, and the push lands as it should."""
    _, url = accounts.login({"orders": ("send", "receive")})
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION pg_temp.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 1/0'")
        conn.execute(
            "CREATE FUNCTION pg_temp.coalesce(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1/0'"
        )
        conn.execute("CREATE TEMP TABLE orders_ring (slot bigint, state int)")
        conn.execute(
            "CREATE FUNCTION pg_temp.\"=\"(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT 1/0 = 1'"
        )
        conn.execute("SET search_path = pg_temp, public")
        pushed = conn.execute(f'SELECT "{SCHEMA}".orders_push(%s, 0, NULL)', (b"hijack?",)).fetchone()
        assert pushed is not None and pushed[0] > 0
        assert conn.execute("SELECT count(*) FROM pg_temp.orders_ring").fetchone() == (0,)
    with connect(url, "orders", schema=SCHEMA, smart_batching=False) as q:
        got = q.pop(timeout=0)
        assert got is not None and got.body == b"hijack?"


def test_publish_alone_copies_through_the_topic_but_cannot_push_to_its_queues(postgres, queues, accounts):
    _, url = accounts.login({"topic:events": ("publish",)})
    with connect_topic(url, "events", schema=SCHEMA, smart_batching=False) as topic:
        routed = topic.publish(b"via the topic")
        assert set(routed) == {"all"}
    with pytest.raises(PermissionDenied) as refused:
        connect(url, "orders", schema=SCHEMA)
    assert "any right" in str(refused.value)
    _, sender = accounts.login({"orders": ("send",)})
    with connect_topic(sender, "events", schema=SCHEMA) as topic, pytest.raises(PermissionDenied) as denied:
        topic.publish(b"no right on the topic")
    assert denied.value.right == "publish"
    with owner(postgres) as admin:
        assert [m.body for m in admin.pop_many(10, timeout=0)] == [b"via the topic"]


@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_send_only_producers_and_receive_only_workers_lose_and_duplicate_nothing(
    postgres, queues, accounts, tmp_path, mode
):
    """The contract suite's conservation run (4 pushing processes, 4 taking, a repairer), with
    the producers holding send alone and the workers receive alone; the repairer is the operator."""
    _, producer = accounts.login({"conserve": ("send",)})
    _, worker = accounts.login({"conserve": ("receive",)})
    with owner(postgres, "conserve") as q:
        conserve_through_logins(
            q, producer, worker, postgres.url, tmp_path, mode, lambda: q.repair(orphan_grace=0.0)
        )


def test_the_operator_is_no_superuser_and_cannot_grant_itself_a_predefined_role(postgres, queues):
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        attributes = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls FROM pg_roles"
            " WHERE rolname = current_user"
        ).fetchone()
        assert attributes == (False, False, False, False, False)
        for statement in (
            "GRANT pg_execute_server_program TO CURRENT_USER",
            "GRANT pg_read_server_files TO CURRENT_USER",
            "GRANT dbq_access TO CURRENT_USER",
            "ALTER ROLE CURRENT_USER CREATEROLE",
            "CREATE ROLE someone LOGIN",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        # The helper acts only on dbq's names: no predefined role, no other login.
        for call in (
            "SELECT dbq_access.ensure_owner('pg_execute_server_program')",
            "SELECT dbq_access.grant_group(current_user, 'pg_execute_server_program')",
            "SELECT dbq_access.ensure_group('dbq_access')",
            "SELECT dbq_access.drop_login('postgres')",
            f"SELECT dbq_access.set_login('{postgres.name}', NULL, 1)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(call)
        granted = conn.execute(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid"
            " WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = current_user) AND r.rolname LIKE 'pg\\_%'"
        ).fetchone()
        assert granted == (0,)


def test_rotation_refuses_the_old_password_at_once_and_keeps_open_sessions(postgres, queues, accounts):
    name, url = accounts.login({"orders": ("send",)})
    with psycopg.connect(url, autocommit=True) as open_before:
        new_password = secrets.token_urlsafe(24)
        accounts.logins.set_login(name, new_password, 20)
        with pytest.raises(AuthenticationFailed):
            connect(url, "orders", schema=SCHEMA)
        settings = from_url(url)
        rotated = url.replace(f":{settings.password}@", f":{new_password}@")
        with connect(rotated, "orders", schema=SCHEMA, smart_batching=False) as q:
            assert q.push(b"after rotation") > 0
        # PostgreSQL checks a password when a session starts: one open before keeps working.
        assert open_before.execute("SELECT 1").fetchone() == (1,)
    with owner(postgres) as admin:
        assert [m.body for m in admin.pop_many(10, timeout=0)] == [b"after rotation"]


def test_a_revoked_right_is_refused_at_the_next_call_and_a_dropped_login_loses_its_sessions(
    postgres, queues, accounts
):
    name, url = accounts.login({"orders": ("send", "receive")})
    with connect(url, "orders", schema=SCHEMA, smart_batching=False, pool_size=1) as q:
        q.push(b"before")
        assert q.pop(timeout=0) is not None
        accounts.logins.revoke(name, group_role(postgres.name, SCHEMA, "orders", "receive"))
        with pytest.raises(PermissionDenied):  # the same session: rights are checked at each call
            q.pop(timeout=0)
        q.push(b"still sending")
        with psycopg.connect(url, autocommit=True) as session:
            started = time.monotonic()
            assert accounts.logins.drop(name) >= 2  # the client's session and this one
            with pytest.raises(psycopg.OperationalError):
                session.execute("SELECT 1")
            assert time.monotonic() - started < 10
        with pytest.raises(AuthenticationFailed):
            connect(url, "orders", schema=SCHEMA)
    accounts.made.remove(name)
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone() == (0,)
    with owner(postgres) as admin:
        admin.pop_many(10, timeout=0)


def test_a_superuser_installs_the_role_helper_itself_and_another_login_is_told_what_to_run(stack):
    """A database no DBA prepared: the operator on a superuser login installs the helper as it
    provisions (an operator that ran as one before keeps working); the operator's own login gets
    AccessHelperMissing naming the command, and nothing is made."""
    name = f"dbq_bare_{secrets.token_hex(3)}"
    with psycopg.connect(stack.postgres.url("postgres"), autocommit=True) as root:
        root.execute(f'CREATE DATABASE "{name}"')
        root.execute(f'GRANT CREATE ON DATABASE "{name}" TO dbq_operator')
    try:
        target = RingTarget(QueueNames("bare", "orders"), 64, 64)
        with pytest.raises(
            AccessHelperMissing, match=f"dbq access install-sql --operator dbq_operator .* -d {name}"
        ):
            OdbcRing(from_url(stack.postgres.operator_url(name)), target).apply()
        with psycopg.connect(stack.postgres.url(name), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'bare'").fetchone() == (0,)
        OdbcRing(from_url(stack.postgres.url(name)), target).apply()
        with psycopg.connect(stack.postgres.url(name), autocommit=True) as conn:
            assert conn.execute(
                "SELECT to_regprocedure('dbq_access.drop_login(text)') IS NOT NULL"
            ).fetchone() == (True,)
    finally:
        with psycopg.connect(stack.postgres.url("postgres"), autocommit=True) as root:
            root.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
