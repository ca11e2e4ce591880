"""Session fixtures for the real components of the local stack.

A component that cannot start fails the test that needs it, with the component's log tail
in the message. Nothing is skipped: a missing component is a broken environment.
Components this session started are stopped at its end; ones already running are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dbq.devstack import Stack, StackError
from tests.local import KubeHandle, PgDatabase, kube_handle, local_spark, scratch_database


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


@pytest.fixture(scope="session")
def kube(stack: LocalStack) -> KubeHandle:
    stack.need("kube")
    return kube_handle(stack)


@pytest.fixture(scope="session")
def postgres(stack: LocalStack) -> Iterator[PgDatabase]:
    """A fresh database on the local PostgreSQL, dropped at the end of the session."""
    stack.need("postgres")
    with scratch_database(stack, "dbq_test") as database:
        yield database


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


def for_this_module(stack: LocalStack, name: str) -> Iterator[Any]:
    """An optional component, started for the module that asks for it (unless it runs already)
    and stopped after it."""
    started = not stack.component(name).ready()
    stack.need(name)
    yield stack.component(name)
    if started:
        stack.component(name).stop()
        stack.started.remove(name)


@pytest.fixture(scope="module")
def cassandra3(stack: LocalStack) -> Iterator[Any]:
    """The three-node Cassandra cluster on 127.0.0.2-4 (three JVMs would slow every later test
    on two cores)."""
    yield from for_this_module(stack, "cassandra3")


@pytest.fixture(scope="module")
def cluster(stack: LocalStack, kube: KubeHandle) -> Iterator[Any]:
    """The single-node cluster that runs pods (no other module meets its node)."""
    yield from for_this_module(stack, "cluster")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local-mode SparkSession on Java 17 (pyspark starts its own JVM)."""
    try:
        session = local_spark("local[2]", "dbq-tests", shuffle_partitions=4)
    except Exception as e:  # the JVM failed to start: say why, never skip
        pytest.fail(f"Spark could not start: {e}", pytrace=False)
    yield session
    session.stop()
