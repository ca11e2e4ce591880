"""TLS to PostgreSQL and Cassandra, on the stack's servers (its own CA, certificates naming
127.0.0.1 and localhost): a Secret's `ca` makes the operator and the client verify the server,
and each connection is encrypted (`pg_stat_ssl`, `system_views.clients`); without the CA, or by a
name the certificate lacks, the connection is refused with the reason and the fix; a CA that does
not parse or has expired is refused before anything connects; a plain connection stays possible
where the url says so."""

from __future__ import annotations

import base64
import dataclasses
import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.client import PipesQueue, Queue, connect, from_resource
from dbq.connection import ConnectionSettings, from_secret_data, from_url, odbc
from dbq.connection.cassandra import open_session
from dbq.connection.tls import ca_file
from dbq.contract.ring import RingTarget
from dbq.errors import DatabaseUnreachable, InvalidConnection
from dbq.names import QueueNames
from tests.manifests import queue as queue_manifest

SCHEMA = "tls_q"


@pytest.fixture(scope="module")
def ca(stack: Any, postgres: Any) -> str:
    return str(stack.postgres.tls.ca_pem())


def secret(url: str, ca: str = "") -> dict[str, str]:
    """A Secret's data (base64, as the API returns it)."""
    values = {"url": url} | ({"ca": ca} if ca else {})
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


def encrypted(settings: ConnectionSettings, application: str) -> list[bool]:
    """Whether each session of `application` in the settings' database is encrypted."""
    with odbc.connect(settings) as conn:
        rows = conn.cursor().execute(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.application_name = ? AND a.datname = current_database()",
            application,
        )
        return [bool(int(r[0])) for r in rows.fetchall()]


@pytest.fixture(scope="module")
def verified(postgres: Any, ca: str) -> Iterator[ConnectionSettings]:
    """The operator's settings from a Secret with the CA, and a ring provisioned over them."""
    settings = from_secret_data(secret(postgres.url, ca), "postgres")
    OdbcRing(settings, RingTarget(QueueNames(SCHEMA, "orders"), 100, 64)).apply()
    yield settings


def test_the_operator_provisions_over_a_verified_encrypted_connection(verified: ConnectionSettings) -> None:
    assert "sslrootcert" in verified.odbc() and "SSLMODE=verify-full" in verified.odbc()
    ring = OdbcRing(verified, RingTarget(QueueNames(SCHEMA, "orders"), 100, 64))
    assert ring.plan(ring.observe()) == []
    cur = ring.conn.cursor()
    assert cur.execute("SELECT ssl::int FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchval() == 1
    ring.close()


def test_a_client_from_the_secret_and_one_from_a_url_verify_and_encrypt(
    verified: ConnectionSettings, postgres: Any, ca: str
) -> None:
    resource = queue_manifest(name="orders")
    resource["spec"]["connection"] = {"secretRef": {"name": "s"}, "schema": SCHEMA}
    by_secret = from_resource(resource, secret(f"{postgres.url}?application_name=tls-test", ca))
    assert isinstance(by_secret, Queue)
    by_url = connect(
        f"{postgres.url}?sslmode=verify-full&sslrootcert={ca_file(ca)}&application_name=tls-test",
        "orders",
        schema=SCHEMA,
    )
    try:
        by_secret.push(b"over tls")
        assert by_url.pop(timeout=1).body == b"over tls"  # type: ignore[union-attr]
        sessions = encrypted(verified, "tls-test")
        assert len(sessions) >= 2 and all(sessions)
    finally:
        by_secret.close()
        by_url.close()


@pytest.mark.parametrize("driver", ["psycopg", "odbc"])
def test_without_the_ca_a_verifying_connection_is_refused_with_the_fix(postgres: Any, driver: str) -> None:
    settings = dataclasses.replace(from_url(postgres.url), options={"sslmode": "verify-full"})
    with pytest.raises(DatabaseUnreachable) as refused:
        if driver == "odbc":
            odbc.connect(settings)
        else:
            connect(f"{postgres.url}?sslmode=verify-full", "orders", schema=SCHEMA).stats()
    text = str(refused.value)
    assert "TLS refused the connection" in text and "'ca'" in text and "127.0.0.1" in text
    assert settings.password not in text


def test_a_host_name_the_certificate_lacks_is_refused(postgres: Any, ca: str) -> None:
    url = from_url(postgres.url)
    wrong = postgres.url.replace("@127.0.0.1:", "@dbq-wrong.invalid:") + "?hostaddr=127.0.0.1"
    with pytest.raises(DatabaseUnreachable) as refused:
        q = Queue(dataclasses.replace(from_url(wrong), ca=ca), QueueNames(SCHEMA, "orders"))
        q.stats()
    text = str(refused.value)
    assert "does not name the host" in text and "dbq-wrong.invalid" in text
    assert url.password not in text


def test_a_plain_connection_stays_possible_where_the_url_says_so(postgres: Any, ca: str) -> None:
    settings = from_secret_data(secret(postgres.url + "?sslmode=disable", ca), "postgres")
    with odbc.connect(settings) as conn:
        assert (
            conn.cursor().execute("SELECT ssl::int FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchval()
            == 0
        )


def _certificate(days_from_now: int, days_long: int) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "some CA")])
    start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days_from_now)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days_long))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.mark.parametrize(
    ("ca", "says"),
    [
        ("not a certificate", "is not a PEM certificate"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "is not a PEM certificate"),
        (_certificate(-30, 10), "expired on"),
        (_certificate(2, 10), "is valid only from"),
    ],
    ids=["text", "damaged", "expired", "not-yet-valid"],
)
def test_a_ca_that_does_not_parse_or_is_out_of_date_is_refused_before_connecting(
    postgres: Any, ca: str, says: str
) -> None:
    with pytest.raises(InvalidConnection) as refused:
        from_secret_data(secret(postgres.url, ca), "postgres")
    assert "Secret key 'ca'" in str(refused.value) and says in str(refused.value)


