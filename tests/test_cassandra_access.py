"""Who may do what on pipes queues, on the stack's Cassandra (PasswordAuthenticator,
CassandraAuthorizer): each right alone lets a role make its calls and is refused the others by
name, changing nothing; a receiver cannot drop a table; producers holding send alone and
workers holding receive alone lose and duplicate nothing; a dropped login is refused within
the caches' delay.

Roles are made as the operator makes a QueueUser's (`dbq.backends.cassandra.access`); the
QueueUser resource itself, on a pipes queue, is tested with the operator in
test_queue_user_cassandra.py.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from cassandra import Unauthorized

from dbq.backends.cassandra.access import CassandraLogins, groups_of, table_permissions
from dbq.backends.cassandra.backend import CassandraPipes
from dbq.backends.cassandra.plan import PipesTarget
from dbq.client import PipesQueue, connect
from dbq.connection import from_url
from dbq.connection.cassandra import open_session
from dbq.contract.access import PIPES_ALSO, QUEUE_RIGHTS, Right
from dbq.errors import AuthenticationFailed, DatabaseError, PermissionDenied
from dbq.names import QueueNames, group_role, login_role
from tests.workers import conserve_through_logins

pytestmark = pytest.mark.cassandra

KEYSPACE = f"dbq_access_{uuid.uuid4().hex[:6]}"
ONE_NODE = {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "1"}
# roles_validity, permissions_validity and credentials_validity: 2 s each on the stack (Cassandra's
# defaults); a refusal comes within their sum, and a margin for a loaded node.
CACHES_S = 6.0


@pytest.fixture(scope="module")
def queues(stack, cassandra) -> Iterator[dict[str, QueueNames]]:
    """Pipes queues made by the operator's role: `orders` with dead letters (after one attempt)
    and an archive, `conserve` for the conservation runs."""
    admin = from_url(stack.cassandra.url())
    made = {}
    for name, attempts, archive in (("orders", 1, 3600), ("conserve", 0, 0)):
        names = QueueNames(KEYSPACE, name)
        backend = CassandraPipes(admin, PipesTarget(names, ONE_NODE, 500, 60000, attempts, archive))
        try:
            backend.apply()
        finally:
            backend.close()
        made[name] = names
    yield made
    for names in made.values():
        backend = CassandraPipes(admin, PipesTarget(names, ONE_NODE, 500, 60000))
        try:
            backend.teardown()
        finally:
            backend.close()


class Accounts:
    """Login roles made as the operator makes a QueueUser's; dropped at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.admin = from_url(url)
        self.cluster, session = open_session(self.admin)
        self.logins = CassandraLogins(session, self.admin)
        self.made: list[str] = []

    def login(self, rights: dict[str, tuple[str, ...]]) -> tuple[str, str]:
        """A new login holding `rights` (queue -> rights): its name and url."""
        name = login_role("access-test", secrets.token_hex(4))
        password = secrets.token_urlsafe(24)
        self.logins.set_login(name, password, 0)
        for queue, given in rights.items():
            for right in given:
                group = group_role("", KEYSPACE, queue, right)
                self.logins.ensure_group(
                    group, table_permissions(QueueNames(KEYSPACE, queue), None, Right(right))
                )
                self.logins.grant(name, group)
        self.made.append(name)
        return name, self.url.replace(f"{self.admin.username}:{self.admin.password}@", f"{name}:{password}@")

    def close(self) -> None:
        for name in self.made:
            self.logins.drop(name)
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def accounts(stack, queues) -> Iterator[Accounts]:
    made = Accounts(stack.cassandra.url())
    yield made
    made.close()


def client(url: str, queue: str = "orders") -> PipesQueue:
    return connect(url, queue, schema=KEYSPACE, smart_batching=False)  # type: ignore[return-value]


# Each client call: the right it needs, and the PipesQueue method it is.
CALLS: dict[str, tuple[Right, str, Callable[[PipesQueue], object]]] = {
    "push": (Right.SEND, "push", lambda q: q.push(b"by-login")),
    "push_many": (Right.SEND, "push_many", lambda q: q.push_many([b"a", b"b"])),
    "delayed push": (Right.SEND, "push", lambda q: q.push(b"later", delay=3600)),
    "pop": (Right.RECEIVE, "pop", lambda q: q.pop(timeout=0)),
    "acquire and ack": (Right.RECEIVE, "acquire", lambda q: (m := q.acquire(timeout=0)) and m.ack()),
    "acquire and nack": (Right.RECEIVE, "nack", lambda q: (m := q.acquire(timeout=0)) and m.nack(error="x")),
    "peek": (Right.PEEK, "peek", lambda q: q.peek(5)),
    "stats": (Right.MONITOR, "stats", lambda q: q.stats()),
    "history": (
        Right.MONITOR,
        "history",
        lambda q: q.history(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC)),
    ),
    "dead_letters": (Right.MANAGE, "dead_letters", lambda q: q.dead_letters()),
    "redrive": (Right.MANAGE, "redrive", lambda q: q.redrive()),
    "purge": (Right.MANAGE, "purge_dead_letters", lambda q: q.purge_dead_letters()),
    "archived": (Right.MANAGE, "archived", lambda q: q.archived(datetime.now(UTC) - timedelta(hours=1))),
    "repair": (Right.MANAGE, "repair", lambda q: q.repair()),
}


