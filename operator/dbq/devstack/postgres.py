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

from dbq.devstack.base import Paths, StackError, log_tail, pid_alive, port_open

PG_PORT = int(os.environ.get("DBQ_PG_PORT", "15432"))
PG_USER = "dbq"
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

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{PG_USER}:{self.password}@127.0.0.1:{PG_PORT}/{database}"

    def odbc(self, database: str = "postgres") -> str:
        return (
            f"DRIVER={{{ODBC_DRIVER}}};SERVER=127.0.0.1;PORT={PG_PORT};DATABASE={database};"
            f"UID={PG_USER};PWD={self.password}"
        )

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

    def stop(self) -> None:
        if self.pid() is None:
            return
        self._run([str(_pg_bindir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def ready(self) -> bool:
        return self.pid() is not None and port_open("127.0.0.1", PG_PORT)

    def describe(self) -> str:
        return f"127.0.0.1:{PG_PORT} user {PG_USER} (password in {self.password_file}), ODBC driver {ODBC_DRIVER!r}"
