"""The static check of rendered T-SQL (tests/tsql_check.py): each rule catches a planted
mistake and lets its correct form through, and nothing dbq renders for SQL Server breaks a rule."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from dbq.backends.sqlserver.sql import MsRing
from dbq.contract.broker import SEQUENCE_DRAWN
from dbq.names import QueueNames
from tests import tsql_check
from tests.test_broker_sql import statements as broker_statements
from tests.test_sql_dialects import TARGET, render
from tests.test_topic_tsql import rendered as topic_statements

PLANTED = {
    "applock-unchecked": [
        "EXEC sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session'",
        "DECLARE @g int; EXEC @g = sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session';",
        "DECLARE @g int; EXEC @g = sp_getapplock @Resource = ?, @LockMode = 'Exclusive'; IF @g < 0 THROW 51000, N'x', 1;",
    ],
    "rowcount-late": [
        "UPDATE t SET a = 1 WHERE b = 2;\nIF @@ROWCOUNT = 0 SELECT 1;",
        "UPDATE t SET a = 1;\nIF @x = 0 DELETE FROM u;\nIF @@ROWCOUNT = 1 SELECT 1;",
        "IF @x = 1\n  UPDATE t SET a = 1;\nSET @rc = @@ROWCOUNT;",
        "UPDATE t SET a = 1; SELECT CASE WHEN @@ROWCOUNT = 1 THEN 1 ELSE 0 END;",
        "SET @rc = @@ROWCOUNT;",
    ],
    "dateadd-ms-overflow": [
        "SELECT DATEADD(millisecond, @ttl_ms, @now)",
        "SELECT DATEADD(ms, CASE WHEN @d > 0 THEN @d ELSE 0 END, SYSUTCDATETIME())",
        "SELECT DATEADD(millisecond, -@grace_ms, @now)",
    ],
    "cleanup-outside-error-path": ["END CONVERSATION @h WITH CLEANUP;"],
    "sequence-read-alone": [
        "SELECT ISNULL(CAST(last_used_value AS bigint), 0) FROM sys.sequences WHERE object_id = OBJECT_ID(N'[s].[q]')"
    ],
    "above-version-floor": [
        "SELECT GREATEST(a, b) FROM t",
        "SELECT value FROM STRING_SPLIT(@s, N',', 1)",
        "SELECT * FROM GENERATE_SERIES(1, 10)",
        "SELECT a FROM t WHERE a IS DISTINCT FROM b",
    ],
}
CORRECT = [
    f"SELECT {SEQUENCE_DRAWN} FROM sys.sequences WHERE object_id = OBJECT_ID(N'[s].[q]')",
    "DECLARE @g int; EXEC @g = sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Session',"
    " @LockTimeout = 0; SELECT CASE WHEN @g >= 0 THEN 1 ELSE 0 END",
    "IF @@TRANCOUNT = 0 THROW 51000, N'no transaction', 1; DECLARE @g int;"
    " EXEC @g = sys.sp_getapplock @Resource = ?, @LockMode = 'Exclusive', @LockOwner = 'Transaction';"
    " IF @g < 0 THROW 51000, N'not granted', 1;",
    "UPDATE t SET a = CASE WHEN b > 0 THEN 1 ELSE 2 END WHERE b = 2;\nSET @rc = @@ROWCOUNT;\nIF @rc = 0 SELECT 1;",
    "IF @rc = 0 BEGIN\n  DELETE FROM u WHERE id = @id;\n  SET @rc = @@ROWCOUNT;\nEND;",
    "INSERT INTO g (pos) SELECT CAST(value AS bigint) FROM STRING_SPLIT(@p, N','); SET @n += @@ROWCOUNT;",
    "SELECT DATEADD(millisecond, @ttl_ms % 1000, DATEADD(second, @ttl_ms / 1000, @now))",
    "SELECT DATEADD(millisecond, 1, @now)",
    "-- dbq: error path (conversations in the ERROR state)\nEND CONVERSATION @h WITH CLEANUP;",
    "SELECT STRING_AGG(CAST(id AS nvarchar(max)), N',') WITHIN GROUP (ORDER BY id), TRIM(x) FROM t",
    "SELECT 'GREATEST(a, b) in a string is not code' -- nor LEAST(a) in a comment",
]


@pytest.mark.parametrize(("rule", "statement"), [(r, s) for r, planted in PLANTED.items() for s in planted])
def test_each_rule_catches_its_planted_mistake(rule, statement):
    assert rule in {f.rule for f in tsql_check.findings(statement)}, statement


@pytest.mark.parametrize("statement", CORRECT)
def test_the_correct_forms_pass(statement):
    assert tsql_check.findings(statement) == []


@functools.cache
def rendered() -> dict[str, str]:
    """Everything dbq renders for SQL Server: the ring's steps, procedures (archive on and off,
    dead letters kept by another queue), calls, reads, locks and maintenance; Service Broker's
    steps, checks, cleanup, teardown and client statements; a topic's tables and procedure."""
    ring = MsRing(TARGET)
    out = {
        f"ring {i}: {s.splitlines()[0][:50]}": s
        for i, s in enumerate(render(ring))
        if not s.startswith("-- ")
    }
    for name, variant in (
        ("no archive", MsRing(replace(TARGET, archive=False))),
        ("kept dead letters", MsRing(replace(TARGET, dead_letter_keeper=QueueNames("errors", "dlq")))),
    ):
        out |= {f"{name} {i}": s for i, s in enumerate(variant.create_routines())}
    out |= {f"broker {name}": s for name, s in broker_statements().items()}
    out |= {f"topic {i}": s.split(" -- [")[0] for i, s in enumerate(topic_statements())}
    return out


@pytest.mark.parametrize("name", list(rendered()))
def test_rendered_tsql_breaks_no_rule(name):
    assert [str(f) for f in tsql_check.findings(rendered()[name])] == []