def state(q: PipesQueue) -> tuple[int, ...]:
    s = q.stats()
    return (s.pushed, s.popped, s.acquired, s.depth, s.in_flight, s.dead, s.delayed, s.archived)


@pytest.mark.parametrize("right", [str(r) for r in QUEUE_RIGHTS])
def test_each_right_alone_makes_its_calls_and_is_refused_the_others_naming_the_right(
    stack, queues, accounts, right
):
    """What a right's tables also allow (`PIPES_ALSO`: CQL grants whole tables) is allowed too,
    and nothing else. A message comes due before the calls, so repair has something to write."""
    _, url = accounts.login({"orders": (right,)})
    refused: dict[str, str] = {}
    with client(stack.cassandra.url()) as admin:
        admin.push_many([f"m{i}".encode() for i in range(6)])  # something to take, nack and bury
        admin.push(b"due", delay=0.001)
        with client(url) as q:
            for call, (_, _, run) in CALLS.items():
                before = state(admin)
                try:
                    run(q)
                except PermissionDenied as e:
                    refused[call] = e.right
                    assert e.queue == f"{KEYSPACE}.orders" and f"lacks the {e.right} right on" in str(e)
                    assert state(admin) == before, f"{call} refused, yet it changed the queue"
    assert refused == {
        call: str(needs) for call, (needs, method, _) in CALLS.items()
        if needs != right and method not in PIPES_ALSO[Right(right)]
    }  # fmt: skip


def test_rights_on_one_queue_allow_no_call_on_another_of_its_keyspace(stack, queues, accounts):
    """The keyspace's settings and statistics history tables are shared (a client reads its
    queue's row when it connects; a monitor reads any queue's samples), the rest is the queue's own."""
    _, url = accounts.login({"conserve": ("send", "receive", "peek", "monitor", "manage")})
    with client(url) as q:
        for call, (needs, _, run) in CALLS.items():
            if call == "history":
                run(q)
                continue
            with pytest.raises(PermissionDenied) as refused:
                run(q)
            assert refused.value.right == needs, call
    _, nothing = accounts.login({})
    with pytest.raises(PermissionDenied, match=f"lacks any right on {KEYSPACE}.orders"):
        client(nothing)


def test_a_receiver_cannot_drop_or_alter_a_table_but_cql_lets_it_truncate_one(stack, queues, accounts):
    """CQL's MODIFY includes TRUNCATE: the docs say so; this pins it."""
    _, url = accounts.login({"orders": ("receive",)})
    cluster, session = open_session(from_url(url))
    try:
        for statement in (
            f'DROP TABLE "{KEYSPACE}"."orders_waiting"',
            f'ALTER TABLE "{KEYSPACE}"."orders_waiting" WITH gc_grace_seconds = 0',
            f'DROP KEYSPACE "{KEYSPACE}"',
            f'SELECT * FROM "{KEYSPACE}"."orders_dead"',
            f'SELECT * FROM "{KEYSPACE}"."conserve_waiting"',
        ):
            with pytest.raises(Unauthorized):
                session.execute(statement)
        session.execute(f'TRUNCATE "{KEYSPACE}"."orders_staged"')  # empty; allowed by MODIFY
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("mode", ["amo", "leased"])
def test_send_only_producers_and_receive_only_workers_lose_and_duplicate_nothing(
    stack, queues, accounts, tmp_path, mode
):
    """The contract suite's conservation run (4 pushing processes, 4 taking, a repairer), with
    the producers holding send alone and the workers receive alone; the repairer is the operator."""
    _, producer = accounts.login({"conserve": ("send",)})
    _, worker = accounts.login({"conserve": ("receive",)})
    admin_url = stack.cassandra.url()
    with client(admin_url, "conserve") as q:
        conserve_through_logins(q, producer, worker, admin_url, tmp_path, mode, q.repair)


def test_a_dropped_login_is_refused_within_the_caches_delay_and_its_groups_go_with_the_queue(
    stack, queues, accounts
):
    login, url = accounts.login({"orders": ("send",)})
    with client(url) as q:
        q.push(b"before the drop")
        accounts.logins.drop(login)
        dropped = time.monotonic()
        while True:  # the open connection goes on until the node's caches expire
            try:
                q.push(b"while the caches last")
            except (PermissionDenied, AuthenticationFailed, DatabaseError):
                break
            assert time.monotonic() - dropped < CACHES_S, "a dropped login still pushes"
            time.sleep(0.2)
        print(f"refused {time.monotonic() - dropped:.1f} s after the drop")
    with pytest.raises(AuthenticationFailed):
        client(url)
    # A queue's groups are dropped with it.
    names = QueueNames(KEYSPACE, "gone")
    admin = from_url(stack.cassandra.url())
    backend = CassandraPipes(admin, PipesTarget(names, ONE_NODE, 500, 60000))
    try:
        backend.apply()
        accounts.logins.ensure_group(group_role("", KEYSPACE, "gone", "send"),
                                     table_permissions(names, None, Right.SEND))  # fmt: skip
        backend.teardown()
    finally:
        backend.close()
    left = {r[0] for r in accounts.logins.session.execute("LIST ROLES")}
    assert not left & set(groups_of("", names))
