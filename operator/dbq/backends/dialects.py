"""The one place that picks a SQL dialect for a ring queue: PostgreSQL or SQL Server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pyodbc

from dbq.backends.ring_plan import RingStep
from dbq.contract.ring import RingTarget
from dbq.errors import InvalidSpec
from dbq.names import QueueNames


class RingSql(Protocol):
    """What the backend needs of a dialect (see PgRing and MsRing)."""

    ROUTINES: tuple[str, ...]
    OBSERVE_SCHEMA: str
    OBSERVE_RELATIONS: str
    OBSERVE_ROUTINES: str
    SERVER_VERSION: str | None  # major version and compatibility level, where there is a floor
    CATALOG_DIGEST: str | None  # a digest of a schema's catalog rows, where one can be read
    MAX_LOCKS: str | None  # how many locks one transaction may take on average, where that is bounded
    COMPRESSIONS: str | None  # the compressions of stored bodies the server offers, comma-separated
    OBSERVE_INSECURE: str | None  # objects not as secure() leaves them, where the dialect looks
    SHARED_LOGIN_SESSIONS: str | None  # applications on the operator's login, where it can tell
    PGMQ: bool  # whether PGMQ's API is offered (spec.pgmq)
    BACKEND: str
    ring: str
    meta: str
    owner: str

    def render(self, step: RingStep) -> list[str]: ...
    def batches(self, statements: list[str]) -> list[str]: ...
    def advisory_lock(self) -> str: ...
    def advisory_unlock(self) -> str | None: ...
    def depth_sql(self) -> str: ...
    def record_sample(self) -> str: ...
    def record_samples(self, queues: Sequence[str]) -> str: ...
    def purge_history(self) -> str: ...
    def purge_histories(self, queues: Sequence[str]) -> str: ...
    def sample_since(self) -> str: ...
    def maintenance_tables(self) -> str: ...
    def maintenance_indexes(self) -> str: ...
    def maintenance_action(self, action: str, target: str, table: str, online: bool) -> str: ...
    def online_capable(self) -> str: ...
    def try_maintenance_lock(self) -> str: ...
    def maintenance_unlock(self) -> str: ...
    def meta_row(self, names: QueueNames) -> str: ...
    def forget_dead_letters(self, keeper: QueueNames) -> str: ...
    def drop(self) -> list[str]: ...
    def drop_schema_if_unused(self) -> list[str]: ...
    def drop_roles(self) -> list[str]: ...


def ring_sql(backend: str, target: RingTarget) -> RingSql:
    if backend == "postgres":
        from dbq.backends.postgres.sql import PgRing

        return PgRing(target)
    if backend == "sqlserver":
        from dbq.backends.sqlserver.sql import MsRing

        return MsRing(target)
    raise InvalidSpec(f"backend {backend} has no ring queues: use postgres or sqlserver")


def relations(cur: pyodbc.Cursor, sql: RingSql, schema: str, names: Sequence[str]) -> dict[str, str]:
    """Those of `names` that exist in `schema` as tables or sequences, with their kind (r, p: a
    table; S: a sequence). Looked up by name: see OBSERVE_RELATIONS."""
    found = cur.execute(sql.OBSERVE_RELATIONS, schema, ",".join(names)).fetchall()
    return {str(name): str(kind) for name, kind in found}
