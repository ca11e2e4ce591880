"""Keeps a QueueUser's login, its memberships and its Secret as its spec says: read the
resources, plan (`dbq.controller.access_plan`), apply through the role helper
(`dbq.backends.postgres.access`), write the Secret and the status.

A password is made when the login or its Secret is missing, or the `dbq.dev/rotate` annotation
changes; it reaches the database only as a SCRAM verifier and the API only in the Secret.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from dbq.api.access import QUEUE_USER_PLURAL, ROTATE_ANNOTATION, secret_name
from dbq.api.models import PLURAL
from dbq.api.topics import TOPIC_PLURAL
from dbq.backends.cassandra.access import CassandraLogins
from dbq.backends.postgres.access import PgLogins, ensure_helper
from dbq.backends.sqlserver.access import MsLogins
from dbq.connection import ConnectionSettings, odbc
from dbq.connection.cassandra import open_session
from dbq.connection.tls import CA_KEY
from dbq.controller import conditions as cond
from dbq.controller.access_plan import AccessPlan, granted, parse_queue_user, plan_access
from dbq.controller.reconcile import Event
from dbq.errors import DbqError, InvalidQueueUser
from dbq.kube import Kube
from dbq.resource import SecretReader, settings_for

Resource = Mapping[str, Any]
Poster = Callable[[Resource, Event], None]


# One sync of a QueueUser at a time in this process (its change handler and its drift timer may
# fire together): two syncs that both set a password would leave the Secret holding the one the
# database no longer has. Only the leader syncs, so a lock in the process is enough.
_SYNCING: dict[tuple[str, str], threading.Lock] = {}
_SYNCING_GUARD = threading.Lock()


def _one_at_a_time(namespace: str, name: str) -> threading.Lock:
    with _SYNCING_GUARD:
        return _SYNCING.setdefault((namespace, name), threading.Lock())


@contextmanager
def logins_on(admin: ConnectionSettings) -> Iterator[PgLogins | MsLogins | CassandraLogins]:
    """The logins of the database `admin` reaches: PostgreSQL's through the role helper (checked
    first), SQL Server's contained users, Cassandra's roles. On PostgreSQL and SQL Server what
    is done commits as one transaction when the block ends, and is rolled back if it raises."""
    if admin.backend == "cassandra":
        cluster, session = open_session(admin)
        try:
            yield CassandraLogins(session, admin)
        finally:
            cluster.shutdown()
        return
    conn = odbc.connect(admin)
    try:
        conn.autocommit = False
        cur = conn.cursor()
        if admin.backend == "sqlserver":
            yield MsLogins(cur)
        else:
            ensure_helper(cur, admin.database, admin.username)
            yield PgLogins(cur)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


@dataclass
class Synced:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    error: DbqError | None = None


def user_secret(plan: AccessPlan, password: str) -> dict[str, str]:
    """The Secret's string data: the login's url (the operator's url options kept, such as
    sslmode), its parts, the CA the operator's Secret gives (`ca`: the login verifies the server
    as the operator does), and the queues and topics it may use with their database names."""
    a = plan.admin
    options = a.options | ({"driver": a.driver} if a.driver else {})
    query = f"?{urlencode(options)}" if options else ""
    scheme = {"sqlserver": "mssql", "cassandra": "cassandra"}.get(a.backend, "postgresql")
    credentials = f"{quote(plan.login, safe='')}:{quote(password, safe='')}"
    url = f"{scheme}://{credentials}@{a.host}:{a.port}/{quote(a.database)}"
    entities: dict[str, dict[str, dict[str, Any]]] = {"queues": {}, "topics": {}}
    for g in plan.grants:
        entry = entities[f"{g.kind}s"].setdefault(
            g.name, {"schema": g.schema, "name": g.entity, "rights": []}
        )
        entry["rights"].append(str(g.right))
    return {
        "url": url + query,
        "username": plan.login,
        "password": password,
        "host": a.host,
        "port": str(a.port),
        "database": a.database,
        "queues": json.dumps(entities["queues"], sort_keys=True),
        "topics": json.dumps(entities["topics"], sort_keys=True),
    } | ({CA_KEY: a.ca} if a.ca else {})


class QueueUserSync:
    def __init__(self, kube: Kube, read_secret: SecretReader, post: Poster) -> None:
        self.kube = kube
        self.read_secret = read_secret
        self.post = post

    def _plan(self, resource: Resource, existing_only: bool = False) -> AccessPlan:
        """The plan; with `existing_only` (deletion), of the Queues and Topics still there."""
        meta = resource["metadata"]
        namespace = meta["namespace"]
        spec = parse_queue_user(resource.get("spec") or {})
        queues = {q["metadata"]["name"]: q for q in self.kube.list_resources(PLURAL, namespace)}
        topics = {t["metadata"]["name"]: t for t in self.kube.list_resources(TOPIC_PLURAL, namespace)}
        if existing_only:
            spec.queues = [q for q in spec.queues if q.name in queues]
            spec.topics = [t for t in spec.topics if t.name in topics]
            if not spec.queues and not spec.topics:
                raise InvalidQueueUser("none of the Queues and Topics it names is left")

        def settings_of(spec: Any, ns: str) -> ConnectionSettings:
            return settings_for(spec, ns, self.read_secret)

        return plan_access(namespace, meta["name"], spec, queues, topics, settings_of)

    def sync(self, resource: Resource) -> Synced:
        meta, status = resource["metadata"], dict(resource.get("status") or {})
        namespace, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        out = Synced()
        try:
            plan = self._plan(resource)
            with _one_at_a_time(namespace, name):
                out.status = self._apply(resource, plan, out.events)
            ready = (True, "Granted", f"login {plan.login} holds every right its spec gives")
        except DbqError as e:
            out.error = e
            out.status = {}
            ready = (False, e.reason, str(e))
        conditions = cond.set_condition(status.get("conditions"), cond.READY, *ready, generation)
        out.status |= {"observedGeneration": generation, "conditions": cond.settled(conditions, out.error)}
        self.kube.patch_status(QUEUE_USER_PLURAL, namespace, name, out.status)
        for event in out.events:
            self.post(resource, event)
        return out

    def _apply(self, resource: Resource, plan: AccessPlan, events: list[Event]) -> dict[str, Any]:
        meta, status = resource["metadata"], resource.get("status") or {}
        namespace, name = meta["namespace"], meta["name"]
        secret = secret_name(name)
        rotation = str((meta.get("annotations") or {}).get(ROTATE_ANNOTATION, ""))
        with logins_on(plan.admin) as logins:
            if isinstance(logins, CassandraLogins):  # a pipes queue's groups are made on demand
                for g in plan.grants:
                    logins.ensure_group(g.group, g.tables)
            exists = logins.exists(plan.login)
            secret_missing = self.read_secret(namespace, secret) is None
            rotate = not exists or secret_missing or rotation != (status.get("rotation") or "")
            password = secrets.token_urlsafe(32) if rotate else None
            logins.set_login(plan.login, password, plan.connection_limit)
            held = frozenset(logins.groups(plan.login))
            missing = plan.groups - held
            for group in sorted(missing):
                logins.grant(plan.login, group)
            for group in sorted(held - plan.groups):
                logins.revoke(plan.login, group)
        now = cond.now_iso()
        if password is not None:
            self.kube.write_secret(namespace, secret, user_secret(plan, password), owner=resource)
            why = (
                "created" if not exists else "its Secret was missing" if secret_missing else "rotation asked"
            )
            events.append(
                Event("Normal", "Rotated", f"login {plan.login}: new password ({why}), Secret {secret}")
            )
        for g in plan.grants:
            if g.group in missing:
                events.append(
                    Event("Normal", "Granted", f"{g.right} on {g.kind} {g.name} to login {plan.login}")
                )
        if held - plan.groups:
            events.append(Event("Normal", "Revoked", f"{len(held - plan.groups)} right(s) no longer in the spec"
                                f" revoked from login {plan.login}"))  # fmt: skip
        return {
            "login": plan.login,
            "secretName": secret,
            "endpoint": plan.admin.endpoint,
            "granted": granted(plan, plan.groups),
            "rotatedAt": now if password is not None else status.get("rotatedAt"),
            "rotation": rotation,
        }

    def delete(self, resource: Resource) -> str | None:
        """Drop the login: what became of its open sessions (PostgreSQL and SQL Server end them
        first); None when no Queue or Topic it names is left to reach its database by (nothing
        to drop it with)."""
        try:
            plan = self._plan(resource, existing_only=True)
        except DbqError:
            return None
        meta = resource["metadata"]
        with _one_at_a_time(meta["namespace"], meta["name"]), logins_on(plan.admin) as logins:
            ended = logins.drop(plan.login)
        if plan.admin.backend == "cassandra":
            return "Cassandra ends no connection: each is refused at its next request once the node's role caches expire"
        return f"{ended} open session(s) ended"
