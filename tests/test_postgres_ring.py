"""Provisioning PostgreSQL ring queues on the real server."""

from __future__ import annotations

import json
import os
import secrets

import pyodbc
import pytest

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.postgres.sql import FILLFACTOR
from dbq.client import connect
from dbq.connection import from_url
from dbq.contract.ring import RING_SCHEMA_VERSION, call_statement, records
from dbq.errors import AuthenticationFailed, ConflictingObjects, DatabaseUnreachable
from tests.manifests import queue


def ring(
    postgres,
    schema: str,
    size: int = 64,
    name: str = "orders",
    url: str | None = None,
    messages: dict | None = None,
    provisioned: bool = False,
):
    spec = QueueSpec.model_validate(
        {
            **queue()["spec"],
            "connection": {"secretRef": {"name": "s"}, "schema": schema},
            "ring": {"size": size},
            "messages": messages or {},
        }
    )
    return open_backend(spec, name, from_url(url or postgres.url), provisioned=provisioned)


BODY_TABLES = ("ring", "spill", "content", "dead", "archive")


def body_storage(cur: pyodbc.Cursor, schema: str) -> dict[str, tuple[str, str]]:
    """(attstorage, attcompression) of the body column of each of the queue's message tables."""
    rows = cur.execute(
        "SELECT c.relname, a.attstorage, a.attcompression FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND a.attname = 'body'",
        schema,
    ).fetchall()
    found = {str(r[0]).removeprefix("orders_"): (str(r[1]), str(r[2])) for r in rows}
    return {table: found[table] for table in BODY_TABLES if table in found}


@pytest.fixture
def schema() -> str:
    return f"t_{secrets.token_hex(4)}"


def test_apply_creates_the_ring_as_declared(postgres, schema):
    backend = ring(postgres, schema, size=128)
    result = backend.apply()
    assert (
        next(str(s) for s in result.steps) == "create_schema" and result.schema_version == RING_SCHEMA_VERSION
    )
    cur = postgres.connect().cursor()
    assert tuple(
        cur.execute(f'SELECT count(*), min(slot), max(slot) FROM "{schema}"."orders_ring"').fetchone()
    ) == (128, 0, 127)
    options = cur.execute(
        "SELECT reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = ? AND relname = 'orders_ring'",
        schema,
    ).fetchval()
    assert f"fillfactor={FILLFACTOR}" in options
    # Only the slot key is indexed, so updates of a slot stay HOT.
    indexes = cur.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = ? AND tablename = 'orders_ring'", schema
    ).fetchall()
    assert len(indexes) == 1 and "(slot)" in indexes[0][0]
    version = cur.execute(
        f'SELECT schema_version, ring_size FROM "{schema}".dbq_queues WHERE queue = ?', "orders"
    ).fetchone()
    assert tuple(version) == (RING_SCHEMA_VERSION, 128)
    # Only the tables holding message bodies have a TOAST table (each one more file and index).
    toasted = cur.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = ? AND c.relkind = 'r' AND c.reltoastrelid <> 0 ORDER BY 1",
        schema,
    ).fetchall()
    assert [r[0] for r in toasted] == [
        f"orders_{t}" for t in ("archive", "content", "dead", "ring", "spill", "staged")
    ]
    # Applying again changes nothing.
    assert backend.apply().steps == []
    backend.teardown()
    assert cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval() == 0


