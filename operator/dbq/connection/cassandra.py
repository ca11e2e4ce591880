"""Cassandra sessions from ConnectionSettings, and driver errors translated into `dbq.errors`.

Reads and writes use LOCAL_QUORUM (one replica on a one-node cluster), lightweight transactions
LOCAL_SERIAL: a pipe's lease and the queue's watermark need linearizable updates, messages do not.
Options from the url or Secret: `dc` (the local datacenter), `consistency` (e.g. ONE), `sslmode`
(TLS, with the Secret's `ca`: `dbq.connection.tls`).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from typing import Any

from cassandra import AuthenticationFailed as DriverAuthFailed
from cassandra import (
    ConsistencyLevel,
    DriverException,
    OperationTimedOut,
    ReadFailure,
    ReadTimeout,
    Unauthorized,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable, Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import tuple_factory

from dbq.connection import ConnectionSettings
from dbq.connection.tls import refusal, ssl_context
from dbq.errors import (
    AuthenticationFailed,
    DatabaseError,
    DatabaseUnreachable,
    DbqError,
    InvalidSpec,
    PermissionDenied,
)

CONNECT_TIMEOUT_S = 5.0
# The control connection reads the whole schema when it connects (token awareness needs it); the
# driver's 2 s default timed out on a loaded one-node Cassandra and refused the connection.
CONTROL_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 12.0
# A schema change (CREATE/DROP/ALTER) waits for the node to write and announce the new schema:
# under load that outlasted REQUEST_TIMEOUT_S, and provisioning failed half-way.
SCHEMA_CHANGE_TIMEOUT_S = 60.0
# A loaded node sometimes fails one of the control connection's reads of its system tables
# ("Replica(s) failed to execute read"); connecting again a moment later succeeds.
CONNECT_ATTEMPTS = 3
CONNECT_RETRY_PAUSE_S = 1.0
TRANSIENT_CONNECT_ERRORS = (ReadFailure, ReadTimeout, OperationTimedOut)


def hosts(settings: ConnectionSettings) -> list[str]:
    return [h.strip() for h in settings.host.split(",") if h.strip()]


def consistency(settings: ConnectionSettings) -> int:
    name = settings.options.get("consistency", "LOCAL_QUORUM").upper()
    level = ConsistencyLevel.name_to_value.get(name)
    if level is None:
        raise InvalidSpec(
            f"consistency {name!r} in the connection options is not a Cassandra consistency level:"
            " use LOCAL_QUORUM (the default), QUORUM or ONE"
        )
    return int(level)


def open_session(settings: ConnectionSettings) -> tuple[Cluster, Session]:
    """A connected session; a connect whose only failures are transient reads of the node's
    system tables is tried again, at most CONNECT_ATTEMPTS times."""
    attempt = 1
    while True:
        cluster = _cluster(settings)
        try:
            return cluster, cluster.connect()
        except Exception as e:
            cluster.shutdown()
            if attempt == CONNECT_ATTEMPTS or not _transient(e):
                raise translate(e, settings) from None
        time.sleep(CONNECT_RETRY_PAUSE_S * attempt)
        attempt += 1


def host_errors(e: Exception) -> list[Any]:
    """The per-host errors a NoHostAvailable carries (a dict by host, or a list when a session's
    pools could not connect)."""
    errors: Any = getattr(e, "errors", None) or {}
    return list(errors.values()) if isinstance(errors, dict) else list(errors)


def only_failed_with(e: Exception, kinds: type[Exception] | tuple[type[Exception], ...]) -> bool:
    """Whether `e` is a NoHostAvailable whose every host failed with one of `kinds`."""
    errors = host_errors(e)
    return isinstance(e, NoHostAvailable) and bool(errors) and all(isinstance(v, kinds) for v in errors)


def _transient(e: Exception) -> bool:
    return only_failed_with(e, TRANSIENT_CONNECT_ERRORS)


def _cluster(settings: ConnectionSettings) -> Cluster:
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.options.get("dc"))),
        consistency_level=consistency(settings),
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=REQUEST_TIMEOUT_S,
        row_factory=tuple_factory,
    )
    auth = PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
    tls = ssl_context(settings.ca, settings.options)
    return Cluster(
        hosts(settings),
        port=settings.port,
        auth_provider=auth,
        ssl_context=tls,
        ssl_options=_verified_name(settings, tls),
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=CONNECT_TIMEOUT_S,
        control_connection_timeout=CONTROL_TIMEOUT_S,
        protocol_version=4,  # v5 framing (checksummed) hits CRC errors in the Python driver (PYTHON-1337)
        # Without it, a request past about 4 KiB (a batch of 24 bodies of 100 bytes) waited 44 ms
        # for a delayed ACK (Nagle's algorithm): 1 ms with it.
        sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )


def _verified_name(settings: ConnectionSettings, tls: ssl.SSLContext | None) -> dict[str, str] | None:
    """The name each node's certificate must have: the url's host when it is one name (a
    Service's, say), as libpq checks it; else (addresses, or several hosts) the driver checks each
    node's certificate against the address the node announces."""
    names = hosts(settings)
    if tls is None or not tls.check_hostname or len(names) != 1:
        return None
    try:
        ipaddress.ip_address(names[0])
    except ValueError:
        return {"server_hostname": names[0]}
    return None


def translate(e: Exception, settings: ConnectionSettings, client: bool = False) -> DbqError:
    """A condition reason for a driver error; driver messages carry no credentials, but the
    password is masked anyway in case one echoes it. For a `client` (an application's login), a
    refusal (Unauthorized) is PermissionDenied quoting Cassandra's words (the permission and
    table), and the pipes client names the right; for the operator it is a DatabaseError."""
    if isinstance(e, DbqError):
        return e
    text = str(e)
    if settings.password:
        text = text.replace(settings.password, "***")
    if isinstance(e, DriverAuthFailed) or any(isinstance(v, DriverAuthFailed) for v in host_errors(e)):
        if not settings.username:
            return AuthenticationFailed(
                f"{settings.endpoint}: Cassandra asks for a login and none was given: put the user and"
                " password in the url (cassandra://USER:PASSWORD@host:9042) or the Secret's username and password"
            )
        return AuthenticationFailed(
            f"{settings.endpoint}: authentication failed for user {settings.username!r} (a wrong password,"
            " or a role that is gone or may not log in)"
        )
    if client and (isinstance(e, Unauthorized) or any(isinstance(v, Unauthorized) for v in host_errors(e))):
        said = text[text.find("User ") :][:300] if "User " in text else text[:300]
        return PermissionDenied(f"{settings.endpoint}: {said}")
    if (tls := refusal(text)) is not None:
        return DatabaseUnreachable(f"{settings.endpoint}: {tls}")
    if isinstance(e, NoHostAvailable | OSError):
        return DatabaseUnreachable(f"{settings.endpoint}: cannot connect ({text[:200]})")
    if isinstance(e, DriverException):
        return DatabaseError(f"{settings.endpoint}: {text[:400]}")
    return DatabaseError(f"{settings.endpoint}: {type(e).__name__}: {text[:400]}")
