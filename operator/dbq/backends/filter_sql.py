"""Subscription filters (`dbq.api.filters`) compiled into SQL predicates: a boolean expression
over a message's headers and subject, which a topic's publish routine evaluates for each
subscription, with no dynamic SQL at publish time.

Every key and value reaches the text as a string literal made here (checked, then escaped), and
is cast from there. No clause can raise (a type test guards each comparison), and each yields
true or false, never NULL: a missing header or subject fails it, as `dbq.contract.filters` (the
oracle) says.

- PostgreSQL (`pg_predicate`): headers as jsonb, each header read as text, numeric or boolean
  by its JSON type (numbers as exact decimals, as the oracle does), once per routine where many
  filters name it (`PgHeaderVariables`); literals in the `E'...'` form, whatever
  standard_conforming_strings says.
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


class PgHeaders:
    """How a compiled PostgreSQL predicate reads a message's headers (`headers`: an expression
    holding them as jsonb): header `key` as jsonb (NULL when absent), and as text, numeric or
    boolean when it is a JSON value of that type (NULL otherwise). Each read is written where a
    clause needs it: the form for one expression standing alone."""

    def __init__(self, headers: str) -> None:
        self.headers = headers

    def json(self, key: str) -> str:
        return f"({self.headers} -> {pg_text(key)})"

    def typed(self, key: str, of: str) -> str:
        return f"({_typed(self.json(key), of)})"


class PgHeaderVariables(PgHeaders):
    """The reads of a routine that tests many filters on one message: each header a filter names
    is read once into variables (`declarations`, then `assignments` after each message's
    headers are in `headers`), and every clause compares those: 64 filters on one key look the
    key up once, and compare numbers as numeric, strings as text, not jsonb to jsonb."""

    def __init__(self, headers: str) -> None:
        super().__init__(headers)
        self.keys: dict[str, int] = {}  # key -> its number in the variables' names
        self.kinds: dict[tuple[int, str], str] = {}  # (number, type) -> variable

    def _number(self, key: str) -> int:
        """The number of header `key` in its variables' names, given at its first read."""
        return self.keys.setdefault(key, len(self.keys) + 1)

    def json(self, key: str) -> str:
        return _json_variable(self._number(key))

    def typed(self, key: str, of: str) -> str:
        number = self._number(key)
        return self.kinds.setdefault((number, of), f"v_h{of[0]}{number}")

    def declarations(self) -> str:
        found = [f"{_json_variable(n)} jsonb;" for n in self.keys.values()]
        found += [f"{v} {PG_TYPES[of]};" for (_, of), v in self.kinds.items()]
        return " ".join(found)

    def assignments(self, indent: str) -> str:
        lines = [
            f"{indent}{_json_variable(n)} := {self.headers} -> {pg_text(key)};"
            for key, n in self.keys.items()
        ]
        lines += [
            f"{indent}{variable} := {_typed(_json_variable(n), of)};"
            for (n, of), variable in self.kinds.items()
        ]
        return "\n".join(lines)


def _json_variable(number: int) -> str:
    """The variable holding header `number` of a routine's reads as jsonb."""
    return f"v_hj{number}"


# The SQL type a header of each JSON type is compared as.
PG_TYPES = {"string": "text", "number": "numeric", "boolean": "boolean"}


def _typed(value: str, of: str) -> str:
    """`value` (a jsonb expression) as the SQL type of JSON type `of` when it is of that type, else
    NULL."""
    read = f"{value} #>> '{{}}'" if of == "string" else f"{value}::{PG_TYPES[of]}"
    return f"CASE WHEN jsonb_typeof({value}) = {pg_text(of)} THEN {read} END"


def pg_predicate(flt: Filter, headers: str | PgHeaders, subject: str) -> str:
    """The filter as one SQL boolean expression; `headers` is how it reads the headers (or an
    expression holding them as jsonb: a routine's parameter, say), `subject` the expression that
    holds the message's text subject."""
    reads = headers if isinstance(headers, PgHeaders) else PgHeaders(headers)
    clauses = [_pg_subject(c, subject) for c in flt.subject] + [_pg_header(c, reads) for c in flt.headers]
    return " AND ".join(f"({c})" for c in clauses) if clauses else "true"


def _pg_literal(value: Any) -> str:
    """A filter's value as a literal of the type its header is compared as."""
    of = kind(value)
    if of == "string":
        return pg_text(value)
    if of == "number":  # the JSON text of the number, read as an exact decimal, as jsonb reads it
        return f"{pg_text(json.dumps(value, allow_nan=False))}::numeric"
    return "true" if value else "false"


def _pg_among(reads: PgHeaders, key: str, values: list[Any], negated: bool) -> str:
    """The header is one of `values` (negated: of a type of theirs, and none of them): each of
    their types compared apart, a header having one type."""
    tests = []
    for of in sorted({kind(v) for v in values}):
        listed = ", ".join(_pg_literal(v) for v in values if kind(v) == of)
        tests.append(f"coalesce({reads.typed(key, of)} {'NOT ' if negated else ''}IN ({listed}), false)")
    return " OR ".join(tests)


def _pg_header(clause: HeaderClause, reads: PgHeaders) -> str:
    op, operand = operator_of(clause)
    key = clause.key
    if op == "exists":
        return f"{reads.json(key)} IS {'NOT ' if operand else ''}NULL"
    if op == "eq":
        return f"coalesce({reads.typed(key, kind(operand))} = {_pg_literal(operand)}, false)"
    if op in ("in", "notIn"):
        return _pg_among(reads, key, operand, op == "notIn")
    if op == "prefix":
        return f"coalesce(starts_with({reads.typed(key, 'string')}, {pg_text(operand)}), false)"
    return f"coalesce({reads.typed(key, 'number')} {COMPARISONS[op]} {_pg_literal(operand)}, false)"


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
