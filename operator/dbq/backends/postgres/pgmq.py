"""PGMQ 1.13's API on dbq's ring queues (schema pgmq): the facade's statements, installed once per
database, and the statements that map a PGMQ queue name to a queue and grant its roles the facade.

The facade's functions are SECURITY INVOKER and call the queue's own routines, so what a login may
do through them is what its rights on the queue let it do (docs/developers/pgmq.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from dbq.backends.ring_sql import load_template
from dbq.contract.ring import PGMQ_FACADE_VERSION
from dbq.names import check_identifier, check_role
from dbq.names import pg_literal as literal
from dbq.names import pg_quote as quote

# Two queues provisioned at once in one database would install the facade at once: CREATE OR
# REPLACE of one function by two transactions fails, so installs take turns (a transaction lock).
INSTALL_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dbq pgmq facade'))"
# (facade installed, its version) and, once it is, the PGMQ name mapped to a queue (parameters:
# schema, queue).
OBSERVE_FACADE = (
    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = 'pgmq' AND c.relname IN ('dbq_facade', 'dbq_queues')"
)  # from the catalog: a real PGMQ's schema is not the operator's to look into (2 when installed)
OBSERVE_VERSION = "SELECT coalesce((SELECT version FROM pgmq.dbq_facade WHERE id = 1), 0)"
OBSERVE_NAME = "SELECT queue_name FROM pgmq.dbq_queues WHERE schema_name = ? AND queue = ?"


def facade_statements() -> list[str]:
    """The facade, every statement idempotent (`pgmq_facade.sql`)."""
    text = load_template(__package__ or "dbq.backends.postgres", "pgmq_facade.sql")
    text = text.replace("{version}", str(int(PGMQ_FACADE_VERSION)))
    return [s.strip() for s in text.split("\n--;;\n") if s.strip()]


def publish(schema: str, queue: str, name: str, groups: Iterable[str]) -> list[str]:
    """Install the facade, map PGMQ queue `name` to queue `schema`.`queue` (an error naming
    spec.pgmq.name when another queue holds it) and grant the queue's group roles the facade."""
    check_identifier(schema, "spec.connection.schema")
    check_identifier(queue, "queue name")
    check_identifier(name, "spec.pgmq.name")
    roles = ", ".join(quote(check_role(g)) for g in groups)
    mapped = f"""DO $$ DECLARE v_schema text; v_queue text; BEGIN
  DELETE FROM pgmq.dbq_queues WHERE schema_name = {literal(schema)} AND queue = {literal(queue)}
    AND queue_name <> {literal(name)};
  INSERT INTO pgmq.dbq_queues (queue_name, schema_name, queue)
  VALUES ({literal(name)}, {literal(schema)}, {literal(queue)}) ON CONFLICT (queue_name) DO NOTHING;
  SELECT schema_name, queue INTO v_schema, v_queue FROM pgmq.dbq_queues WHERE queue_name = {literal(name)};
  IF (v_schema, v_queue) <> ({literal(schema)}, {literal(queue)}) THEN
    RAISE EXCEPTION 'spec.pgmq.name: PGMQ queue name % is taken by queue %.% in this database: choose another name',
      {literal(name)}, v_schema, v_queue USING ERRCODE = '23505';
  END IF;
END $$"""
    return [
        INSTALL_LOCK,
        *facade_statements(),
        mapped,
        f"GRANT USAGE ON SCHEMA pgmq TO {roles}",
        f"GRANT SELECT ON TABLE pgmq.dbq_queues TO {roles}",
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgmq TO {roles}",
    ]


def unpublish(schema: str, queue: str, groups: Iterable[str]) -> list[str]:
    """The queue's PGMQ name unmapped and its group roles' grants on the facade revoked (nothing
    when the database has no facade)."""
    roles = ", ".join(literal(check_role(g)) for g in groups)
    return [
        f"""DO $$ DECLARE v_role text; BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'pgmq' AND c.relname = 'dbq_queues') THEN
    RETURN;
  END IF;
  DELETE FROM pgmq.dbq_queues WHERE schema_name = {literal(check_identifier(schema, "spec.connection.schema"))}
    AND queue = {literal(check_identifier(queue, "queue name"))};
  FOR v_role IN SELECT rolname FROM pg_roles WHERE rolname IN ({roles}) LOOP
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON TABLE pgmq.dbq_queues FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON SCHEMA pgmq FROM %I', v_role);
  END LOOP;
END $$"""
    ]
