"""Whether a message matches a subscription's filter (`dbq.api.filters`), in Python.

The pipes publish path routes with it, and the tests take it for the oracle the compiled SQL
predicates must agree with. Numbers compare as the decimal numbers their JSON text writes, as
PostgreSQL's jsonb does: 1e+23 (a float) is not the integer 99999999999999991611392, though
Python's own `==` says it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from dbq.api.filters import Filter, HeaderClause, SubjectClause, operator_of
from dbq.contract.headers import HeaderValue

_ABSENT = object()


def matches(flt: Filter, subject: str | None, headers: Mapping[str, HeaderValue] | None) -> bool:
    """Whether every clause of `flt` holds for a message of this subject and these headers."""
    found = headers or {}
    return all(_subject_holds(c, subject) for c in flt.subject) and all(
        _header_holds(c, found.get(c.key, _ABSENT)) for c in flt.headers
    )


def kind(value: object) -> str:
    """A value's JSON type: string, number or boolean."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string"


def _number(value: int | float) -> Decimal:
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def _same(a: Any, b: Any) -> bool:
    if kind(a) != kind(b):
        return False
    return _number(a) == _number(b) if kind(a) == "number" else bool(a == b)


def _header_holds(clause: HeaderClause, value: Any) -> bool:
    op, operand = operator_of(clause)
    if op == "exists":
        return (value is not _ABSENT) == operand
    if value is _ABSENT:
        return False
    if op == "eq":
        return _same(value, operand)
    if op == "in":
        return any(_same(value, v) for v in operand)
    if op == "notIn":
        return kind(value) in {kind(v) for v in operand} and not any(_same(value, v) for v in operand)
    if op == "prefix":
        return isinstance(value, str) and value.startswith(operand)
    if kind(value) != "number":
        return False
    a, b = _number(value), _number(operand)
    return {"lt": a < b, "lte": a <= b, "gt": a > b, "gte": a >= b}[op]


def _subject_holds(clause: SubjectClause, subject: str | None) -> bool:
    if subject is None:
        return False
    op, operand = operator_of(clause)
    if op == "eq":
        return bool(subject == operand)
    if op == "in":
        return subject in operand
    if op == "notIn":
        return subject not in operand
    return subject.startswith(operand)
