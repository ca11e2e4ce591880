"""A topic's T-SQL (SQL Server): pinned by a golden file and parsed by the T-SQL grammar, since no
SQL Server runs here; with DBQ_MSSQL_DSN it is made and run on that server."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from dbq.api.filters import Filter
from dbq.backends.sqlserver.topic_sql import MsTopic
from dbq.contract.topics import Route, TopicNames, TopicTarget
from dbq.names import QueueNames
from tests.sqlserver import MSSQL_DSN
from tests.test_sql_dialects import unparsable

GOLDEN = Path(__file__).with_name("golden") / "sqlserver_topic.sql"


def flt(raw: dict) -> Filter:
    return Filter.model_validate(raw)


def target(
    schema: str = "shopq", topic: str = "orders", queues: tuple[str, ...] = ("eu", "big", "all")
) -> TopicTarget:
    eu, big, every = (QueueNames(schema, q) for q in queues)
    routes = (
        Route("eu_orders", eu, flt({"headers": [{"key": "region", "in": ["de", "it's"]}]}), "Reject", 1, 1000,
              label="eu-orders"),
        Route("big", big, flt({"headers": [{"key": "amount", "gte": 1000}, {"key": "vip", "is": True}]}), "Drop", 2, 64),
        Route("all", every, flt({"subject": [{"prefix": "order."}]}), "Reject", 3, 1000),
    )  # fmt: skip
    return TopicTarget(TopicNames(schema, topic), routes, QueueNames(schema, "rest"))


def rendered() -> list[str]:
    sql = MsTopic(target())
    return [
        *sql.statements(7),
        *(f"{statement} -- {params!r}" for statement, params in sql.rows(7)),
        *sql.drop([1, 2, 3]),
    ]


def test_the_topic_tsql_matches_the_golden_file():
    text = "\n--;;\n".join(rendered()) + "\n"
    if os.environ.get("DBQ_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"run with DBQ_UPDATE_GOLDEN=1 to create {GOLDEN.name}"
    assert text == GOLDEN.read_text(), (
        f"{GOLDEN.name} differs: review, then DBQ_UPDATE_GOLDEN=1 pytest {__file__}"
    )


@pytest.mark.parametrize("statement", rendered(), ids=lambda s: s.split("\n")[0][:60])
def test_every_topic_tsql_statement_parses(statement):
    assert unparsable(statement.split(" -- [")[0]) == []


def test_the_procedure_routes_each_subscription_by_its_compiled_filter_and_answers_with_its_name():
    procedure = MsTopic(target()).statements(7)[-1]
    assert procedure.count("INSERT INTO @got (id) EXEC") == 4  # three routes and the unrouted queue
    assert "N'eu-orders='" in procedure and "N'it''s'" in procedure  # names as labels, values as literals
    assert "rules_version = 7" in procedure and "sp_getapplock" in procedure
    # each Reject route in its room check and after its push, and the unrouted queue; Drop counts
    assert procedure.count("THROW 51400") == 5
    assert "NEXT VALUE FOR [shopq].[orders_s2_dropped]" in procedure
    # A room check for each Reject route with a known ring size, before any push
    assert procedure.index("[shopq].[eu_push_seq]") < procedure.index("EXEC [shopq].[eu_push]")


@pytest.mark.skipif(not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here")
def test_the_procedure_publishes_on_sql_server():
    from dbq.backends.odbc_ring import OdbcRing
    from dbq.connection import from_url, odbc
    from dbq.contract.ring import RingTarget

    schema = f"t_{secrets.token_hex(3)}"
    names = [f"q{i}_{secrets.token_hex(2)}" for i in range(4)]
    rings = [OdbcRing(from_url(MSSQL_DSN), RingTarget(QueueNames(schema, n), 1000, 100)) for n in names]
    for ring in rings:
        ring.apply()
    conn = odbc.connect(from_url(MSSQL_DSN))
    try:
        made = target(schema, "t", tuple(names[:3]))
        sql = MsTopic(TopicTarget(made.names, made.routes, QueueNames(schema, names[3])))
        cur = conn.cursor()
        for statement in sql.statements(1):
            cur.execute(statement)
        for statement, params in sql.rows(1):
            cur.execute(statement, *params)
        conn.commit()
        call = f"EXEC [{schema}].[t_publish] ?, ?, ?, 0"
        answer = cur.execute(
            call, b"m", '{"region":"de","amount":5000,"vip":true}', "order.created"
        ).fetchval()
        assert set(dict(pair.split("=") for pair in answer.split(","))) == {"eu-orders", "big", "all"}
        assert cur.execute(call, b"n", '{"region":"us"}', None).fetchval().startswith("=")
        conn.commit()
        for statement in sql.drop([1, 2, 3]):
            cur.execute(statement)
        conn.commit()
    finally:
        conn.close()
        for ring in rings:
            ring.teardown()
            ring.close()
