"""A private PostgreSQL cluster (Debian's binaries) in its own data directory and port.

The system cluster is never touched. When we are root the server runs as the `postgres`
user, as PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

from dbq.devstack.base import Paths, StackError, log_tail, pid_alive, port_open, wait_until
from dbq.devstack.tls import StackTls

PG_PORT = int(os.environ.get("DBQ_PG_PORT", "15432"))
PG_USER = "dbq"  # the bootstrap superuser: the DBA's, never the operator's or an application's
# The operator's login: no attribute but LOGIN; CREATE on each database it provisions in, and
# dbq's role helper installed there for it (`prepare`), as a DBA would give them.
OPERATOR_USER = "dbq_operator"
ODBC_DRIVER = "PostgreSQL Unicode"


def _pg_bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise StackError("PostgreSQL server binaries not found: run `bash stack/bootstrap.sh`")
    return Path(found[-1]).parent


class Postgres:
    name = "postgres"

    def __init__(self, paths: Paths) -> None:
        self.dir = paths.state / "postgres"
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.password_file = self.dir / "password"
        self.operator_password_file = self.dir / "operator-password"
        self.tls = StackTls(paths)
        self.server_cert, self.server_key = self.dir / "server.pem", self.dir / "server-key.pem"

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def operator_password(self) -> str:
        return self.operator_password_file.read_text().strip()

    def url(self, database: str = "postgres", user: str = PG_USER) -> str:
        """The url of `user`: the superuser's by default (a DBA's: set-up and inspection), or
        OPERATOR_USER's (what a Queue's Secret holds: `operator_url`)."""
        return f"postgresql://{user}:{self._password_of(user)}@127.0.0.1:{PG_PORT}/{database}"

    def odbc(self, database: str = "postgres", user: str = PG_USER) -> str:
        return (
            f"DRIVER={{{ODBC_DRIVER}}};SERVER=127.0.0.1;PORT={PG_PORT};DATABASE={database};"
            f"UID={user};PWD={self._password_of(user)}"
        )

    def operator_url(self, database: str = "postgres") -> str:
        return self.url(database, OPERATOR_USER)

    def operator_odbc(self, database: str = "postgres") -> str:
        return self.odbc(database, OPERATOR_USER)

    def _password_of(self, user: str) -> str:
        return self.operator_password if user == OPERATOR_USER else self.password

    def prepare(self, database: str = "postgres") -> None:
        """What a DBA does once for the operator in `database`: its login (made on first use),
        CREATE on the database, and dbq's role helper for it."""
        import pyodbc

        from dbq.backends.postgres.access import helper_statements

        if not self.operator_password_file.exists():
            self.operator_password_file.touch(mode=0o600)
            self.operator_password_file.write_text(secrets.token_hex(16) + "\n")
        with pyodbc.connect(self.odbc(database), autocommit=False) as admin:
            cur = admin.cursor()
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('dbq:prepare'))")  # test workers at once
            if not cur.execute("SELECT count(*) FROM pg_roles WHERE rolname = ?", OPERATOR_USER).fetchval():
                cur.execute(f"CREATE ROLE {OPERATOR_USER} LOGIN PASSWORD '{self.operator_password}'")
            cur.execute(f'GRANT CREATE ON DATABASE "{database}" TO {OPERATOR_USER}')
            for statement in helper_statements(OPERATOR_USER):
                cur.execute(statement)
            admin.commit()

    # --- lifecycle -------------------------------------------------------------------
    def _run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        user = "postgres" if os.geteuid() == 0 else None
        return subprocess.run(  # type: ignore[call-overload]
            argv, user=user, check=True, capture_output=True, text=True, cwd="/", **kw
        )

    def _prepare_dirs(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.parent.chmod(0o755)
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            shutil.chown(self.dir, pg.pw_uid, pg.pw_gid)

    def _initdb(self) -> None:
        self._prepare_dirs()
        pwfile = self.dir / "pwfile"
        password = secrets.token_hex(16)
        pwfile.write_text(password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            self._run(
                [
                    str(_pg_bindir() / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    PG_USER,
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--locale=C",
                ]
            )
        except subprocess.CalledProcessError as e:
            raise StackError(f"initdb failed:\n{e.stdout}\n{e.stderr}") from e
        finally:
            pwfile.unlink(missing_ok=True)
        self.password_file.touch(mode=0o600)
        self.password_file.write_text(password + "\n")

    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError, PermissionError):
            return None
        return pid if pid_alive(pid) else None

    def start(self) -> None:
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        if self.pid() is not None and port_open("127.0.0.1", PG_PORT):
            self.prepare()  # idempotent: a server started by an earlier version gets the operator's login
            self._serve_tls()  # and TLS
            return
        self._prepare_dirs()
        options = " ".join(
            [
                f"-p {PG_PORT}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.dir}",
                "-c max_connections=300",
                "-c shared_buffers=256MB",
                "-c max_prepared_transactions=0",
                "-c autovacuum_naptime=10s",
            ]
        )
        try:
            self._run(
                [
                    str(_pg_bindir() / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            )
        except subprocess.CalledProcessError as e:
            raise StackError(f"PostgreSQL did not start:\n{e.stderr}\n{log_tail(self.log)}") from e
        self.prepare()
        self._serve_tls()

    def _serve_tls(self) -> None:
        """TLS with the stack CA's certificate for this server (a copy its user owns, as the
        server demands of its key), set by ALTER SYSTEM: a server already running gets it at a
        reload. Plain connections stay possible (what a client's url says)."""
        import pyodbc

        cert, key = self.tls.server("postgres")
        copied = False
        for source, copy in ((cert, self.server_cert), (key, self.server_key)):
            if not copy.exists() or copy.read_bytes() != source.read_bytes():
                copy.write_bytes(source.read_bytes())
                copy.chmod(0o600)
                if os.geteuid() == 0:
                    shutil.chown(copy, "postgres", "postgres")
                copied = True
        wanted = {"ssl": "on", "ssl_cert_file": str(self.server_cert), "ssl_key_file": str(self.server_key)}
        names = ", ".join(f"'{name}'" for name in wanted)

        def settings() -> dict[str, str]:  # on a new session: the postmaster's, after a reload
            with pyodbc.connect(self.odbc(), autocommit=True) as admin:
                rows = admin.cursor().execute(
                    f"SELECT name, setting FROM pg_settings WHERE name IN ({names})"
                )
                return dict(rows.fetchall())

        if settings() == wanted and not copied:
            return
        with pyodbc.connect(self.odbc(), autocommit=True) as admin:
            for name, value in wanted.items():
                admin.cursor().execute(f"ALTER SYSTEM SET {name} = '{value}'")
            admin.cursor().execute("SELECT pg_reload_conf()")
        # The postmaster rereads its files a moment later.
        wait_until(lambda: settings() == wanted, timeout=10, what="PostgreSQL's TLS", log=self.log,
                   alive=lambda: self.pid() is not None)  # fmt: skip

    def stop(self) -> None:
        if self.pid() is None:
            return
        self._run([str(_pg_bindir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def ready(self) -> bool:
        return self.pid() is not None and port_open("127.0.0.1", PG_PORT)

    def describe(self) -> str:
        return (
            f"127.0.0.1:{PG_PORT} superuser {PG_USER} (password in {self.password_file}), operator {OPERATOR_USER}"
            f" (password in {self.operator_password_file}), ODBC driver {ODBC_DRIVER!r}"
        )
