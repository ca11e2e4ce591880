"""Cassandra on loopback, run from the Maven Central jars that stack/bootstrap.sh resolves with
`mvn dependency:copy-dependencies`: one node (`cassandra`, 127.0.0.1) for most tests, and a
three-node cluster (`cassandra3`, 127.0.0.2-4, its own cluster name) for replication and fault
tests. Every node listens on its own address with the same ports.

Nobody gets in without a password: each cluster runs Cassandra's PasswordAuthenticator and
CassandraAuthorizer, and at its first start the stack makes a superuser of its own, `dbq`, with a
generated password (kept in the state directory), and takes login and superuser from Cassandra's
default `cassandra` role. `url()` is the superuser's: what an operator's Secret holds. TLS is
offered on the CQL port (optional: plain clients still connect)."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dbq.devstack.base import ManagedProcess, Paths, StackError, port_open, wait_until
from dbq.devstack.tls import StackTls

CASSANDRA_VERSION = os.environ.get("CASSANDRA_VERSION", "5.0.9")
CQL_PORT = int(os.environ.get("DBQ_CQL_PORT", "19042"))
STORAGE_PORT = CQL_PORT - 2042  # 17000 by default

# Java 17 needs these module openings for Cassandra's internals (off-heap memory,
# direct buffers, the chronicle and jamm libraries).
_JAVA17_OPENS = [
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports=java.sql/java.sql=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED",
    *(
        f"--add-opens=java.base/{pkg}=ALL-UNNAMED"
        for pkg in (
            "java.lang",
            "java.lang.module",
            "java.lang.reflect",
            "java.io",
            "java.math",
            "java.net",
            "java.nio",
            "java.util",
            "java.util.concurrent",
            "java.util.concurrent.atomic",
            "jdk.internal.loader",
            "jdk.internal.math",
            "jdk.internal.module",
            "jdk.internal.ref",
            "jdk.internal.reflect",
            "jdk.internal.util.jar",
            "sun.nio.ch",
        )
    ),
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
]


def _java() -> str:
    home = os.environ.get("DBQ_JAVA_HOME") or "/usr/lib/jvm/java-17-openjdk-amd64"
    java = Path(home) / "bin" / "java"
    if java.exists():
        return str(java)
    found = shutil.which("java")
    if not found:
        raise StackError("java not found: Cassandra needs Java 17")
    return found


class CassandraAuth:
    """A cluster's superuser: the stack's own (`dbq`, its password generated at the first start)
    in place of Cassandra's default one (cassandra/cassandra, left without login)."""

    USER = "dbq"
    DEFAULT = ("cassandra", "cassandra")

    def __init__(self, folder: Path) -> None:
        self.password_file = folder / "superuser-password"

    @property
    def password(self) -> str:
        if not self.password_file.exists():
            self.password_file.parent.mkdir(parents=True, exist_ok=True)
            self.password_file.touch(mode=0o600)
            self.password_file.write_text(secrets.token_hex(16))
        return self.password_file.read_text().strip()

    def provider(self) -> Any:
        from cassandra.auth import PlainTextAuthProvider

        return PlainTextAuthProvider(self.USER, self.password)

    def answers(self, address: str) -> bool:
        """Whether the node at `address` answers CQL: a query as the superuser runs, or the node
        refuses the login (the superuser not made yet: a node of a new cluster makes its default
        role only once every node it knows is up)."""
        return _query(address, self.USER, self.password) != DOWN

    def ensure(self, address: str, replicas: int) -> None:
        """Make the superuser (its roles on `replicas` nodes), and take login from the default
        one; waits up to a minute for the cluster to make its default role."""
        if _query(address, self.USER, self.password) == ANSWERED:
            return
        cql = [
            f"ALTER KEYSPACE system_auth WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {replicas}}}",
            f"CREATE ROLE IF NOT EXISTS {self.USER} WITH SUPERUSER = true AND LOGIN = true AND PASSWORD = '{self.password}'",
        ]
        # Tried again: the default role may not be made yet, and on a new cluster it lives on one
        # node until a read at quorum repairs it onto others (a read that may ask two without it).
        if not _tries(lambda: _query(address, *self.DEFAULT, cql) == ANSWERED):
            raise StackError(f"Cassandra at {address} took neither the stack's superuser nor the default one")
        disable = ["ALTER ROLE cassandra WITH SUPERUSER = false AND LOGIN = false"]
        if not _tries(lambda: _query(address, self.USER, self.password, disable) == ANSWERED):
            raise StackError(f"Cassandra at {address}: the superuser {self.USER} made cannot log in")


