"""The one place that picks a SQL dialect for a ring queue: PostgreSQL or SQL Server."""

from __future__ import annotations

from typing import Protocol

from dbq.backends import ring_sql as ring_sql_base
from dbq.backends.base import InvalidSpec
from dbq.backends.names import QueueNames
from dbq.backends.ring_plan import RingTarget


class RingSql(Protocol):
    """What the backend and the client need of a dialect (see PgRing and MsRing)."""

    ROUTINES: tuple[str, ...]
    OBSERVE_SCHEMA: str
    OBSERVE_RELATIONS: str
    OBSERVE_ROUTINES: str
    ring: str

    def step_sql(self, action: str) -> list[str]: ...
    def observe_recorded(self) -> str: ...
    def advisory_lock(self) -> str: ...
    def call(self, verb: str) -> str: ...
    def depth_sql(self) -> str: ...
    def record_sample(self) -> str: ...
    def purge_history(self) -> str: ...
    def sample_since(self) -> str: ...
    def maintenance_tables(self) -> str: ...
    def maintenance_indexes(self) -> str: ...
    def maintenance_action(self, action: str, target: str, table: str, online: bool) -> str: ...
    def online_capable(self) -> str: ...
    def try_maintenance_lock(self) -> str: ...
    def maintenance_unlock(self) -> str: ...
    def drop(self) -> list[str]: ...
    def drop_schema_if_unused(self) -> list[str]: ...


def ring_sql(backend: str, target: RingTarget) -> RingSql:
    if backend == "postgres":
        from dbq.backends.postgres.sql import PgRing

        return PgRing(target)
    if backend == "sqlserver":
        from dbq.backends.sqlserver.sql import MsRing

        return MsRing(target)
    raise InvalidSpec(f"backend {backend} has no ring queues: use postgres or sqlserver")


def recorded_query(backend: str, names: QueueNames) -> str:
    """The metadata query that finds a provisioned queue (parameter: queue name)."""
    if backend == "sqlserver":
        from dbq.backends.sqlserver.sql import quote
    else:
        from dbq.backends.postgres.sql import quote
    return ring_sql_base.recorded_query(names, quote)
