"""Session fixtures for the real components of the local stack.

A component that cannot start fails the test that needs it, with the component's log tail
in the message. Nothing is skipped: a missing component is a broken environment.
Components the run started are stopped at its end; ones already running are left alone.

`make test` runs the modules on two pytest-xdist workers (`-n 2`): each module runs whole on one
worker (GROUPS keeps some together); the modules that stop or restart a component every other
test needs, or are too heavy to share two cores (marked `serial`), run after, alone. Components
are started once, under a lock, by whichever worker first needs them, and stopped by the
controlling process when all are done.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dbq.devstack import COMPONENTS, OPTIONAL, Stack, StackError
from tests.local import KubeHandle, PgDatabase, exclusive, kube_handle, local_spark, scratch_database

# Modules that run together, on one worker: both use the single-node cluster, and one stops it.
GROUPS = {
    "test_cluster": "cluster",
    "test_helm_cluster": "cluster",
    "test_gitops_helm": "cluster",
    "test_keda": "cluster",
}
# The longest modules first, so that neither worker is left with a long one at the end.
LONGEST = ("test_helm_cluster", "test_cluster", "test_spark_queue", "test_operator",
           "test_contract", "test_upkeep", "test_pipes", "test_spark_health", "test_spark_status",
           "test_ring_client")  # fmt: skip


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = _module(item.nodeid)
        return LONGEST.index(module) if module in LONGEST else len(LONGEST)

    items.sort(key=rank)  # stable: the order within a module stays


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out whole modules (GROUPS joins some), in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return GROUPS.get(_module(nodeid), _module(nodeid))

    return ModuleScheduling(config, log)


# A file naming the components this run started, one a line: written by whichever process
# started one (a worker), read by the controlling process at the end.
STARTED = "DBQ_TEST_STARTED"


def _controller(config: pytest.Config) -> bool:
    """Whether this process controls the run (pytest-xdist's workers have `workerinput`)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config):  # before the workers start: they inherit the environment
        fd, path = tempfile.mkstemp(prefix="dbq-test-started-")
        os.close(fd)
        os.environ[STARTED] = path


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stops the components this run started, once every worker is done."""
    if _controller(session.config):
        record = Path(os.environ.pop(STARTED))
        started = set(record.read_text().split())
        record.unlink()
        stack = Stack()
        stack.down(
            tuple(name for name in COMPONENTS + OPTIONAL if name in started and stack.component(name).ready())
        )


class LocalStack(Stack):
    """The local stack, starting a component when a test needs it."""

    def need(self, name: str) -> None:
        component = self.component(name)
        with exclusive(f"start-{name}"):  # two workers may need it at once
            if component.ready():
                return
            try:
                component.start()
            except StackError as e:
                pytest.fail(f"{name} could not start: {e}", pytrace=False)
            with open(os.environ[STARTED], "a") as record:
                record.write(name + "\n")


@pytest.fixture(scope="session")
def stack() -> LocalStack:
    stack = LocalStack()
    stack.paths.state.mkdir(parents=True, exist_ok=True)
    stack.paths.state.chmod(0o755)
    return stack


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


@pytest.fixture(scope="module")
def own_postgres(stack: LocalStack) -> Iterator[PgDatabase]:
    """A fresh database for one module, for tests that count what happens in a whole database
    (sessions of a login) and must not see other modules' leftovers."""
    stack.need("postgres")
    with scratch_database(stack, "dbq_own") as database:
        yield database


@pytest.fixture(scope="session")
def cassandra(stack: LocalStack) -> Iterator[Any]:
    """A cassandra-driver Session connected to the local node."""
    stack.need("cassandra")
    from cassandra.cluster import Cluster

    from dbq.connection.cassandra import SCHEMA_CHANGE_TIMEOUT_S

    host, port = stack.cassandra.contact
    cluster = Cluster([host], port=port, auth_provider=stack.cassandra.auth.provider())
    session = cluster.connect()
    session.default_timeout = SCHEMA_CHANGE_TIMEOUT_S  # the tests change schemas by hand too
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
def flux(stack: LocalStack, kube: KubeHandle) -> Any:
    """Flux's controllers and its git server (`dbq dev up flux`), for the whole run: modules on
    both workers use it."""
    stack.need("flux")
    return stack.flux


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local-mode SparkSession on Java 17 (pyspark starts its own JVM)."""
    try:
        session = local_spark("local[2]", "dbq-tests", shuffle_partitions=4)
    except Exception as e:  # the JVM failed to start: say why, never skip
        pytest.fail(f"Spark could not start: {e}", pytrace=False)
    yield session
    session.stop()