ANSWERED, REFUSED, DOWN = "answered", "refused", "down"


def _tries(attempt: Callable[[], bool], seconds: int = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if attempt():
            return True
        time.sleep(1)
    return attempt()


def _query(address: str, user: str, password: str, cql: list[str] | None = None) -> str:
    """Run `cql` (by default a read of the node's version) as `user` on `address` alone: ANSWERED,
    REFUSED (the login, or a statement) or DOWN."""
    from cassandra import AuthenticationFailed, DriverException
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import WhiteListRoundRobinPolicy

    from dbq.connection.cassandra import host_errors

    if not port_open(address, CQL_PORT):
        return DOWN
    only_this = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy([address]), request_timeout=60
    )
    cluster = Cluster([address], port=CQL_PORT, connect_timeout=3, protocol_version=4,
                      auth_provider=PlainTextAuthProvider(user, password),
                      execution_profiles={EXEC_PROFILE_DEFAULT: only_this})  # fmt: skip
    try:
        session = cluster.connect()
        for statement in cql or ["SELECT release_version FROM system.local"]:
            session.execute(statement)
        return ANSWERED
    except NoHostAvailable as e:
        refused = any(isinstance(v, AuthenticationFailed) for v in host_errors(e))
        return REFUSED if refused else DOWN
    except DriverException:
        return REFUSED
    except OSError:
        return DOWN
    finally:
        cluster.shutdown()


