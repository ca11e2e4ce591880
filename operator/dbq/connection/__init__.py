"""Connection settings from a Queue's Secret (or a URL), and the ODBC strings built from them.

The Secret holds either `url` (`postgresql://user:pass@host:port/db?driver=...`,
`mssql://...`, `cassandra://host1,host2:port`) or the keys host, port, database, username,
password and optionally driver; and `ca`, the CA's certificate (PEM) to verify the server with
(`dbq.connection.tls`). `ConnectionSettings.__repr__` never shows the password, and
`endpoint` (what status and events show) has no credentials.

The drivers live beside this module: `odbc` (PostgreSQL and SQL Server, for the operator and the
SQL Server clients), `postgres` (psycopg, for the PostgreSQL clients) and `cassandra`, each
opening connections; `odbc.translate` and `cassandra.translate` turn driver errors into
`dbq.errors`.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from dbq.connection.tls import CA_KEY, check_ca, libpq_tls
from dbq.errors import InvalidConnection

DEFAULT_PORTS = {"postgres": 5432, "sqlserver": 1433, "cassandra": 9042}
DEFAULT_DRIVERS = {"postgres": "PostgreSQL Unicode", "sqlserver": "ODBC Driver 18 for SQL Server"}
# SQL Server drivers in the order dbq prefers them when the Secret names none (the first installed).
SQLSERVER_DRIVERS = ("ODBC Driver 18 for SQL Server", "ODBC Driver 17 for SQL Server", "FreeTDS")
_SCHEMES = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "mssql": "sqlserver",
    "sqlserver": "sqlserver",
    "cassandra": "cassandra",
}


@dataclass(frozen=True)
class ConnectionSettings:
    backend: str
    host: str
    port: int
    database: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    driver: str = ""
    options: dict[str, str] = field(default_factory=dict)
    ca: str = field(default="", repr=False)  # the Secret's `ca` (PEM): the server is verified against it

    @property
    def endpoint(self) -> str:
        where = f"{self.host}:{self.port}"
        return f"{where}/{self.database}" if self.database else where

    def odbc(self) -> str:
        if self.backend not in DEFAULT_DRIVERS:
            raise InvalidConnection(f"backend {self.backend} is not reached through ODBC")
        driver = self.driver or DEFAULT_DRIVERS[self.backend]
        parts = {"DRIVER": f"{{{driver}}}"}
        if self.backend == "postgres":
            parts |= {"SERVER": self.host, "PORT": str(self.port), "DATABASE": self.database}
            parts |= {"UID": self.username, "PWD": self.password}
        else:
            parts |= {"SERVER": f"{self.host},{self.port}", "DATABASE": self.database}
            parts |= {"UID": self.username, "PWD": self.password}
        options = {k.upper(): v for k, v in self.options.items()}
        if self.backend == "postgres":
            options |= {k.upper(): v for k, v in libpq_tls(self.ca, self.options).items()}
            # psqlODBC takes sslmode itself, and other libpq parameters (the CA's file) in pqopt.
            if root := options.pop("SSLROOTCERT", ""):
                options["PQOPT"] = " ".join(filter(None, (options.get("PQOPT"), f"sslrootcert={root}")))
        parts |= options
        return ";".join(f"{k}={_odbc_value(v)}" for k, v in parts.items() if v != "")


def _odbc_value(value: str) -> str:
    if value.startswith("{") and value.endswith("}"):
        return value
    if any(c in value for c in ";{}=") or value != value.strip():
        return "{" + value.replace("}", "}}") + "}"
    return value


def from_url(url: str, backend: str | None = None) -> ConnectionSettings:
    parts = urlsplit(url)
    kind = _SCHEMES.get(parts.scheme)
    if kind is None:
        raise InvalidConnection(
            f"url scheme {parts.scheme!r} is not supported: use postgresql://, mssql:// or cassandra://"
        )
    if backend and kind != backend:
        raise InvalidConnection(f"url is for {kind} but spec.backend is {backend}: fix the Secret's url")
    if not parts.hostname:
        raise InvalidConnection(
            "url has no host: write it like postgresql://user:password@host:5432/database"
        )
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    driver = query.pop("driver", "")
    try:
        port = parts.port or DEFAULT_PORTS[kind]
    except ValueError as e:
        raise InvalidConnection(f"url has an invalid port: {e}") from None
    return ConnectionSettings(
        backend=kind,
        host=parts.hostname,
        port=port,
        database=unquote(parts.path.lstrip("/")),
        username=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        driver=driver,
        options=query,
    )


def from_secret_data(data: dict[str, Any], backend: str, *, encoded: bool = True) -> ConnectionSettings:
    """Settings from a Secret's `data` (base64, as the API returns it) or `stringData` (encoded=False)."""
    values: dict[str, str] = {}
    for key, raw in (data or {}).items():
        if raw is None:
            continue
        try:
            values[key] = base64.b64decode(raw).decode() if encoded else str(raw)
        except (ValueError, UnicodeDecodeError):
            raise InvalidConnection(f"Secret key {key!r} is not valid base64 text") from None
    ca = check_ca(values[CA_KEY]) if values.get(CA_KEY) else ""
    if ca and backend == "sqlserver":
        raise InvalidConnection(
            f"Secret key {CA_KEY!r} is not used for SQL Server: its ODBC driver takes no CA of a connection's"
            " own. Remove the key, put the CA in the trust store of the image dbq runs in, and ask for"
            " verification in the url (?encrypt=yes&trustservercertificate=no)"
        )
    if "url" in values:
        return dataclasses.replace(from_url(values["url"], backend), ca=ca)
    missing = [k for k in ("host", "username", "password") if not values.get(k)]
    if backend != "cassandra" and not values.get("database"):
        missing.append("database")
    if missing and backend != "cassandra":
        raise InvalidConnection(
            f"Secret lacks {', '.join(missing)}: give it `url`, or host, port, database, username and password"
        )
    if backend == "cassandra" and not values.get("host"):
        raise InvalidConnection("Secret lacks host: give it `url` (cassandra://host:9042) or host and port")
    try:
        port = int(values.get("port") or DEFAULT_PORTS[backend])
    except ValueError:
        raise InvalidConnection(f"Secret key port {values['port']!r} is not a number") from None
    return ConnectionSettings(
        backend=backend,
        host=values["host"],
        port=port,
        database=values.get("database", ""),
        username=values.get("username", ""),
        password=values.get("password", ""),
        driver=values.get("driver", ""),
        ca=ca,
    )
