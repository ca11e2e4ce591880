"""Logins on the stack's Cassandra (PasswordAuthenticator): without credentials, with a wrong
password, as the default superuser (its login taken away) or as a role dropped, a connect fails
with dbq's AuthenticationFailed naming the cause; the stack's own superuser connects."""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any

import pytest

from dbq.connection import from_url
from dbq.connection.cassandra import open_session
from dbq.errors import AuthenticationFailed, DatabaseUnreachable


def test_the_stacks_superuser_connects_and_the_default_one_cannot(stack: Any, cassandra: Any) -> None:
    cluster, session = open_session(from_url(stack.cassandra.url()))
    try:
        roles = {
            r[0]: (r[1], r[2])
            for r in session.execute("SELECT role, is_superuser, can_login FROM system_auth.roles")
        }
    finally:
        cluster.shutdown()
    assert roles["dbq"] == (True, True) and roles["cassandra"] == (False, False)


@pytest.mark.parametrize(
    ("user", "password", "says"),
    [
        ("", "", "asks for a login and none was given"),
        ("dbq", "not-the-password", "authentication failed for user 'dbq'"),
        ("cassandra", "cassandra", "authentication failed for user 'cassandra'"),
    ],
    ids=["none", "wrong-password", "default-superuser"],
)
def test_a_connect_without_a_valid_login_is_refused_by_name(
    stack: Any, cassandra: Any, user: str, password: str, says: str
) -> None:
    settings = dataclasses.replace(from_url(stack.cassandra.url()), username=user, password=password)
    with pytest.raises(AuthenticationFailed, match=says) as refused:
        open_session(settings)
    assert "not-the-password" not in str(refused.value)


def test_a_dropped_role_is_refused_once_the_caches_expire(stack: Any, cassandra: Any) -> None:
    role, password = f"gone_{secrets.token_hex(3)}", secrets.token_hex(8)
    cassandra.execute(f"CREATE ROLE {role} WITH LOGIN = true AND PASSWORD = '{password}'")
    url = stack.cassandra.url().replace(f"dbq:{stack.cassandra.auth.password}@", f"{role}:{password}@")
    cluster, _ = open_session(from_url(url))
    cluster.shutdown()
    cassandra.execute(f"DROP ROLE {role}")
    dropped = time.monotonic()
    # roles_validity and credentials_validity: 2 s on the stack (Cassandra's default). Meanwhile a
    # connect may still succeed, or fail half-way (a connection taken on cached credentials, the
    # next refused), and the driver then names no cause.
    while True:
        try:
            cluster, _ = open_session(from_url(url))
            cluster.shutdown()
        except AuthenticationFailed:
            break
        except DatabaseUnreachable:
            pass
        assert time.monotonic() - dropped < 2 * 2 + 1, (
            "a dropped role still logs in past the caches' validity"
        )
        time.sleep(0.2)