class CassandraNode:
    """One node: `name` is its state directory, `address` the loopback address it listens on,
    `auth` its cluster's superuser (its own, for a node alone)."""

    def __init__(
        self, paths: Paths, name: str = "cassandra", address: str = "127.0.0.1", *,
        cluster: str = "dbq-local", seed: str = "127.0.0.1", heap: str = "768m", ring_delay_ms: int = 100,
        auth: CassandraAuth | None = None,
    ) -> None:  # fmt: skip
        self.auth = auth or CassandraAuth(paths.state / name)
        self.alone = auth is None
        self.name = name
        self.address = address
        self.cluster = cluster
        self.seed = seed
        self.heap = os.environ.get("DBQ_CASSANDRA_HEAP", heap)
        # How long gossip waits for peers. A lone node has none, so 100 ms; a node of a cluster
        # that restarts must hear from its peers within it ("Unable to gossip with any peers").
        self.ring_delay_ms = ring_delay_ms
        # The marker names the node's own config, so one node's pid is never taken for another's.
        self.proc = ManagedProcess(name, paths.state, marker=f"-Dcassandra.storagedir={paths.state / name} ")
        self.lib = paths.cache / f"cassandra-{CASSANDRA_VERSION}" / "lib"
        self.tls = StackTls(paths)

    @property
    def dir(self) -> Path:
        return self.proc.dir

    @property
    def contact(self) -> tuple[str, int]:
        return (self.address, CQL_PORT)

    def url(self, options: str = "") -> str:
        """The superuser's url (`options`: a query string, without `?`)."""
        return _url(self.auth, self.address, options)

    def _write_config(self) -> Path:
        d = self.dir
        for sub in ("data", "commitlog", "saved_caches", "hints", "cdc_raw"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        conf = d / "conf"
        conf.mkdir(exist_ok=True)
        # TLS on the CQL port, with the stack CA's certificate; plain clients still connect.
        keystore, keystore_password = self.tls.keystore("cassandra")
        (conf / "cassandra.yaml").write_text(
            f"""cluster_name: {self.cluster}
num_tokens: 16
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
data_file_directories: [{d / "data"}]
commitlog_directory: {d / "commitlog"}
saved_caches_directory: {d / "saved_caches"}
hints_directory: {d / "hints"}
cdc_raw_directory: {d / "cdc_raw"}
commitlog_sync: periodic
commitlog_sync_period: 10000ms
commitlog_segment_size: 16MiB
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{self.seed}:{STORAGE_PORT}"
listen_address: {self.address}
rpc_address: {self.address}
auto_bootstrap: false
storage_port: {STORAGE_PORT}
native_transport_port: {CQL_PORT}
start_native_transport: true
endpoint_snitch: SimpleSnitch
authenticator: PasswordAuthenticator
authorizer: CassandraAuthorizer
role_manager: CassandraRoleManager
client_encryption_options:
  enabled: true
  optional: true
  keystore: {keystore}
  keystore_password: {keystore_password}
  store_type: PKCS12
  require_client_auth: false
concurrent_reads: 8
concurrent_writes: 8
concurrent_counter_writes: 8
memtable_allocation_type: heap_buffers
disk_access_mode: mmap_index_only
auto_snapshot: false
"""
        )
        (conf / "logback.xml").write_text(
            """<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level [%thread] %logger{20} %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
</configuration>
"""
        )
        return conf

    def start(self) -> None:
        if self.proc.pid() is None:
            if not (self.lib / f"cassandra-all-{CASSANDRA_VERSION}.jar").exists():
                raise StackError(f"{self.lib} is missing: run `bash stack/bootstrap.sh`")
            conf = self._write_config()
            self.proc.start(
                [
                    _java(),
                    f"-Xms{self.heap}",
                    f"-Xmx{self.heap}",
                    "-Xss512k",
                    "-XX:+UseG1GC",
                    "-XX:+ExitOnOutOfMemoryError",
                    "-Djava.net.preferIPv4Stack=true",
                    "-Djdk.attach.allowAttachSelf=true",
                    "-Dcassandra-foreground=yes",
                    f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
                    f"-Dlogback.configurationFile={conf / 'logback.xml'}",
                    f"-Dcassandra.storagedir={self.dir}",
                    f"-Dcassandra.logdir={self.dir}",
                    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
                    f"-Dcassandra.ring_delay_ms={self.ring_delay_ms}",
                    "-Dcassandra.superuser_setup_delay_ms=0",
                    *_JAVA17_OPENS,
                    "-cp",
                    f"{conf}:{self.lib}/*",
                    "org.apache.cassandra.service.CassandraDaemon",
                ]
            )
        wait_until(
            self._cql_answers,
            timeout=240,
            what=self.name,
            log=self.proc.log,
            alive=self.proc.running,
        )
        if self.alone:
            self.auth.ensure(self.address, replicas=1)

    def stop(self) -> None:
        self.proc.stop(grace=30)

    def ready(self) -> bool:
        """A CQL query answers as the superuser, through cassandra-driver (not just an open port)."""
        return (
            self.proc.pid() is not None
            and _query(self.address, self.auth.USER, self.auth.password) == ANSWERED
        )

    def _cql_answers(self) -> bool:
        return self.auth.answers(self.address)

    def describe(self) -> str:
        return (
            f"CQL {self.address}:{CQL_PORT} (Cassandra {CASSANDRA_VERSION}), superuser {self.auth.USER}"
            f" (password in {self.auth.password_file}), TLS offered"
        )


Cassandra = CassandraNode  # the one-node component: `cassandra`, on 127.0.0.1


class CassandraCluster:
    """Three nodes on 127.0.0.2-4 with small heaps, started one after the other (an empty
    cluster, so no node streams data when it joins)."""

    name = "cassandra3"

    def __init__(self, paths: Paths) -> None:
        addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
        self.auth = CassandraAuth(paths.state / "cassandra3-1")
        self.nodes = [
            CassandraNode(
                paths,
                f"cassandra3-{i + 1}",
                address,
                cluster="dbq-local-3",
                seed=addresses[0],
                heap="512m",
                ring_delay_ms=10_000,
                auth=self.auth,
            )
            for i, address in enumerate(addresses)
        ]

    @property
    def hosts(self) -> str:
        """The contact points, as a cassandra:// url writes them."""
        return ",".join(n.address for n in self.nodes)

    @property
    def contact(self) -> tuple[str, int]:
        return (self.nodes[0].address, CQL_PORT)

    def url(self, options: str = "") -> str:
        """The superuser's url, naming the three nodes."""
        return _url(self.auth, self.hosts, options)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        self.auth.ensure(self.nodes[0].address, replicas=len(self.nodes))

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def ready(self) -> bool:
        return all(n.ready() for n in self.nodes)

    def describe(self) -> str:
        return (
            f"CQL {self.hosts} port {CQL_PORT} (3 nodes, Cassandra {CASSANDRA_VERSION}), superuser"
            f" {self.auth.USER} (password in {self.auth.password_file})"
        )


def _url(auth: CassandraAuth, hosts: str, options: str) -> str:
    return f"cassandra://{auth.USER}:{auth.password}@{hosts}:{CQL_PORT}" + (f"?{options}" if options else "")
