"""Session fixtures for the real components of the local stack.

A component that cannot start fails the test that needs it, with the component's log tail
in the message. Nothing is skipped: a missing component is a broken environment.
Components this session started are stopped at its end; ones already running are left alone.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyodbc
import pytest

from dbq.devstack import Stack, StackError


class LocalStack(Stack):
    """The local stack, remembering which components this test session started."""

    started: list[str]

    def need(self, name: str) -> None:
        component = self.component(name)
        if component.ready():
            return
        try:
            component.start()
        except StackError as e:
            pytest.fail(f"{name} could not start: {e}", pytrace=False)
        self.started.append(name)


@pytest.fixture(scope="session")
def stack() -> Iterator[LocalStack]:
    stack = LocalStack()
    stack.started = []
    stack.paths.state.mkdir(parents=True, exist_ok=True)
    stack.paths.state.chmod(0o755)
    yield stack
    stack.down(tuple(stack.started))


@dataclass
class KubeHandle:
    kubeconfig: str
    operator_kubeconfig: str  # authenticates as the operator's RBAC identity
    api: Any  # kubernetes.client.ApiClient (admin)


@pytest.fixture(scope="session")
def kube(stack: LocalStack) -> KubeHandle:
    stack.need("kube")
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(stack.kube.kubeconfig))
    client.VersionApi(api).get_code()
    from dbq.devstack.kube import OPERATOR_USER

    return KubeHandle(
        kubeconfig=str(stack.kube.kubeconfig),
        operator_kubeconfig=str(stack.kube.kubeconfig_for(OPERATOR_USER)),
        api=api,
    )


@dataclass
class PgDatabase:
    """A fresh database on the local PostgreSQL, dropped at the end of the session."""

    name: str
    url: str
    odbc: str

    def connect(self, autocommit: bool = True) -> pyodbc.Connection:
        return pyodbc.connect(self.odbc, autocommit=autocommit)


@pytest.fixture(scope="session")
def postgres(stack: LocalStack) -> Iterator[PgDatabase]:
    stack.need("postgres")
    name = f"dbq_test_{secrets.token_hex(4)}"
    with pyodbc.connect(stack.postgres.odbc(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield PgDatabase(name=name, url=stack.postgres.url(name), odbc=stack.postgres.odbc(name))
    # A new connection: the fault tests restart the server meanwhile.
    with pyodbc.connect(stack.postgres.odbc(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def cassandra(stack: LocalStack) -> Iterator[Any]:
    """A cassandra-driver Session connected to the local node."""
    stack.need("cassandra")
    from cassandra.cluster import Cluster

    host, port = stack.cassandra.contact
    cluster = Cluster([host], port=port)
    session = cluster.connect()
    yield session
    cluster.shutdown()


@pytest.fixture(scope="module")
def cassandra3(stack: LocalStack) -> Iterator[Any]:
    """The three-node Cassandra cluster on 127.0.0.2-4, started for the module that asks for it
    and stopped after it (three JVMs would slow every later test on two cores)."""
    started = not stack.cassandra3.ready()
    stack.need("cassandra3")
    yield stack.cassandra3
    if started:
        stack.cassandra3.stop()
        stack.started.remove("cassandra3")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local-mode SparkSession on Java 17 (pyspark starts its own JVM)."""
    import os

    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    # Python workers (data sources, UDFs) start this interpreter, not `python3` from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("dbq-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
    except Exception as e:  # the JVM failed to start: say why, never skip
        pytest.fail(f"Spark could not start: {e}", pytrace=False)
    yield session
    session.stop()