def test_stored_bodies_are_compressed_as_spec_messages_compression_says(postgres, schema):
    from dbq.client import connect

    backend = ring(postgres, schema)  # none asked for: the best this server offers
    backend.apply()
    cur = postgres.connect().cursor()
    assert set(body_storage(cur, schema).values()) == {("x", "l")}
    recorded = f'SELECT compression FROM "{schema}".dbq_queues WHERE queue = ?'
    assert cur.execute(recorded, "orders").fetchval() == "lz4"
    text = json.dumps([{"order": i, "region": "eu-west", "amount": i * 1.5} for i in range(30_000)]).encode()[
        : 1 << 20
    ]
    noise = os.urandom(1 << 20)
    q = connect(postgres.url, "orders", schema=schema, smart_batching=False)

    def stored() -> list[tuple[str | None, int]]:
        rows = cur.execute(
            f'SELECT pg_column_compression(body), pg_column_size(body) FROM "{schema}".orders_content ORDER BY msg_id'
        ).fetchall()
        return [(r[0], int(r[1])) for r in rows]

    q.push(text)
    [(method, size)] = stored()
    assert method == "lz4" and size < len(text) // 3
    assert q.pop().body == text
    # none: in place, and only bodies written after it are stored as they come.
    q.push(text)
    backend = ring(postgres, schema, messages={"compression": "none"})
    assert [str(s) for s in backend.apply().steps] == ["set_compression", "record_version"]
    assert {storage for storage, _ in body_storage(cur, schema).values()} == {"e"}
    assert cur.execute(recorded, "orders").fetchval() == "none"
    q.push(text)
    q.push(noise)
    assert [m for m, _ in stored()] == ["lz4", None, None]
    assert stored()[1][1] >= len(text) and stored()[2][1] >= len(noise)
    assert [q.pop().body for _ in range(3)] == [text, text, noise]
    assert backend.apply().steps == []
    # And back: pglz.
    backend = ring(postgres, schema, messages={"compression": "pglz"})
    backend.apply()
    assert set(body_storage(cur, schema).values()) == {("x", "p")}
    q.push(text)
    assert stored() == [("pglz", stored()[0][1])] and q.pop().body == text
    q.close()
    backend.teardown()


def test_routines_push_and_pop_in_one_round_trip_each(postgres, schema):
    backend = ring(postgres, schema)
    backend.apply()
    cur = backend.conn.cursor()
    assert cur.execute(call_statement("postgres", backend.names, "push"), b"a", 0, None).fetchval() == 1
    assert cur.execute(call_statement("postgres", backend.names, "push"), b"b", 0, None).fetchval() == 2
    ((status, msg_id, _, _, _, body),) = records(
        cur.execute(call_statement("postgres", backend.names, "pop"), 0).fetchval()
    )
    assert (status, msg_id, bytes(body)) == (0, 1, b"a")
    assert backend.depth().depth == 1
    backend.teardown()


def test_drift_repair_recreates_a_dropped_ring_and_levels_positions(postgres, schema):
    backend = ring(postgres, schema)
    backend.apply()
    cur = backend.conn.cursor()
    for i in range(5):
        cur.execute(call_statement("postgres", backend.names, "push"), bytes([i]), 0, None).fetchval()
    cur.execute(f'DROP TABLE "{schema}".orders_ring')
    steps = [str(s) for s in backend.plan(backend.observe())]
    assert steps == [
        "create_ring",
        "fill_ring",
        "reset_positions",
        "set_compression",
        "create_routines",
        "secure",
    ]
    backend.apply()
    assert backend.plan(backend.observe()) == []
    # A popper on the re-created ring finds it empty instead of waiting on lost positions.
    assert next(records(cur.execute(call_statement("postgres", backend.names, "pop"), 0).fetchval()))[0] == 1
    assert cur.execute(call_statement("postgres", backend.names, "push"), b"new", 0, None).fetchval() == 6
    ((status, msg_id, _, _, _, body),) = records(
        cur.execute(call_statement("postgres", backend.names, "pop"), 0).fetchval()
    )
    assert (status, msg_id, bytes(body)) == (0, 6, b"new")
    backend.teardown()


def test_existing_ring_of_another_size_is_not_touched_by_a_queue_new_to_it(postgres, schema):
    ring(postgres, schema, size=64).apply()
    other = ring(postgres, schema, size=128)
    with pytest.raises(ConflictingObjects, match=r"64 slots but spec\.ring\.size is 128"):
        other.apply()
    cur = postgres.connect().cursor()
    assert cur.execute(f'SELECT count(*) FROM "{schema}".orders_ring').fetchval() == 64
    ring(postgres, schema, size=64).teardown()


