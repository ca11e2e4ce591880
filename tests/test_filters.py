"""Subscription filters: the model refuses what it cannot mean, the Python evaluator says what a
filter means, and the compiled PostgreSQL predicate agrees with it on random headers and
filters (hypothesis), on the real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dbq.api.filters import HEADER_OPERATORS, SUBJECT_OPERATORS, Filter, HeaderClause
from dbq.backends.filter_sql import PgHeaderVariables, ms_predicate, pg_predicate, pg_text
from dbq.backends.topic_sql import free_tag
from dbq.connection import from_url
from dbq.connection.postgres import Connection
from dbq.contract.filters import matches
from dbq.errors import UnsafeName
from tests.sqlserver import MSSQL_DSN
from tests.test_sql_dialects import unparsable


def flt(*headers: dict[str, Any], subject: list[dict[str, Any]] | None = None) -> Filter:
    return Filter.model_validate({"headers": list(headers), "subject": subject or []})


@pytest.mark.parametrize(
    ("clause", "problem"),
    [
        (
            {"key": "a", "eq": 1, "gt": 0},
            "exactly one operator of eq, in, notIn, prefix, exists, is, lt, lte, gt, gte, not 2",
        ),
        ({"key": "a"}, "exactly one operator"),
        ({"key": "a b", "eq": 1}, "String should match pattern"),
        ({"key": 'a"b', "eq": 1}, "String should match pattern"),
        ({"key": "a", "gt": "5"}, "valid integer"),
        ({"key": "a", "eq": [1]}, "valid string"),
        ({"key": "a", "eq": "x\ny"}, "control character"),
        ({"key": "a", "prefix": "x" * 257}, "at most 256 characters"),
        ({"key": "a", "in": []}, "at least 1 item"),
        ({"key": "a", "gte": float("inf")}, "not a finite number"),
        ({"key": "a", "eq": 1.5}, "valid string"),  # fractions: lt/lte/gt/gte
        ({"key": "a", "eq": True}, "valid string"),  # booleans: is
        ({"key": "a", "in": [2**63]}, "less than or equal to 9223372036854775807"),
        ({"key": "a", "is": "true"}, "valid boolean"),
    ],
)
def test_a_clause_that_cannot_mean_one_thing_is_refused_naming_the_rule(clause, problem):
    with pytest.raises(ValidationError, match=problem):
        flt(clause)


def test_subject_clauses_take_text_operators_only():
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        flt(subject=[{"exists": True}])
    with pytest.raises(ValidationError, match="valid string"):
        flt(subject=[{"eq": 5}])


def test_the_crd_schema_says_one_operator_per_clause_and_what_a_value_may_be():
    from dbq.api.crd import _structural

    raw = Filter.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(raw, raw.pop("$defs"))
    header = schema["properties"]["headers"]["items"]
    rule = header["x-kubernetes-validations"][0]["rule"]
    assert rule.count("has(") == len(HEADER_OPERATORS) and "has(self.__in__)" in rule
    assert rule.endswith(".filter(x, x).size() == 1")
    subject_rule = schema["properties"]["subject"]["items"]["x-kubernetes-validations"][0]["rule"]
    assert subject_rule.count("has(") == len(SUBJECT_OPERATORS)
    scalar = header["properties"]["eq"]  # a union the API server's CEL can type
    assert scalar["x-kubernetes-int-or-string"] is True and "type" not in scalar
    assert scalar["anyOf"] == [{"type": "integer"}, {"type": "string"}] and scalar["maxLength"] == 256
    item = header["properties"]["in"]["items"]
    assert item["x-kubernetes-int-or-string"] and item["anyOf"] == scalar["anyOf"]
    assert header["properties"]["is"]["type"] == "boolean"
    assert header["properties"]["gt"]["type"] == "number"


@pytest.mark.parametrize(
    ("clause", "headers", "expected"),
    [
        ({"key": "n", "eq": 100}, {"n": "100"}, False),  # a string is not the number
        ({"key": "n", "eq": "100"}, {"n": "100"}, True),
        ({"key": "n", "eq": 100}, {"n": 100.0}, True),  # numbers by value
        ({"key": "n", "eq": 1}, {"n": True}, False),  # a boolean is not a number
        ({"key": "n", "is": True}, {"n": True}, True),
        ({"key": "n", "is": False}, {"n": 0}, False),  # 0 is not false
        ({"key": "n", "is": False}, {"n": False}, True),
        ({"key": "n", "gte": 1e23}, {"n": 99999999999999991611392}, False),  # as JSON writes them
        ({"key": "n", "exists": False}, {}, True),
        ({"key": "n", "exists": False}, {"n": 0}, False),
        ({"key": "n", "exists": True}, {"n": ""}, True),
        ({"key": "n", "notIn": [1, 2]}, {}, False),  # missing: false, even for notIn
        ({"key": "n", "notIn": [1, 2]}, {"n": "3"}, False),  # another type: false
        ({"key": "n", "notIn": [1, 2]}, {"n": 3}, True),
        ({"key": "n", "notIn": [1, "x"]}, {"n": "y"}, True),
        ({"key": "n", "prefix": "1"}, {"n": 100}, False),  # prefix only on strings
        ({"key": "n", "prefix": "eu-"}, {"n": "eu-west"}, True),
        ({"key": "n", "gte": 100}, {"n": "200"}, False),  # comparisons only on numbers
        ({"key": "n", "gte": 100}, {"n": 100}, True),
        ({"key": "n", "lt": 0.5}, {"n": -(2**70)}, True),
        ({"key": "n", "gt": 0}, {"n": True}, False),
    ],
)
def test_what_a_clause_means(clause, headers, expected, pg):
    f = flt(clause)
    assert matches(f, None, headers) is expected
    assert evaluate(pg, f, None, headers) is expected


def test_a_subject_clause_fails_a_message_without_a_subject(pg):
    for op, operand in (("eq", "a"), ("in", ["a"]), ("notIn", ["a"]), ("prefix", "a")):
        f = flt(subject=[{op: operand}])
        assert matches(f, None, {}) is False and evaluate(pg, f, None, {}) is False
    f = flt(subject=[{"prefix": "orders.eu."}])
    assert matches(f, "orders.eu.de", None) and evaluate(pg, f, "orders.eu.de", None)
    assert matches(flt(), None, None) and evaluate(pg, flt(), None, None)  # no clause: every message


def test_literals_are_quoted_whatever_they_hold():
    assert pg_text("it's \\ fine") == "E'it''s \\\\ fine'"
    with pytest.raises(UnsafeName, match="without NUL"):
        pg_text("a\x00b")
    sql = pg_predicate(flt({"key": "';DROP_TABLE_x;--", "eq": "'); DROP TABLE x; --"}), "h", "s")
    assert "E''';DROP_TABLE_x;--'" in sql and "E''''); DROP TABLE x; --'" not in sql


# --- the compiled predicate against the oracle, on random filters and headers --------------------
KEYS = ["region", "amount", "a.b", "it's", "';DROP_TABLE_x;--", "?", "%s", "$1", "k"]
TEXT = st.text(
    st.characters(
        exclude_categories=("Cs",), exclude_characters=[chr(c) for c in (*range(9), *range(10, 32))]
    ),
    max_size=8,
)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 100, 100.0, -0.0, 1e23, 99999999999999991611392, 2**53 + 1, 0.1]),
)
VALUES = st.one_of(
    TEXT, NUMBERS, st.booleans(), st.sampled_from(["100", "", "eu", "é", "日本", "'", "\\", "?"])
)
# What eq, in and notIn compare with: strings and whole numbers of 64 bits.
OPERANDS = st.one_of(TEXT, st.integers(-(2**63), 2**63 - 1), st.sampled_from(["100", "", "eu", "'", 100, 0]))
HEADERS = st.one_of(st.none(), st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
SUBJECTS = st.one_of(st.none(), TEXT, st.sampled_from(["orders.eu.de", "orders.us", ""]))


@st.composite
def header_clauses(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(HEADER_OPERATORS))
    operand: Any
    if op in ("exists", "is"):
        operand = draw(st.booleans())
    elif op in ("in", "notIn"):
        operand = draw(st.lists(OPERANDS, min_size=1, max_size=4))
    elif op == "prefix":
        operand = draw(TEXT.filter(bool))
    elif op == "eq":
        operand = draw(OPERANDS)
    else:
        operand = draw(NUMBERS)
    return {"key": draw(st.sampled_from(KEYS)), op: operand}


@st.composite
def subject_clauses(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(SUBJECT_OPERATORS))
    if op in ("in", "notIn"):
        return {op: draw(st.lists(SUBJECTS.filter(lambda s: s is not None), min_size=1, max_size=3))}
    return {op: draw(TEXT.filter(bool) if op == "prefix" else TEXT)}


FILTERS = st.builds(
    lambda headers, subject: flt(*headers, subject=subject),
    st.lists(header_clauses(), max_size=3),
    st.lists(subject_clauses(), max_size=2),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(f=FILTERS, headers=HEADERS, subject=SUBJECTS)
def test_the_compiled_postgres_predicate_agrees_with_the_oracle(pg, f, headers, subject):
    assert evaluate(pg, f, subject, headers) is matches(f, subject, headers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(clause=header_clauses(), headers=HEADERS)
def test_one_clause_at_a_time_agrees_with_the_oracle(pg, clause, headers):
    # Single clauses hold about as often as not: the AND of several above is mostly false.
    f = flt(clause)
    assert evaluate(pg, f, None, headers) is matches(f, None, headers)


@pytest.fixture(scope="module")
def pg(postgres) -> Iterator[Connection]:
    conn = Connection.open(from_url(postgres.url))
    yield conn
    conn.close()


def evaluate(conn: Connection, f: Filter, subject: str | None, headers: dict[str, Any] | None) -> bool:
    """The compiled predicate, run by PostgreSQL on these headers (as dbq stores them) and subject,
    in both its forms: one expression standing alone, and as a publish routine has it (each
    header it names read into variables first). They must agree, and the answer is returned."""
    stored = json.dumps(headers, ensure_ascii=False) if headers else None
    cursor = conn.cursor()
    sql = f"SELECT {pg_predicate(f, 'm.h', 'm.s')} FROM (SELECT CAST(? AS jsonb) AS h, CAST(? AS text) AS s) AS m"
    alone = cursor.execute(sql, stored, subject).fetchval()
    reads = PgHeaderVariables("v_h")
    test = pg_predicate(f, reads, "v_s")
    tag = free_tag(test)
    cursor.execute(
        f"CREATE OR REPLACE FUNCTION pg_temp.dbq_matches(v_h jsonb, v_s text) RETURNS boolean LANGUAGE plpgsql"
        f" AS {tag} DECLARE {reads.declarations()}\nBEGIN\n{reads.assignments('  ')}\n  RETURN {test};\nEND {tag}"
    )
    in_routine = cursor.execute(
        "SELECT pg_temp.dbq_matches(CAST(? AS jsonb), CAST(? AS text))", stored, subject
    )
    assert in_routine.fetchval() is alone, (alone, test)
    return alone


# --- SQL Server: the grammar parses every compiled predicate; with DBQ_MSSQL_DSN, it runs ---------
@settings(max_examples=40, deadline=None)
@given(f=FILTERS)
def test_every_compiled_tsql_predicate_parses(f):
    statement = f"SELECT CASE WHEN {ms_predicate(f, '@h', '@s')} THEN 1 ELSE 0 END AS matched;"
    assert unparsable(statement) == []


# Numbers on which float (SQL Server) and exact decimals (the oracle) agree: whole numbers up to
# 2^53 and binary fractions.
EXACT_NUMBERS = st.one_of(st.integers(-(2**53), 2**53), st.sampled_from([0.5, -3.75, 100.0, 1e22, 0.0]))


@pytest.fixture(scope="module")
def ms() -> Iterator[Any]:
    from dbq.connection import odbc

    conn = odbc.connect(from_url(MSSQL_DSN))
    yield conn.cursor()
    conn.close()


@pytest.mark.skipif(not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here")
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_compiled_tsql_predicate_agrees_with_the_oracle_on_sql_server(ms, data):
    values = st.one_of(TEXT, EXACT_NUMBERS, st.booleans())
    key = st.sampled_from(KEYS)
    headers = data.draw(st.one_of(st.none(), st.dictionaries(key, values, max_size=4)))
    op = data.draw(st.sampled_from(HEADER_OPERATORS))
    operands = st.one_of(TEXT, st.integers(-(2**53), 2**53))
    operand = {
        "exists": st.booleans(), "is": st.booleans(), "in": st.lists(operands, min_size=1, max_size=3),
        "notIn": st.lists(operands, min_size=1, max_size=3), "prefix": TEXT.filter(bool), "eq": operands,
    }.get(op, EXACT_NUMBERS)  # fmt: skip
    f = flt({"key": data.draw(key), op: data.draw(operand)})
    subject = data.draw(SUBJECTS)
    stored = json.dumps(headers, ensure_ascii=False) if headers else None
    sql = (
        f"SELECT CASE WHEN {ms_predicate(f, 'm.h', 'm.s')} THEN 1 ELSE 0 END"
        " FROM (SELECT CAST(? AS nvarchar(max)) AS h, CAST(? AS nvarchar(256)) AS s) AS m"
    )
    assert bool(ms.execute(sql, stored, subject).fetchval()) is matches(f, subject, headers)


def test_a_clause_model_is_one_operator_on_one_key():
    c = HeaderClause.model_validate({"key": "region", "in": ["eu", "uk"]})
    assert c.wire() == {"key": "region", "in": ["eu", "uk"]}
