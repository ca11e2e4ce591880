"""Rights on SQL Server, live: run only where DBQ_MSSQL_DSN names a server (SQL Server cannot run
on the machine dbq is built on; there its T-SQL is pinned by golden files and the grammar check).

The database must be contained (`ALTER DATABASE ... SET CONTAINMENT = PARTIAL`) and the DSN's
login may create users and roles there."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.backends.sqlserver.access import MsLogins
from dbq.client import connect
from dbq.connection import from_url, odbc
from dbq.contract.ring import RingTarget
from dbq.errors import PermissionDenied
from dbq.names import QueueNames, group_role, login_role
from tests.sqlserver import MSSQL_DSN

pytestmark = pytest.mark.skipif(not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here")


@pytest.fixture(scope="module")
def queue() -> Iterator[QueueNames]:
    names = QueueNames(f"acc_{secrets.token_hex(3)}", "orders")
    backend = OdbcRing(from_url(MSSQL_DSN), RingTarget(names, 64, 64))
    backend.apply()
    yield names
    backend.teardown()


def test_a_send_only_user_pushes_and_is_refused_the_rest_then_is_dropped(queue):
    admin = from_url(MSSQL_DSN)
    conn = odbc.connect(admin)
    logins = MsLogins(conn.cursor())
    login, password = login_role("access-test", secrets.token_hex(3)), secrets.token_urlsafe(24)
    logins.set_login(login, password, 1)
    logins.grant(login, group_role(admin.database, queue.schema, queue.queue, "send"))
    url = MSSQL_DSN.replace(f"{admin.username}:{admin.password}@", f"{login}:{password}@", 1)
    try:
        with connect(url, queue.queue, schema=queue.schema, smart_batching=False) as q:
            assert q.push(b"from a contained user") > 0
            for call in (lambda: q.pop(timeout=0), lambda: q.stats(), lambda: q.peek(1)):
                with pytest.raises(PermissionDenied):
                    call()
    finally:
        logins.drop(login)
        conn.close()
    assert not MsLogins(odbc.connect(admin).cursor()).exists(login)