def test_apply_with_another_size_resizes_the_ring_online_and_cleanup_drops_the_older(postgres, schema):
    ring(postgres, schema, size=64).apply()
    with connect(postgres.url, "orders", schema=schema, smart_batching=False) as q:
        q.push_many([b"one", b"two", b"three"])
        result = ring(postgres, schema, size=128, provisioned=True).apply()
        assert result.resized is not None and (result.resized.from_size, result.resized.to_size) == (64, 128)
        assert result.resized.positions_left == 3 and not result.steps
        cur = postgres.connect().cursor()
        assert cur.execute(f'SELECT count(*) FROM "{schema}".orders_ring').fetchval() == 64 + 128
        again = ring(postgres, schema, size=128, provisioned=True).apply()  # nothing left to do
        assert again.resized is None and not again.steps
        assert ring(postgres, schema, size=128).cleanup(30.0)["resizePositionsLeft"] == 3
        assert [m.body for m in q.pop_many(5, timeout=0)] == [b"one", b"two", b"three"]
    counts = ring(postgres, schema, size=128).cleanup(30.0)
    assert (counts["generationsRetired"], counts["generationsDraining"]) == (1, 0)
    assert cur.execute(f'SELECT count(*), min(slot) FROM "{schema}".orders_ring').fetchone()[0] == 128
    assert "generationsRetired" not in ring(postgres, schema, size=128).cleanup(30.0)  # one ring: no look
    ring(postgres, schema, size=128).teardown()


def test_teardown_keeps_a_schema_that_holds_other_things(postgres, schema):
    backend = ring(postgres, schema)
    backend.apply()
    cur = postgres.connect().cursor()
    cur.execute(f'CREATE TABLE "{schema}".someone_elses (id int)')
    backend.teardown()
    assert cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval() == 1
    left = (
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ?"
    )
    assert [r[0] for r in cur.execute(left, schema).fetchall()] == ["someone_elses"]
    assert backend.observe().tables == frozenset()  # none of the queue's
    cur.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_wrong_password_and_closed_port_are_named(postgres, schema):
    password = from_url(postgres.url).password
    bad_password = postgres.url.replace(f":{password}@", ":wrong@", 1)
    with pytest.raises(AuthenticationFailed) as err:
        ring(postgres, schema, url=bad_password).observe()
    assert "wrong" not in str(err.value)
    with pytest.raises(DatabaseUnreachable):
        ring(postgres, schema, url="postgresql://dbq:x@127.0.0.1:1/postgres").observe()


def test_older_routines_are_replaced_on_upgrade(postgres, schema):
    """Version 3 answered take/pop/pop_many with rows and had no p_count; version 4's push_many
    took base64 text. The upgrade drops those signatures (CREATE OR REPLACE cannot change a
    result type, and an overload would make a call ambiguous) and the queue keeps its messages."""
    backend = ring(postgres, schema)
    backend.apply()
    cur = backend.conn.cursor()
    cur.execute(call_statement("postgres", backend.names, "push"), b"kept", 0, None).fetchval()
    rows = "TABLE (o_status int, o_id bigint, o_body bytea, o_lease bigint, o_attempts int)"
    row = "'SELECT 1, 0::bigint, NULL::bytea, 0::bigint, 0'"
    old = [
        ("take", "a bigint, b bigint", rows, row),
        ("pop", "a bigint", rows, row),
        ("pop_many", "a int, b bigint", rows, row),
        ("push_many", "a text, b bigint", "text", "'SELECT NULL::text'"),
    ]
    for verb, args, result, body in old:
        fn = f'"{schema}".orders_{verb}'
        cur.execute(f"DROP FUNCTION {fn}")
        cur.execute(f"CREATE FUNCTION {fn}({args}) RETURNS {result} LANGUAGE sql AS {body}")
    cur.execute(f'UPDATE "{schema}".dbq_queues SET schema_version = 3')
    assert [str(s) for s in backend.plan(backend.observe())] == [
        "index_spill",
        "add_headers",
        "allow_content",
        "create_routines",
        "record_version",
        "secure",
    ]
    backend.apply()
    signatures = cur.execute(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ?"
        " AND p.proname IN ('orders_take', 'orders_pop', 'orders_pop_many', 'orders_push_many')",
        schema,
    ).fetchall()
    assert len(signatures) == 4, signatures
    assert "p_bodies bytea" in dict(signatures)["orders_push_many"]
    assert (
        cur.execute(
            call_statement("postgres", backend.names, "push_many"), b"abcd", "1,3", 0, None
        ).fetchval()
        == "2,3"
    )
    popped = records(cur.execute(call_statement("postgres", backend.names, "pop_many"), 5, 0).fetchval())
    assert [(status, body) for status, _, _, _, _, body in popped] == [(0, b"kept"), (0, b"a"), (0, b"bcd")]
    backend.teardown()


