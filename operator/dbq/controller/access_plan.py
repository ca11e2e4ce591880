"""What a QueueUser should be in its database, from its spec and the Queues and Topics it names:
a pure function, unit-tested without a database or an API server.

The login is `dbq.names.login_role(namespace, name)`; it should be a member of exactly the group
role of each (queue or topic, right) its spec gives, all on one database (or Cassandra cluster),
reached with the Secret of the first Queue or Topic it names (the operator's credentials). A
pipes queue's groups are made with the login, holding the table permissions each right needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dbq.api.access import QueueUserSpec
from dbq.api.models import queue_name
from dbq.api.topics import TopicSpec, topic_name
from dbq.backends.cassandra.access import Permission, table_permissions
from dbq.connection import ConnectionSettings
from dbq.contract.access import Right
from dbq.errors import InvalidQueueUser, InvalidSpec
from dbq.names import QueueNames, group_role, login_role
from dbq.resource import dead_letter_keeper, parse_spec, validation_message

Resource = Mapping[str, Any]
# The connection a Queue's or Topic's spec names (its Secret, read).
SettingsOf = Callable[[Any, str], ConnectionSettings]


@dataclass(frozen=True)
class Grant:
    """One right on one queue or topic, and the group role that holds it in the database."""

    kind: str  # queue | topic
    name: str  # metadata.name
    right: Right
    group: str
    schema: str
    entity: str  # the queue's or topic's name in the database
    # Pipes (Cassandra): the table permissions the group holds; ring groups hold EXECUTE on
    # routines, granted when the queue is provisioned.
    tables: frozenset[Permission] = frozenset()


@dataclass(frozen=True)
class AccessPlan:
    login: str
    admin: ConnectionSettings  # the operator's connection to the database
    grants: tuple[Grant, ...]
    connection_limit: int

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(g.group for g in self.grants)


def parse_queue_user(raw: Mapping[str, Any]) -> QueueUserSpec:
    try:
        return QueueUserSpec.model_validate(dict(raw))
    except ValidationError as e:
        raise InvalidSpec(validation_message(e)) from None


def plan_access(
    namespace: str,
    name: str,
    spec: QueueUserSpec,
    queues: Mapping[str, Resource],
    topics: Mapping[str, Resource],
    settings_of: SettingsOf,
) -> AccessPlan:
    """The plan, or InvalidQueueUser naming the field when the spec cannot be had: a Queue or
    Topic not in the namespace, one whose design has no rights here, or two databases."""
    grants: list[Grant] = []
    admin: ConnectionSettings | None = None
    first = ""
    for i, grant in enumerate(spec.queues):
        field = f"spec.queues[{i}].name"
        found = _found(field, grant.name, "Queue", queues, "Topic", topics, namespace)
        queue_spec = parse_spec(found.get("spec") or {})
        if str(queue_spec.design) == "servicebroker":
            raise InvalidQueueUser(
                f"{field}: Queue {grant.name} is a Service Broker queue: QueueUsers give rights on ring"
                " queues (PostgreSQL, SQL Server) and pipes queues (Cassandra); Service Broker queues' roles"
                " are made but not given to QueueUsers yet"
            )
        settings = settings_of(queue_spec, namespace)
        admin, first = _same_database(admin, first, settings, field, grant.name)
        entity = queue_name(grant.name, queue_spec)
        schema = queue_spec.connection.schema_
        pipes = str(queue_spec.design) == "pipes"
        keeper = (
            dead_letter_keeper(grant.name, namespace, queue_spec, lambda _, n: queues.get(n))
            if pipes
            else None
        )
        for right in dict.fromkeys(grant.rights):
            group = group_role(settings.database, schema, entity, right)
            tables = (
                table_permissions(QueueNames(schema, entity), keeper, Right(right)) if pipes else frozenset()
            )
            grants.append(Grant("queue", grant.name, Right(right), group, schema, entity, tables))
    for i, topic_grant in enumerate(spec.topics):
        field = f"spec.topics[{i}].name"
        found = _found(field, topic_grant.name, "Topic", topics, "Queue", queues, namespace)
        try:
            t_spec = TopicSpec.model_validate(found.get("spec") or {})
            entity = topic_name(topic_grant.name, t_spec)
        except ValueError as e:
            raise InvalidQueueUser(f"{field}: Topic {topic_grant.name} is invalid: {e}") from None
        if str(t_spec.backend) != "postgres":
            raise InvalidQueueUser(f"{field}: Topic {topic_grant.name} is on {t_spec.backend}: QueueUsers give"
                                   " rights on postgres topics")  # fmt: skip
        settings = settings_of(t_spec, namespace)
        admin, first = _same_database(admin, first, settings, field, topic_grant.name)
        schema = t_spec.connection.schema_
        group = group_role(settings.database, schema, f"topic:{entity}", Right.PUBLISH)
        grants.append(Grant("topic", topic_grant.name, Right.PUBLISH, group, schema, entity))
    assert admin is not None  # the spec names at least one queue or topic
    return AccessPlan(login_role(namespace, name), admin, tuple(grants), spec.connection_limit)


def _found(
    field: str, name: str, kind: str, of_kind: Mapping[str, Resource], other: str,
    of_other: Mapping[str, Resource], namespace: str,
) -> Resource:  # fmt: skip
    """The resource `name` of `kind`, or InvalidQueueUser naming the field (and the list it
    belongs in, when it is of the `other` kind)."""
    found = of_kind.get(name)
    if found is not None:
        return found
    if name in of_other:
        raise InvalidQueueUser(f"{field}: {name} is a {other}: list it under spec.{other.lower()}s")
    raise InvalidQueueUser(
        f"{field}: there is no {kind} {name} in namespace {namespace}: create it, or fix the name"
    )


def _same_database(
    admin: ConnectionSettings | None, first: str, settings: ConnectionSettings, field: str, name: str
) -> tuple[ConnectionSettings, str]:
    if admin is None:
        return settings, name
    if (admin.backend, admin.host, admin.port, admin.database) != (
        settings.backend, settings.host, settings.port, settings.database
    ):  # fmt: skip
        raise InvalidQueueUser(
            f"{field}: {name} is on {settings.endpoint} and {first} on {admin.endpoint}: one QueueUser is one"
            " login on one database; make a QueueUser per database"
        )
    return admin, first


def granted(plan: AccessPlan, held: frozenset[str]) -> list[dict[str, Any]]:
    """status.granted: the rights held now (groups the login is a member of), per queue and topic."""
    out: dict[tuple[str, str], list[str]] = {}
    for g in plan.grants:
        rights = out.setdefault((g.kind, g.name), [])
        if g.group in held:
            rights.append(str(g.right))
    return [{"kind": kind, "name": name, "rights": rights} for (kind, name), rights in out.items()]
