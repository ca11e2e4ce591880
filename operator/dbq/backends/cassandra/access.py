"""Roles and grants on Cassandra (PasswordAuthenticator, CassandraAuthorizer) for the QueueUsers of
pipes queues, over the operator's session.

Each (queue, right) has a group role that cannot log in, holding SELECT and MODIFY on exactly the
tables `dbq.contract.access.PIPES_TABLES` names; a QueueUser's login role is a member of the
groups its spec gives. Groups are made and their grants put right when a QueueUser asks for them
(a table dropped and made again loses its grants: the next sync gives them back); a Queue's
groups go with the Queue. Role options are literals in CQL (no bind markers): the password is
quoted as a string literal, and Cassandra stores only its bcrypt hash.
"""

from __future__ import annotations

from typing import Any

from cassandra import InvalidRequest, Unauthorized
from cassandra.cluster import Session

from dbq.api.access import QUEUE_RIGHTS
from dbq.backends.cassandra.cql import literal
from dbq.connection import ConnectionSettings
from dbq.connection.cassandra import host_errors, translate
from dbq.contract.access import PIPES_TABLES, Right
from dbq.errors import DatabaseError, DbqError, InvalidQueueUser, QueueNotReady
from dbq.names import QueueNames, check_role, group_role, pg_quote

# A permission on a table as Cassandra lists it: ("SELECT" | "MODIFY", "<table ks.t>").
Permission = tuple[str, str]


def table_permissions(names: QueueNames, keeper: QueueNames | None, right: Right) -> frozenset[Permission]:
    """What the group of `right` on pipes queue `names` holds (`keeper`: the queue keeping its
    dead letters, None for its own table)."""
    reads, writes = PIPES_TABLES[right]

    def resource(table: str) -> str:
        if table == "dead":
            owner = keeper or names
            return f"<table {owner.schema}.{owner.dead}>"
        name = names.dead if table == "own_dead" else getattr(names, table)
        return f"<table {names.schema}.{name}>"

    return frozenset({("SELECT", resource(t)) for t in reads} | {("MODIFY", resource(t)) for t in writes})


def groups_of(database: str, names: QueueNames) -> list[str]:
    """The group roles of every right on the queue (dropped with it)."""
    return [group_role(database, names.schema, names.queue, right) for right in QUEUE_RIGHTS]


def _table(resource: str) -> str:
    """`<table ks.t>` as CQL: "ks"."t"."""
    keyspace, _, table = resource.removeprefix("<table ").removesuffix(">").partition(".")
    return f"{pg_quote(keyspace)}.{pg_quote(table)}"