def test_push_many_refuses_lengths_that_do_not_match_the_bodies(postgres, schema):
    backend = ring(postgres, schema)
    backend.apply()
    cur = backend.conn.cursor()
    with pytest.raises(pyodbc.Error, match="lengths adding up to 5"):
        cur.execute(
            call_statement("postgres", backend.names, "push_many"), b"abcd", "2,3", 0, None
        ).fetchval()
    assert (
        next(records(cur.execute(call_statement("postgres", backend.names, "pop"), 0).fetchval()))[0] == 1
    )  # nothing stored: empty
    backend.teardown()


def test_a_version_6_queue_is_upgraded_in_place_with_its_leases_counted(postgres, schema):
    """Version 7 counts settled leases (stats in O(1): in flight = acquired - settled). A
    version 6 queue has no such total: the upgrade creates it from the leases held at that
    moment, and keeps every message."""
    from dbq.client import connect

    backend = ring(postgres, schema)
    backend.apply()
    q = connect(postgres.url, "orders", schema=schema, smart_batching=False)
    ids = q.push_many([b"m%d" % i for i in range(10)])
    held = q.acquire_many(4)
    held[0].ack()
    cur = backend.conn.cursor()
    cur.execute(f'DROP SEQUENCE "{schema}".orders_n_settled')  # what version 6 had
    cur.execute(f'UPDATE "{schema}".dbq_queues SET schema_version = 6')
    assert [str(s) for s in backend.plan(backend.observe())] == [
        "create_sequences", "index_spill", "add_headers", "allow_content", "seed_settled", "create_routines", "record_version",
        "secure",
    ]  # fmt: skip
    backend.apply()
    q.close()
    q = connect(postgres.url, "orders", schema=schema, smart_batching=False)
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.pushed, stats.acquired) == (6, 3, 10, 4)
    q.ack_many(held[1:])
    rest = q.pop_many(10)
    assert sorted(m.id for m in rest + held) == sorted(ids)  # none lost, none twice
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.popped) == (0, 0, 10)
    q.close()
    backend.teardown()


# What each schema version added, taken away again to make a queue of the version before.
ADDED = {
    18: {"tables": ["content"], "totals": [], "routines": ["body_of"], "column": "max_body_bytes"},
    10: {"tables": [], "totals": [], "routines": [], "column": "dead_letter_queue"},
    9: {"tables": ["archive"], "totals": ["archived", "scavenged"], "routines": ["scavenge"], "column": "archive"},
    8: {"tables": ["dead"], "totals": ["dead", "redriven", "purged"],
        "routines": ["defer", "extend", "redrive", "purge_dead"], "column": "max_attempts"},
}  # fmt: skip