def test_a_ca_for_sql_server_is_refused_with_what_to_do_instead() -> None:
    """Its ODBC driver takes no CA of a connection's own: the key would be silently unused."""
    with pytest.raises(InvalidConnection) as refused:
        from_secret_data(secret("mssql://u:p@db:1433/shop", _certificate(-1, 10)), "sqlserver")
    assert "Secret key 'ca' is not used for SQL Server" in str(refused.value)
    assert "encrypt=yes&trustservercertificate=no" in str(refused.value)


# --- Cassandra ---------------------------------------------------------------------------------
KEYSPACE = "tls_pipes"


@pytest.fixture(scope="module")
def cass_url(cassandra: Any, stack: Any) -> Iterator[str]:
    yield stack.cassandra.url()
    cassandra.execute(f'DROP KEYSPACE IF EXISTS "{KEYSPACE}"', timeout=120)


def cassandra_tls_of(session: Any) -> list[bool]:
    """Whether each of this session's connections to the node is encrypted, as the node sees them
    (`system_views.clients`, matched by the connections' local ports)."""
    cluster = session.cluster
    ports = {
        pool._connection._socket.getsockname()[1] for pool in session._pools.values() if pool._connection
    }
    ports.add(cluster.control_connection._connection._socket.getsockname()[1])
    rows = session.execute("SELECT port, ssl_enabled FROM system_views.clients")
    return [bool(enabled) for port, enabled in rows if port in ports]


def test_a_pipes_queue_is_provisioned_and_used_over_verified_tls(cass_url: str, stack: Any) -> None:
    settings = from_secret_data(secret(cass_url, stack.postgres.tls.ca_pem()), "cassandra")
    spec = QueueSpec.model_validate(
        {
            "backend": "cassandra",
            "design": "pipes",
            "connection": {"secretRef": {"name": "s"}, "schema": KEYSPACE},
        }
    )
    backend = open_backend(spec, "events", settings)
    backend.apply()
    backend.close()
    resource = queue_manifest(name="events", backend="cassandra", design="pipes")
    resource["spec"]["connection"] = {"secretRef": {"name": "s"}, "schema": KEYSPACE}
    del resource["spec"]["ring"]
    q = from_resource(resource, secret(cass_url, stack.postgres.tls.ca_pem()))
    assert isinstance(q, PipesQueue)
    try:
        q.push(b"over tls")
        assert q.pop(timeout=2).body == b"over tls"  # type: ignore[union-attr]
        sessions = cassandra_tls_of(q.session)
        assert sessions and all(sessions)
    finally:
        q.close()


def test_cassandra_without_the_ca_or_by_a_name_the_certificate_lacks_is_refused(
    cass_url: str, ca: str
) -> None:
    base = from_url(cass_url)
    cases = {
        "not chained to a CA it trusts": dataclasses.replace(base, options={"sslmode": "verify-full"}),
        "does not name the host": dataclasses.replace(base, ca=ca, host="vm"),  # /etc/hosts: 127.0.0.1
    }
    for says, settings in cases.items():
        with pytest.raises(DatabaseUnreachable) as refused:
            open_session(settings)
        assert "TLS refused the connection" in str(refused.value)
        assert (says if says != "not chained to a CA it trusts" else "does not chain to the CA") in str(
            refused.value
        )


def test_cassandra_stays_plain_where_the_url_says_so(cass_url: str, ca: str) -> None:
    for settings in (
        from_url(cass_url),
        from_secret_data(secret(cass_url + "?sslmode=disable", ca), "cassandra"),
    ):
        cluster, session = open_session(settings)
        try:
            assert cassandra_tls_of(session) and not any(cassandra_tls_of(session))
        finally:
            cluster.shutdown()
