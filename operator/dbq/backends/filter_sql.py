"""Subscription filters (`dbq.api.filters`) compiled into SQL predicates: a boolean expression
over a message's headers and subject, which a topic's publish routine evaluates for each
subscription, with no dynamic SQL at publish time.

Every key and value reaches the text as a string literal made here (checked, then escaped), and
is cast from there. No clause can raise (a type test guards each comparison), and each yields
true or false, never NULL: a missing header or subject fails it, as `dbq.contract.filters` (the
oracle) says.

- PostgreSQL (`pg_predicate`): headers as jsonb, compared as jsonb (numbers as exact decimals,
  as the oracle does); literals in the `E'...'` form, whatever standard_conforming_strings says.
- SQL Server (`ms_predicate`): headers as JSON text, read with OPENJSON (2016 on: its `type`
  tells a string from a number); strings compared as their UTF-16 bytes (`=` on nvarchar would
  ignore trailing spaces and follow the collation); numbers as float, so two numbers equal to 15
  significant digits may compare equal where PostgreSQL tells them apart.
"""

from __future__ import annotations

import json
from typing import Any

from dbq.api.filters import Filter, HeaderClause, SubjectClause, operator_of
from dbq.contract.filters import kind
from dbq.errors import UnsafeName

COMPARISONS = {"lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


def pg_text(value: str) -> str:
    """`value` as a PostgreSQL string literal. Refuses a NUL (text cannot hold one)."""
    return "E'" + _checked(value).replace("\\", "\\\\").replace("'", "''") + "'"


def ms_text(value: str) -> str:
    """`value` as a T-SQL Unicode string literal."""
    return "N'" + _checked(value).replace("'", "''") + "'"


def _checked(value: str) -> str:
    if not isinstance(value, str) or "\x00" in value:
        raise UnsafeName(f"refusing to quote {value!r} as a literal: a filter value is text without NUL")
    return value


def pg_predicate(flt: Filter, headers: str, subject: str) -> str:
    """The filter as one SQL boolean expression; `headers` and `subject` are the expressions (a
    routine's parameters, say) that hold the message's jsonb headers and text subject."""
    clauses = [_pg_subject(c, subject) for c in flt.subject] + [_pg_header(c, headers) for c in flt.headers]
    return " AND ".join(f"({c})" for c in clauses) if clauses else "true"


def _pg_json(value: Any) -> str:
    return pg_text(json.dumps(value, ensure_ascii=False, allow_nan=False)) + "::jsonb"


def _pg_header(clause: HeaderClause, headers: str) -> str:
    op, operand = operator_of(clause)
    value = f"{headers} -> {pg_text(clause.key)}"
    if op == "exists":
        return f"({value}) IS {'NOT ' if operand else ''}NULL"
    if op == "eq":
        return f"coalesce({value} = {_pg_json(operand)}, false)"
    if op in ("in", "notIn"):
        listed = ", ".join(_pg_json(v) for v in operand)
        if op == "in":
            return f"coalesce({value} IN ({listed}), false)"
        types = ", ".join(pg_text(t) for t in sorted({kind(v) for v in operand}))
        return f"coalesce(jsonb_typeof({value}) IN ({types}) AND {value} NOT IN ({listed}), false)"
    if op == "prefix":
        key = pg_text(clause.key)
        guarded = f"starts_with({headers} ->> {key}, {pg_text(operand)})"
        return f"coalesce(jsonb_typeof({value}) = 'string' AND {guarded}, false)"
    # jsonb orders numbers by value (and every string below every number: hence the type test).
    return (
        f"coalesce(jsonb_typeof({value}) = 'number' AND {value} {COMPARISONS[op]} {_pg_json(operand)}, false)"
    )


def _pg_subject(clause: SubjectClause, subject: str) -> str:
    op, operand = operator_of(clause)
    if op == "eq":
        return f"coalesce({subject} = {pg_text(operand)}, false)"
    if op in ("in", "notIn"):
        listed = ", ".join(pg_text(v) for v in operand)
        return f"coalesce({subject} {'NOT ' if op == 'notIn' else ''}IN ({listed}), false)"
    return f"coalesce(starts_with({subject}, {pg_text(operand)}), false)"


# OPENJSON's `type` of a value: string, number, boolean.
MS_TYPES = {"string": 1, "number": 2, "boolean": 3}


def ms_predicate(flt: Filter, headers: str, subject: str) -> str:
    """The filter as one T-SQL boolean expression; `headers` (nvarchar JSON) and `subject`
    (nvarchar) are the expressions that hold the message's."""
    clauses = [_ms_subject(c, subject) for c in flt.subject] + [_ms_header(c, headers) for c in flt.headers]
    return " AND ".join(f"({c})" for c in clauses) if clauses else "1 = 1"


def _ms_bytes(expression: str) -> str:
    return f"CAST({expression} AS varbinary(max))"


def _ms_string_is(expression: str, value: str) -> str:
    return f"{_ms_bytes(expression)} = {_ms_bytes(ms_text(value))}"


def _ms_starts(expression: str, prefix: str) -> str:
    size = len(prefix.encode("utf-16-le"))
    return f"SUBSTRING({_ms_bytes(expression)}, 1, {size}) = {_ms_bytes(ms_text(prefix))}"


def _ms_number(value: int | float) -> str:
    return f"TRY_CAST({ms_text(repr(value))} AS float)"


def _ms_equals(value: Any) -> str:
    """j.[value] (of OPENJSON) equals `value`, types included."""
    kind_of = kind(value)
    if kind_of == "string":
        test = _ms_string_is("j.[value]", value)
    elif kind_of == "number":
        test = f"TRY_CAST(j.[value] AS float) = {_ms_number(value)}"
    else:
        test = f"j.[value] = {ms_text('true' if value else 'false')}"
    return f"(j.[type] = {MS_TYPES[kind_of]} AND {test})"


def _ms_header(clause: HeaderClause, headers: str) -> str:
    op, operand = operator_of(clause)
    if op == "exists":
        test = "1 = 1"
    elif op == "eq":
        test = _ms_equals(operand)
    elif op == "in":
        test = "(" + " OR ".join(_ms_equals(v) for v in operand) + ")"
    elif op == "notIn":
        types = ", ".join(str(MS_TYPES[t]) for t in sorted({kind(v) for v in operand}))
        test = f"j.[type] IN ({types}) AND NOT (" + " OR ".join(_ms_equals(v) for v in operand) + ")"
    elif op == "prefix":
        test = f"j.[type] = 1 AND {_ms_starts('j.[value]', operand)}"
    else:
        test = f"j.[type] = 2 AND TRY_CAST(j.[value] AS float) {COMPARISONS[op]} {_ms_number(operand)}"
    found = (
        f"EXISTS (SELECT 1 FROM OPENJSON({headers}) AS j WHERE j.[key] = {ms_text(clause.key)} AND {test})"
    )
    return f"NOT {found}" if op == "exists" and not operand else found


def _ms_subject(clause: SubjectClause, subject: str) -> str:
    op, operand = operator_of(clause)
    if op == "prefix":
        return f"{subject} IS NOT NULL AND {_ms_starts(subject, operand)}"
    listed = operand if isinstance(operand, list) else [operand]
    any_of = " OR ".join(_ms_string_is(subject, v) for v in listed)
    return f"{subject} IS NOT NULL AND {'NOT ' if op == 'notIn' else ''}({any_of})"
