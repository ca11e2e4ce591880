"""The local stack dbq is developed and tested on: a real Kubernetes API server (with etcd),
PostgreSQL, Cassandra, and Spark in local mode (no server; pyspark starts its own JVM); when
named, a three-node Cassandra cluster, a single-node Kubernetes cluster that runs pods, and Flux
(its controllers and a git server) for GitOps.

`dbq dev up | down | status` drives it; the pytest fixtures call the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dbq.devstack.base import Paths, StackError
from dbq.devstack.cassandra import Cassandra, CassandraCluster
from dbq.devstack.cluster import Cluster
from dbq.devstack.flux import Flux
from dbq.devstack.keda import Keda
from dbq.devstack.kube import Kube
from dbq.devstack.postgres import Postgres

__all__ = [
    "COMPONENTS",
    "OPTIONAL",
    "Cassandra",
    "CassandraCluster",
    "Cluster",
    "Flux",
    "Kube",
    "Paths",
    "Postgres",
    "Stack",
    "StackError",
]

COMPONENTS = ("kube", "postgres", "cassandra")  # what `dbq dev up` starts without arguments
OPTIONAL = ("cassandra3", "cluster", "flux", "keda")  # started when named: `dbq dev up cluster keda`
Component = Kube | Postgres | Cassandra | CassandraCluster | Cluster | Flux | Keda


@dataclass
class Stack:
    paths: Paths = field(default_factory=Paths.from_env)

    def __post_init__(self) -> None:
        self.kube = Kube(self.paths)
        self.postgres = Postgres(self.paths)
        self.cassandra = Cassandra(self.paths)
        self.cassandra3 = CassandraCluster(self.paths)
        self.cluster = Cluster(self.paths, self.kube)
        self.flux = Flux(self.paths, self.kube)
        self.keda = Keda(self.paths, self.cluster)

    def component(self, name: str) -> Component:
        if name not in COMPONENTS + OPTIONAL:
            raise StackError(f"unknown component {name!r}; choose from {', '.join(COMPONENTS + OPTIONAL)}")
        value: Component = getattr(self, name)
        return value

    def up(self, names: tuple[str, ...] = COMPONENTS) -> None:
        self.paths.state.mkdir(parents=True, exist_ok=True)
        self.paths.state.chmod(0o755)
        for name in names:
            self.component(name).start()

    def down(self, names: tuple[str, ...] = COMPONENTS) -> None:
        for name in reversed(names):
            self.component(name).stop()

    def status(self) -> list[tuple[str, bool, str]]:
        return [(n, self.component(n).ready(), self.component(n).describe()) for n in COMPONENTS + OPTIONAL]
