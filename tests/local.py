"""Handles on the local stack's components, for the test fixtures (`conftest.py`), the Spark
jobs the tests start (`spark_jobs.py`) and the benchmarks (`bench/`)."""

from __future__ import annotations

import fcntl
import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyodbc

from dbq.devstack import Paths, Stack

# node-postgres, installed by stack/bootstrap.sh (tests/node/package-lock.json): node finds it here.
CACHE = Path(os.environ.get("DBQ_CACHE", Path.home() / ".cache" / "dbq"))
NODE_MODULES = CACHE / "node" / "node_modules"
# PGMQ's Rust client's scenario, built by stack/bootstrap.sh (tests/rust/Cargo.lock).
CARGO_TARGET = CACHE / "cargo-target"


@contextmanager
def exclusive(what: str) -> Iterator[None]:
    """A lock on `what` held across every test process (the pytest-xdist workers): for the set-up
    that two processes must not do at once, such as starting a component or applying the CRD."""
    state = Paths.from_env().state
    state.mkdir(parents=True, exist_ok=True)
    with (state / f"{what}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class KubeHandle:
    kubeconfig: str
    operator_kubeconfig: str  # authenticates as the operator's RBAC identity
    api: Any  # kubernetes.client.ApiClient (admin)


def kube_handle(stack: Stack) -> KubeHandle:
    """The running API server's admin client and kubeconfigs (checked with a version call)."""
    from kubernetes import client, config

    from dbq.devstack.kube import OPERATOR_USER

    api = config.new_client_from_config(config_file=str(stack.kube.kubeconfig))
    client.VersionApi(api).get_code()
    with exclusive("kubeconfig"):  # written anew by each test process
        operator_kubeconfig = str(stack.kube.kubeconfig_for(OPERATOR_USER))
    return KubeHandle(kubeconfig=str(stack.kube.kubeconfig), operator_kubeconfig=operator_kubeconfig, api=api)


@dataclass
class PgDatabase:
    """A fresh database on the local PostgreSQL. `url` and `odbc` are the operator's login, as
    a Queue's Secret holds it in production (not a superuser); `admin_url` and `admin_odbc` the
    bootstrap superuser's, for what only a DBA does (making logins by hand, looking at any
    session)."""

    name: str
    url: str
    odbc: str
    admin_url: str = ""
    admin_odbc: str = ""
    ca: str = ""  # the stack CA's certificate (PEM), which a Secret's `ca` key holds: verified TLS

    def connect(self, autocommit: bool = True) -> pyodbc.Connection:
        return pyodbc.connect(self.odbc, autocommit=autocommit)

    def admin(self, autocommit: bool = True) -> pyodbc.Connection:
        return pyodbc.connect(self.admin_odbc, autocommit=autocommit)


@contextmanager
def scratch_database(stack: Stack, prefix: str) -> Iterator[PgDatabase]:
    """A new database on the running PostgreSQL, prepared for the operator's login as a DBA
    would (`Postgres.prepare`), dropped when the block ends."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with pyodbc.connect(stack.postgres.odbc(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    stack.postgres.prepare(name)
    try:
        yield PgDatabase(
            name=name,
            url=stack.postgres.operator_url(name),
            odbc=stack.postgres.operator_odbc(name),
            admin_url=stack.postgres.url(name),
            admin_odbc=stack.postgres.odbc(name),
            ca=stack.postgres.tls.ca_pem(),
        )
    finally:
        # A new connection: the fault tests restart the server meanwhile.
        with pyodbc.connect(stack.postgres.odbc(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def local_spark(master: str, app: str, shuffle_partitions: int) -> Any:
    """A local-mode SparkSession on Java 17 whose Python workers run this interpreter (with dbq
    and pyarrow), not `python3` from PATH."""
    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