class CassandraLogins:
    """QueueUsers' login roles and their queues' group roles on one cluster."""

    def __init__(self, session: Session, settings: ConnectionSettings) -> None:
        self.session = session
        self.settings = settings

    def _run(self, statement: str) -> list[Any]:
        """Run one statement (role statements take no bind markers: names are checked and quoted)."""
        try:
            return list(self.session.execute(statement))
        except Exception as e:
            raise self._error(e) from None

    def _error(self, e: Exception) -> DbqError:
        text = str(e)
        causes = [e, *host_errors(e)]
        where = self.settings.endpoint
        if "doesn't exist" in text and "<table" in text:
            missing = text[text.find("Resource") :].rstrip('"')[:200]
            return QueueNotReady(f"{where}: {missing}: its Queue is being made; retried")
        if "not supported by AllowAllAuthorizer" in text or "PASSWORD is not supported" in text:
            return InvalidQueueUser(
                f"{where}: Cassandra runs without authentication or authorization, so a role grants"
                " nothing: set authenticator PasswordAuthenticator and authorizer CassandraAuthorizer in"
                " cassandra.yaml (docs/dba/cassandra.md#logins)"
            )
        if any(isinstance(c, Unauthorized) for c in causes):
            return InvalidQueueUser(
                f"{where}: the operator's role {self.settings.username!r} may not manage roles and grants"
                f" ({text[:200]}): give it a superuser role, or CREATE, ALTER, DROP and AUTHORIZE on ALL ROLES"
                " and AUTHORIZE on the queues' keyspaces"
            )
        if "can only be changed every" in text:  # Cassandra 5's pause between password changes
            return DatabaseError(f"{where}: {text[text.find('Password') :][:200]}; retried")
        return translate(e, self.settings)

    # --- groups ---------------------------------------------------------------------------
    def ensure_group(self, group: str, wanted: frozenset[Permission]) -> None:
        """The group exists and holds exactly `wanted` on tables."""
        role = pg_quote(check_role(group))
        self._run(f"CREATE ROLE IF NOT EXISTS {role} WITH LOGIN = false")
        held = {(r[3], r[2]) for r in self._run(f"LIST ALL PERMISSIONS OF {role} NORECURSIVE")}
        for permission, resource in sorted(wanted - held):
            self._run(f"GRANT {permission} ON TABLE {_table(resource)} TO {role}")
        for permission, resource in sorted(held - wanted):
            if resource.startswith("<table "):
                self._run(f"REVOKE {permission} ON TABLE {_table(resource)} FROM {role}")

    def drop_groups(self, groups: list[str]) -> None:
        """Drop the groups (a queue's, as it goes); an operator that may not manage roles made
        none, and is not stopped by them."""
        try:
            for group in groups:
                self._run(f"DROP ROLE IF EXISTS {pg_quote(check_role(group))}")
        except InvalidQueueUser:
            return

    # --- logins (the methods of PgLogins) ---------------------------------------------------
    def set_login(self, login: str, password: str | None, connection_limit: int) -> None:
        """Create the login role, or set its password (None: keep it). Cassandra has no limit
        of connections per role. What `LIST ROLES` answers may be as old as the node's roles
        cache: a role found to exist only when its creation is refused gets the password too."""
        role = pg_quote(check_role(login))
        if password is None:
            return
        if not self.exists(login):
            try:
                self._run(f"CREATE ROLE {role} WITH LOGIN = true AND PASSWORD = {literal(password)}")
                return
            except DatabaseError as e:
                if "already exists" not in str(e):
                    raise
        self._run(f"ALTER ROLE {role} WITH PASSWORD = {literal(password)} AND LOGIN = true")

    def _roles_of(self, login: str) -> list[Any] | None:
        """`LIST ROLES OF` the login (itself and the roles granted to it: role, super, login,
        ...), or None when there is no such role."""
        try:
            return list(self.session.execute(f"LIST ROLES OF {pg_quote(check_role(login))} NORECURSIVE"))
        except InvalidRequest as e:
            if "doesn't exist" in str(e):
                return None
            raise self._error(e) from None
        except Exception as e:
            raise self._error(e) from None

    def exists(self, login: str) -> bool:
        roles = self._roles_of(login)
        return bool(roles) and any(r[0] == login and r[2] for r in roles or ())

    def groups(self, login: str) -> set[str]:
        return {r[0] for r in self._roles_of(login) or () if r[0] != login and r[0].startswith("dbq_r_")}

    def grant(self, login: str, group: str) -> None:
        """Make the login a member of the group (already one: nothing to do; `groups` may have
        answered from the roles cache)."""
        self._membership(
            f"GRANT {pg_quote(check_role(group))} TO {pg_quote(check_role(login))}", "is a member"
        )

    def revoke(self, login: str, group: str) -> None:
        self._membership(
            f"REVOKE {pg_quote(check_role(group))} FROM {pg_quote(check_role(login))}", "is not a member"
        )

    def _membership(self, statement: str, done: str) -> None:
        try:
            self._run(statement)
        except DatabaseError as e:
            if done not in str(e):
                raise

    def drop(self, login: str) -> int:
        """Drop the login role. Cassandra cannot end a role's open connections: their next
        request is refused once the node's role and permission caches expire. Returns 0 (no
        session was ended)."""
        self._run(f"DROP ROLE IF EXISTS {pg_quote(check_role(login))}")
        return 0