@pytest.mark.parametrize("version", [18, 17, 13, 9, 8, 7])
def test_an_older_queue_is_upgraded_in_place_and_keeps_its_messages_and_leases(postgres, schema, version):
    """Version 19 changes routines only; 18 keeps bodies past a slot in a content table (a
    spilled one may be there: its spill row's body is NULL); 17 changes routines only; 14
    indexes the spill table by due time; 10 keys the dead-letter table by source queue
    (spec.deadLetter.queue; a metadata column); 9 added the archive (a table, two totals, a
    routine, a metadata column); 8 added dead letters, delayed delivery and lease extension, and
    a nack with the error. A queue of any older version gets them in place, with every message,
    lease and dead letter it holds."""
    from dbq.client import connect

    backend = ring(postgres, schema)
    backend.apply()
    q = connect(postgres.url, "orders", schema=schema, smart_batching=False)
    ids = q.push_many([b"m%d" % i for i in range(10)])
    held = q.acquire_many(3)
    cur = backend.conn.cursor()
    # spec.messages.compression came after all of them: no column, bodies with the server's default.
    cur.execute(f'ALTER TABLE "{schema}".dbq_queues DROP COLUMN compression')
    for table in BODY_TABLES:
        cur.execute(f'ALTER TABLE "{schema}".orders_{table} ALTER COLUMN body SET COMPRESSION default')
    for added in (v for v in ADDED if v > version):
        for table in ADDED[added]["tables"]:
            cur.execute(f'DROP TABLE "{schema}".orders_{table}')
        for total in ADDED[added]["totals"]:
            cur.execute(f'DROP SEQUENCE "{schema}".orders_n_{total}')
        for verb in ADDED[added]["routines"]:
            cur.execute(f'DROP FUNCTION "{schema}".orders_{verb}')
        cur.execute(f'ALTER TABLE "{schema}".dbq_queues DROP COLUMN {ADDED[added]["column"]}')
    if version < 18:  # a spill row holds its body
        cur.execute(f'ALTER TABLE "{schema}".orders_spill ALTER COLUMN body SET NOT NULL')
    if version < 14:
        cur.execute(f'DROP INDEX "{schema}".orders_spill_due')
    if version in (8, 9):  # a dead-letter table keyed by id alone, holding one dead letter
        dead = f'"{schema}".orders_dead'
        cur.execute(f"ALTER TABLE {dead} DROP COLUMN source")  # its key goes with it
        cur.execute(f"ALTER TABLE {dead} ADD PRIMARY KEY (msg_id)")
        cur.execute(
            f"INSERT INTO {dead} (msg_id, attempts, error, pushed_at, body) VALUES (99, 3, 'old', now(), 'd')"
        )
    if version < 8:  # a nack of three arguments
        cur.execute(f'DROP FUNCTION "{schema}".orders_nack(bigint, bigint, bigint, text)')
        cur.execute(f'CREATE FUNCTION "{schema}".orders_nack(bigint, bigint, bigint, OUT o_ok int)'
                    " LANGUAGE sql AS $$ SELECT 0 $$")  # fmt: skip
    cur.execute(f'UPDATE "{schema}".dbq_queues SET schema_version = {version}')
    assert [str(s) for s in backend.plan(backend.observe())] == {
        18: ["set_compression", "create_routines", "record_version", "secure"],
        17: [
            "create_side_tables",
            "allow_content",
            "set_compression",
            "create_routines",
            "record_version",
            "secure",
        ],
        13: [
            "create_side_tables",
            "index_spill",
            "add_headers",
            "allow_content",
            "set_compression",
            "create_routines",
            "record_version",
            "secure",
        ],
        9: [
            "create_side_tables",
            "key_dead_letters",
            "index_spill",
            "add_headers",
            "allow_content",
            "set_compression",
            "create_routines",
            "record_version",
            "secure",
        ],
        8: [
            "create_sequences",
            "create_side_tables",
            "key_dead_letters",
            "index_spill",
            "add_headers",
            "allow_content",
            "set_compression",
            "create_routines",
            "record_version",
            "secure",
        ],
        7: [
            "create_sequences",
            "create_side_tables",
            "index_spill",
            "add_headers",
            "allow_content",
            "set_compression",
            "create_routines",
            "record_version",
            "secure",
        ],
    }[version]
    backend.apply()
    assert backend.plan(backend.observe()) == []
    assert set(body_storage(cur, schema).values()) == {("x", "l")}  # compressed with lz4 since
    if version in (8, 9):  # the older dead letter is this queue's
        with connect(postgres.url, "orders", schema=schema) as fresh:
            assert [(d.id, d.error, d.source) for d in fresh.dead_letters()] == [
                (99, "old", f"{schema}.orders")
            ]
            assert fresh.purge_dead_letters() == 1
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.pushed, stats.dead, stats.archived) == (7, 3, 10, 0, 0)
    assert held[0].nack(error="after the upgrade") is False  # the lease survived it
    q.ack_many(held[1:])
    rest = q.pop_many(10)
    assert sorted(m.id for m in rest + held[1:]) == sorted(ids)  # none lost, none twice
    assert q.stats().depth == 0
    q.close()
    backend.teardown()


