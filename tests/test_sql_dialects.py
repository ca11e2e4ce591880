"""Both SQL dialects render every planning step; golden files pin the text; a T-SQL grammar
(sqlfluff's tsql dialect) parses everything SQL Server would run, since no SQL Server runs here."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from sqlfluff.core import FluffConfig, Linter

from dbq.backends.postgres.sql import PgRing
from dbq.backends.ring_plan import Observed, RingAction, RingStep, plan_ring
from dbq.backends.sqlserver.sql import MsRing
from dbq.contract.ring import (
    RingTarget,
    archive_query,
    call_statement,
    dead_letter_queue_query,
    dead_letters_query,
    history_query,
    peek_query,
)
from dbq.contract.staging import StagingStatements
from dbq.errors import UnsafeName
from dbq.names import QueueNames, group_role, login_role, ms_quote

GOLDEN = Path(__file__).with_name("golden")
TARGET = RingTarget(
    names=QueueNames(schema="shopq", queue="orders"),
    size=1000,
    message_bytes=300,
    max_attempts=5,
    archive=True,
    compression="lz4",
    database="shop",
)
# PGMQ's API: PostgreSQL's alone; the facade's SQL is its own file (tests/test_pgmq_facade.py).
PGMQ_STEPS = {RingAction.INSTALL_PGMQ, RingAction.PUBLISH_PGMQ, RingAction.UNPUBLISH_PGMQ}
ALL_STEPS = [a for a in RingAction if a not in PGMQ_STEPS]
CALLS = [
    "push",
    "push_many",
    "take",
    "pop",
    "pop_many",
    "release",
    "ack",
    "ack_many",
    "nack",
    "repair",
    "void_holes",
    "stats",
    "defer",
    "extend",
    "redrive",
    "purge_dead",
    "scavenge",
]


MAINTENANCE = {"PgRing": ("vacuum", "reindex"), "MsRing": ("reorganize", "rebuild")}


def render(ring: PgRing | MsRing) -> list[str]:
    out = []
    for action in ALL_STEPS:
        out += [f"-- step {action}", *ring.render(RingStep(action, "golden"))]
    out += ["-- teardown", *ring.drop(), *ring.drop_schema_if_unused(), *ring.drop_roles()]
    backend = "postgres" if isinstance(ring, PgRing) else "sqlserver"
    out += ["-- calls", *(call_statement(backend, ring.t.names, v) for v in CALLS)]
    staging = StagingStatements(backend, ring.t.names)
    out += [
        "-- client reads",
        peek_query(backend, ring.t.names),
        dead_letter_queue_query(backend, ring.t.names),
        dead_letters_query(backend, ring.t.names, True),
        dead_letters_query(backend, ring.t.names, False),
        ring.meta_row(ring.t.names),
        ring.forget_dead_letters(QueueNames("errors", "dlq")),
        archive_query(backend, ring.t.names),
        history_query(backend, ring.t.names),
        "-- staging (dbq.spark)",
        staging.insert,
        staging.blocks,
        staging.last,
        staging.delete_upto,
        staging.delete_after,
        staging.delete_stage,
    ]
    out += [
        "-- observe",
        *([ring.SERVER_VERSION] if ring.SERVER_VERSION else []),
        ring.OBSERVE_SCHEMA,
        ring.OBSERVE_RELATIONS,
        ring.OBSERVE_ROUTINES,
        *([ring.OBSERVE_INSECURE] if ring.OBSERVE_INSECURE else []),
        ring.depth_sql(),
        "-- statistics history",
        ring.record_sample(),
        ring.purge_history(),
        ring.sample_since(),
        "-- the schema's lock around provisioning and teardown",
        ring.advisory_lock(),
        *([unlock] if (unlock := ring.advisory_unlock()) else []),
        "-- online resize",
        ring.newest_generation(),
        ring.slots_present(0, 1000),
        ring.generations(),
        ring.resize_pending(),
        ring.try_resize_lock(),
        ring.resize_unlock(),
        ring.prepare_slots(1000, 5000),
        ring.switch(1000, 4000, 100),
        *ring.retire(1, 0, 1000),
        ring.delete_slots(0, 1000),
        ring.slot_bounds(),
        ring.leased_in(0, 1000),
        "-- maintenance",
        ring.maintenance_tables(),
        ring.maintenance_indexes(),
        ring.online_capable(),
        ring.try_maintenance_lock(),
        ring.maintenance_unlock(),
        *(
            ring.maintenance_action(a, "orders_ring_pkey", "orders_ring", True)
            for a in MAINTENANCE[type(ring).__name__]
        ),
    ]
    return out


@pytest.mark.parametrize("dialect", ["postgres", "sqlserver"])
def test_generated_sql_matches_the_golden_file(dialect):
    ring = PgRing(TARGET) if dialect == "postgres" else MsRing(TARGET)
    text = "\n\n".join(render(ring)) + "\n"
    golden = GOLDEN / f"{dialect}_ring.sql"
    if os.environ.get("DBQ_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"run with DBQ_UPDATE_GOLDEN=1 to create {golden.name}"
    assert text == golden.read_text(), (
        f"{golden.name} differs: review, then DBQ_UPDATE_GOLDEN=1 pytest {__file__}"
    )


def test_every_step_the_planner_can_emit_exists_in_both_dialects():
    upgrades_only = {
        RingAction.RESET_POSITIONS,
        RingAction.SEED_SETTLED,
        RingAction.KEY_DEAD_LETTERS,
        RingAction.INDEX_SPILL,
        RingAction.ADD_HEADERS,
        RingAction.ALLOW_CONTENT,
        RingAction.PUBLISH_PGMQ,
        RingAction.UNPUBLISH_PGMQ,
    }
    pgmq_target = replace(TARGET, pgmq_name="shop_orders")
    emitted = {s.action for s in plan_ring(pgmq_target, Observed())} | upgrades_only
    assert emitted == set(RingAction)
    for ring in (PgRing(pgmq_target), MsRing(TARGET)):
        for action in RingAction:
            if isinstance(ring, MsRing) and action in (RingAction.SET_COMPRESSION, *PGMQ_STEPS):
                continue  # PostgreSQL's alone: refused at admission on SQL Server, never planned there
            assert ring.render(RingStep(action, "test")), (
                f"{type(ring).__name__} renders nothing for {action}"
            )
    assert MsRing(TARGET).render(RingStep(RingAction.SET_COMPRESSION, "test")) == []
    # SQL Server creates every procedure its planner checks for, and the client calls exist.
    ms = MsRing(TARGET)
    created = "\n".join(ms.render(RingStep(RingAction.CREATE_ROUTINES, "test")))
    for verb in MsRing.ROUTINES:
        assert f"PROCEDURE [shopq].[orders_{verb}]" in created


_linter = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))


def unparsable(statement: str) -> list[str]:
    # ODBC parameter markers become the variables the driver binds them to.
    numbered = iter(range(1, 100))
    statement = re.sub(r"\?", lambda _: f"@p{next(numbered)}", statement)
    parsed = _linter.parse_string(statement)
    if parsed.tree is None:
        return ["(no parse tree)"]
    return [seg.raw[:120] for seg in parsed.tree.recursive_crawl("unparsable")]


def test_the_tsql_grammar_check_catches_broken_tsql():
    assert unparsable("CREATE OR ALTER PROCEDURE x AS BEGIN UPDATE SET WHERE = END")
    assert not unparsable("CREATE OR ALTER PROCEDURE x AS BEGIN UPDATE t SET a = 1 WHERE b = 2; END")


@pytest.mark.parametrize(
    "statement",
    render(MsRing(TARGET)) + MsRing(replace(TARGET, archive=False)).create_routines(),
    ids=lambda s: s.split("\n")[0][:60],
)
def test_every_generated_tsql_statement_parses(statement):
    if statement.startswith("-- "):
        return
    assert unparsable(statement) == []


def test_templates_fill_only_known_placeholders():
    from dbq.backends.ring_sql import render_template

    assert render_template("SELECT '{}' FROM {ring};\n--;;\n-- only a comment", {"ring": "r"}) == [
        "SELECT '{}' FROM r;"
    ]
    with pytest.raises(KeyError, match=r"placeholder \{rnig\} has no value"):
        render_template("SELECT 1 FROM {rnig}", {"ring": "r"})


def test_template_blocks_are_kept_or_dropped_by_their_flag():
    from dbq.backends.ring_sql import render_template

    template = "SELECT 1;\n  -- if archive\nINSERT a;\n  -- else\nINSERT b;\n  -- end if\nSELECT 2;"
    assert render_template(template, {}, {"archive": True}) == ["SELECT 1;\nINSERT a;\nSELECT 2;"]
    assert render_template(template, {}, {"archive": False}) == ["SELECT 1;\nINSERT b;\nSELECT 2;"]
    with pytest.raises(KeyError, match="no flag value"):
        render_template(template, {}, {})
    with pytest.raises(KeyError, match="without its '-- end if'"):
        render_template("-- if archive\nX", {}, {"archive": True})


def test_names_are_validated_before_they_are_quoted():
    with pytest.raises(UnsafeName):
        QueueNames(schema="shop]q", queue="orders")
    with pytest.raises(ValueError):
        ms_quote("a]b")
    with pytest.raises(ValueError):
        MsRing(RingTarget(names=TARGET.names, size=16, message_bytes=8000))


def test_packed_records_read_back_exactly():
    """take/pop/pop_many answer with packed records; both dialects write integers big-endian."""
    from dbq.contract.ring import RECORD, records

    blob = (
        RECORD.pack(0, 7, 2**53, 3, 0, 5) + b"hello" + RECORD.pack(2, 9, 0, 0, 0, 0)
        + RECORD.pack(0, 10, 0, 1, 10, 2) + b'{"k":"\xc3\xa9"}' + b"hi"
    )  # fmt: skip
    assert list(records(blob)) == [
        (0, 7, 2**53, 3, None, b"hello"), (2, 9, 0, 0, None, b""), (0, 10, 0, 1, '{"k":"é"}', b"hi"),
    ]  # fmt: skip
    utf16 = '{"k":"é"}'.encode("utf-16-le")  # SQL Server's nvarchar
    assert list(records(RECORD.pack(0, 1, 0, 1, len(utf16), 0) + utf16, "utf-16-le")) == [
        (0, 1, 0, 1, '{"k":"é"}', b"")
    ]
    assert list(records(b"")) == []


@pytest.mark.parametrize("dialect", [PgRing, MsRing])
def test_dead_letters_kept_by_another_queue_go_to_its_table_named_by_their_source(dialect):
    ring = dialect(replace(TARGET, dead_letter_keeper=QueueNames("errors", "dlq")))
    # (PostgreSQL's dead_letters routine lists the queue's own table too, when asked for what it holds.)
    routines = "\n".join(r for r in ring.create_routines() if '_dead_letters"(' not in r)
    assert "dlq_dead" in routines and "orders_dead" not in routines
    assert (
        routines.count("'shopq.orders'") >= 6
    )  # nack, repair (twice), redrive, purge: each names its source
    assert "'errors.dlq'" in "\n".join(ring.record_version())
    assert "orders_dead" in "\n".join(ring.create_side_tables())  # its own table is still made


def test_every_sql_server_procedure_runs_as_its_owner():
    """The procedures read sys.sequences and OBJECT_ID: a login with only EXECUTE on them sees
    those rows only through the owner's context (metadata visibility)."""
    procedures = [s for s in MsRing(TARGET).create_routines() if "CREATE OR ALTER PROCEDURE" in s]
    assert len(procedures) == len(MsRing.ROUTINES)
    for statement in procedures:
        head = statement.split("AS BEGIN", 1)[0]
        assert head.rstrip().endswith("WITH EXECUTE AS OWNER"), head


def access_tsql() -> list[str]:
    """The T-SQL of a QueueUser's contained user on SQL Server (`dbq.backends.sqlserver.access`)."""
    from dbq.backends.sqlserver import access

    login, group = login_role("shop", "app"), group_role("shop", "shopq", "orders", "send")
    return [
        access.SET_USER,
        access.USER_EXISTS,
        access.MEMBERSHIPS,
        access.grant_statement(login, group),
        access.revoke_statement(login, group),
        access.DROP_USER,
    ]


def test_sqlserver_logins_match_their_golden_file_and_parse():
    text = "\n\n".join(access_tsql()) + "\n"
    golden = GOLDEN / "sqlserver_access.sql"
    if os.environ.get("DBQ_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), (
        f"{golden.name} differs: review, then DBQ_UPDATE_GOLDEN=1 pytest {__file__}"
    )
    for statement in access_tsql():
        assert unparsable(statement) == [], statement
