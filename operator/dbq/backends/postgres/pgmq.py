"""PGMQ 1.13's API on dbq's ring queues (schema pgmq): the facade's statements, installed once per
database, and the statements that map a PGMQ queue name to a queue and grant its roles the facade.

The facade's functions are SECURITY INVOKER and call the queue's own routines, so what a login may
do through them is what its rights on the queue let it do (docs/developers/pgmq.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dbq.api.models import TOPIC_HINT, TOPIC_PATTERN
from dbq.backends.ring_sql import load_template
from dbq.contract.ring import PGMQ_FACADE_VERSION
from dbq.errors import UnsafeName
from dbq.names import check_identifier, check_role
from dbq.names import pg_literal as literal
from dbq.names import pg_quote as quote

# Two queues provisioned at once in one database would install the facade at once: CREATE OR
# REPLACE of one function by two transactions fails, so installs (and removals of a queue's
# grants, which rewrite the same catalog rows) take turns (a transaction lock).
INSTALL_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dbq pgmq facade'))"
# 0: no facade; 1: a facade this login cannot read (another operator login's, before this one
# became a member of its owner role); 2: one it can. From the catalog, by oid: a real PGMQ's
# schema is not the operator's to look into.
OBSERVE_FACADE = (
    "SELECT CASE WHEN count(*) < 2 THEN 0 WHEN bool_and(has_schema_privilege(n.oid, 'USAGE')"
    " AND has_table_privilege(c.oid, 'SELECT')) THEN 2 ELSE 1 END"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = 'pgmq' AND c.relname IN ('dbq_facade', 'dbq_queues')"
)
OBSERVE_VERSION = "SELECT coalesce((SELECT version FROM pgmq.dbq_facade WHERE id = 1), 0)"
OBSERVE_NAME = "SELECT queue_name FROM pgmq.dbq_queues WHERE schema_name = ? AND queue = ?"
# Topic bindings (spec.pgmq.topics) came with the facade's version 2.
TOPICS_SINCE = 2
OBSERVE_TOPICS = "SELECT pattern FROM pgmq.dbq_topic_bindings WHERE queue_name = ?"
# spec.pgmq.name (api.models.Pgmq): 47 at most, as PGMQ's own names
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,46}$")


def name_literal(name: str) -> str:
    """A PGMQ queue name, validated, as a string literal."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UnsafeName(
            f"spec.pgmq.name {name!r} is not a PGMQ name dbq takes: lower-case letters, digits and"
            " underscores, starting with a letter, at most 47"
        )
    return f"'{name}'"


def topic_literal(pattern: str) -> str:
    """A PGMQ topic pattern of spec.pgmq.topics, validated, as a string literal."""
    if not isinstance(pattern, str) or len(pattern) > 255 or not re.fullmatch(TOPIC_PATTERN, pattern):
        raise UnsafeName(f"{pattern!r}: {TOPIC_HINT}")
    return f"'{pattern}'"


def role_literal(role: str) -> str:
    return f"'{check_role(role)}'"


def facade_statements(owner: str) -> list[str]:
    """The facade, every statement idempotent (`pgmq_facade.sql`), made as role `owner`."""
    text = load_template(__package__ or "dbq.backends.postgres", "pgmq_facade.sql")
    text = text.replace("{version}", str(int(PGMQ_FACADE_VERSION)))
    text = text.replace("{owner_literal}", role_literal(owner)).replace("{owner}", quote(check_role(owner)))
    return [s.strip() for s in text.split("\n--;;\n") if s.strip()]


def publish(
    schema: str,
    queue: str,
    name: str,
    topics: Iterable[str],
    groups: Iterable[str],
    owner: str,
    install: bool,
) -> list[str]:
    """Install the facade (when `install`) as role `owner`, map PGMQ queue `name` to queue
    `schema`.`queue` (an error naming spec.pgmq.name when another queue holds it), bind it the
    topic patterns `topics` (and no other) and grant the queue's group roles the facade."""
    groups = list(groups)
    s, q, n = (
        literal(check_identifier(schema, "spec.connection.schema")),
        literal(check_identifier(queue, "queue name")),
        name_literal(name),
    )
    roles = ", ".join(quote(check_role(g)) for g in groups)
    patterns = f"ARRAY[{', '.join(topic_literal(p) for p in topics)}]::text[]"
    mapped = f"""DO $$ DECLARE v_schema text; v_queue text; BEGIN
  DELETE FROM pgmq.dbq_queues WHERE schema_name = {s} AND queue = {q} AND queue_name <> {n};
  INSERT INTO pgmq.dbq_queues AS m (queue_name, schema_name, queue, roles)
  VALUES ({n}, {s}, {q}, ARRAY[{", ".join(role_literal(g) for g in groups)}]::text[])
  ON CONFLICT (queue_name) DO UPDATE SET roles = EXCLUDED.roles WHERE m.schema_name = {s} AND m.queue = {q};
  SELECT schema_name, queue INTO v_schema, v_queue FROM pgmq.dbq_queues WHERE queue_name = {n};
  IF (v_schema, v_queue) <> ({s}, {q}) THEN
    RAISE EXCEPTION 'spec.pgmq.name: PGMQ queue name % is taken by queue %.% in this database: choose another name',
      {n}, v_schema, v_queue USING ERRCODE = '23505';
  END IF;
  DELETE FROM pgmq.dbq_topic_bindings WHERE queue_name = {n} AND pattern <> ALL ({patterns});
  INSERT INTO pgmq.dbq_topic_bindings (pattern, queue_name) SELECT p, {n} FROM unnest({patterns}) p
  ON CONFLICT DO NOTHING;
END $$"""
    made = facade_statements(owner) if install else [f"SET LOCAL ROLE {quote(check_role(owner))}"]
    return [
        INSTALL_LOCK,
        f"SELECT dbq_access.ensure_owner({role_literal(owner)})",
        *made,
        mapped,
        f"GRANT USAGE ON SCHEMA pgmq TO {roles}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA pgmq TO {roles}",
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgmq TO {roles}",
        "RESET ROLE",
    ]


def unpublish(schema: str, queue: str, owner: str) -> list[str]:
    """The queue's PGMQ name unmapped and its group roles' grants on the facade revoked (nothing
    when the database has no facade, or the queue no PGMQ name)."""
    s, q = (
        literal(check_identifier(schema, "spec.connection.schema")),
        literal(check_identifier(queue, "queue name")),
    )
    return [
        f"""DO $$ DECLARE v_roles text[]; v_role text; BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'pgmq' AND c.relname = 'dbq_queues') THEN
    RETURN;
  END IF;
  PERFORM dbq_access.ensure_owner({role_literal(owner)});  -- this login may act for the facade's owner
  DELETE FROM pgmq.dbq_queues WHERE schema_name = {s} AND queue = {q} RETURNING roles INTO v_roles;
  IF NOT FOUND THEN RETURN; END IF;
  PERFORM pg_advisory_xact_lock(hashtext('dbq pgmq facade'));
  FOR v_role IN SELECT r.rolname FROM pg_roles r WHERE r.rolname = ANY (v_roles) LOOP
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgmq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON SCHEMA pgmq FROM %I', v_role);
  END LOOP;
END $$"""
    ]