def test_a_version_19_queue_is_given_to_its_owner_role_and_its_routines_to_their_rights(postgres, schema):
    """Before version 20 the operator owned every object, the routines ran as their caller and
    PUBLIC could call them all. The upgrade gives the schema and each object to the owner role,
    makes the routines SECURITY DEFINER with a pinned search_path, revokes everything from PUBLIC,
    and keeps every message and lease."""
    from dbq.backends.postgres.sql import PgRing
    from dbq.client import connect

    later = ("describe", "wait", "peek", "history", "dead_letters", "archived")  # routines of version 20

    class Version19(PgRing):  # the routines as version 19 made them: run as their caller
        def template_values(self) -> dict[str, object]:
            return super().template_values() | {"definer": ""}

    backend = ring(postgres, schema)
    backend.apply()
    q = connect(postgres.url, "orders", schema=schema, smart_batching=False)
    q.push_many([b"m%d" % i for i in range(5)])
    held = q.acquire_many(2)
    q.close()
    cur = backend.conn.cursor()
    old = Version19(backend.target)
    for verb in later:
        cur.execute(f'DROP FUNCTION "{schema}".orders_{verb}')
    for statement in old.create_routines():
        if not any(f'orders_{verb}"(' in statement for verb in later):
            cur.execute(statement)
    for verb, routine in old.fn.items():
        if verb in later:
            continue
        cur.execute(f"ALTER ROUTINE {routine} OWNER TO CURRENT_USER")
        cur.execute(f"GRANT EXECUTE ON ROUTINE {routine} TO PUBLIC")
    for table in ("ring", "spill", "dead", "content"):
        cur.execute(f'ALTER TABLE "{schema}".orders_{table} OWNER TO CURRENT_USER')
    cur.execute(f'ALTER SCHEMA "{schema}" OWNER TO CURRENT_USER')
    cur.execute(f'UPDATE "{schema}".dbq_queues SET schema_version = 19')
    observed = backend.observe()
    assert not observed.secured
    assert [str(s) for s in backend.plan(observed)] == ["create_routines", "record_version", "secure"]
    backend.apply()
    assert backend.observe().secured and backend.plan(backend.observe()) == []
    owners = cur.execute(
        "SELECT count(DISTINCT p.proowner), bool_and(p.prosecdef OR p.proname !~ '_(push|pop|ack|stats)$'),"
        " bool_or(has_function_privilege('public', p.oid, 'EXECUTE'))"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ?",
        schema,
    ).fetchone()
    assert (int(owners[0]), str(owners[1]), str(owners[2])) == (1, "1", "0")
    tables = cur.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = ? AND c.relkind IN ('r', 'S') AND c.relowner <> n.nspowner",
        schema,
    ).fetchval()
    assert tables == 0
    with connect(postgres.url, "orders", schema=schema, smart_batching=False) as after:
        stats = after.stats()
        assert (stats.depth, stats.in_flight, stats.pushed) == (3, 2, 5)
        after.ack_many(held)
        assert len(after.pop_many(10)) == 3
    backend.teardown()
