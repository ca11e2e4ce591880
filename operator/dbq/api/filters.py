"""Subscription filters: which messages of a topic a subscription's queue gets.

A filter is structured data, never text: clauses on the message's subject (its routing key) and
on its headers, all of which must hold (no clause: every message). A clause names one key and
one operator. A header that is missing, or holds a value of another type than the clause's (the
string "100" against the number 100), fails the clause; only `exists: false` holds then. Numbers
compare as the decimal numbers their JSON text writes (100 equals 100.0); a boolean is not a
number. `eq`, `in` and `notIn` take strings and whole numbers, `is` a boolean, and lt/lte/gt/gte
any number. A message without a subject fails every subject clause.

One model gives the CRD its schema and CEL rules (`dbq.api.crd`), the evaluator the pipes
publish path runs and the tests take for the oracle (`dbq.contract.filters`), and the compiled
SQL predicates (`dbq.backends.filter_sql`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)

from dbq.api.limits import CONTROL, KEY_HINT, KEY_PATTERN, MAX_KEY_LENGTH
from dbq.api.models import Model

MAX_VALUES = 64  # values of one `in` or `notIn`
MAX_TEXT = 256  # characters of a string a clause compares with
MAX_HEADER_CLAUSES = 16
MAX_SUBJECT_CLAUSES = 4

INT64 = (-(2**63), 2**63 - 1)
# A value `eq`, `in` and `notIn` compare with: text or a whole number. A structural schema has no
# other union the API server's CEL can type, so booleans have their own operator (`is`), and
# fractions are compared with lt/lte/gt/gte.
_SCALAR_SCHEMA: dict[str, Any] = {
    "description": 'A string or a whole number; "100" and 100 are different values.',
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "maxLength": MAX_TEXT,
}
Scalar = Annotated[
    Annotated[StrictStr, Field(max_length=MAX_TEXT)] | Annotated[StrictInt, Field(ge=INT64[0], le=INT64[1])],
    WithJsonSchema(_SCALAR_SCHEMA),
]
Number = Annotated[StrictInt | StrictFloat, WithJsonSchema({"type": "number"})]
Values = Annotated[list[Scalar], Field(min_length=1, max_length=MAX_VALUES)]
Texts = Annotated[
    list[Annotated[str, Field(max_length=MAX_TEXT)]], Field(min_length=1, max_length=MAX_VALUES)
]

HEADER_OPERATORS = ("eq", "in", "notIn", "prefix", "exists", "is", "lt", "lte", "gt", "gte")
SUBJECT_OPERATORS = ("eq", "in", "notIn", "prefix")


def _one_of(operators: tuple[str, ...], where: str) -> dict[str, Any]:
    """The CEL rule: exactly one operator set (`in` is a CEL keyword, escaped `__in__`)."""
    fields = ", ".join(f"has(self.{'__in__' if op == 'in' else op})" for op in operators)
    return {
        "x-kubernetes-validations": [
            {
                "rule": f"[{fields}].filter(x, x).size() == 1",
                "message": f"{where} names exactly one operator of {', '.join(operators)}",
            }
        ]
    }


class HeaderClause(Model):
    model_config = ConfigDict(json_schema_extra=_one_of(HEADER_OPERATORS, "a header clause"))

    key: Annotated[str, Field(pattern=KEY_PATTERN.pattern, max_length=MAX_KEY_LENGTH)] = Field(
        description=f"The header the clause tests: {KEY_HINT}."
    )
    eq: Scalar | None = Field(
        default=None, description="Holds when the header equals this value (a string or a whole number)."
    )
    in_: Values | None = Field(
        default=None, alias="in", description="Holds when the header equals one of these."
    )
    not_in: Values | None = Field(
        default=None,
        description="Holds when the header is present, of a type of these values, and equals none of them.",
    )
    prefix: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)] | None = Field(
        default=None, description="Holds when the header is a string that starts with this one."
    )
    exists: bool | None = Field(
        default=None, description="true: holds when the header is present; false: when it is absent."
    )
    is_: StrictBool | None = Field(
        default=None, alias="is", description="Holds when the header is the boolean true (or false)."
    )
    lt: Number | None = Field(default=None, description="Holds when the header is a number below this one.")
    lte: Number | None = Field(
        default=None, description="Holds when the header is a number at most this one."
    )
    gt: Number | None = Field(default=None, description="Holds when the header is a number above this one.")
    gte: Number | None = Field(
        default=None, description="Holds when the header is a number at least this one."
    )

    @model_validator(mode="after")
    def _one_operator(self) -> HeaderClause:
        _check_operators(self, HEADER_OPERATORS, f"header clause on {self.key!r}")
        return self


class SubjectClause(Model):
    model_config = ConfigDict(json_schema_extra=_one_of(SUBJECT_OPERATORS, "a subject clause"))

    eq: Annotated[str, Field(max_length=MAX_TEXT)] | None = Field(
        default=None, description="Holds when the subject is this one."
    )
    in_: Texts | None = Field(default=None, alias="in", description="Holds when the subject is one of these.")
    not_in: Texts | None = Field(
        default=None, description="Holds when the message has a subject and it is none of these."
    )
    prefix: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)] | None = Field(
        default=None, description="Holds when the subject starts with this (`orders.eu.`)."
    )

    @model_validator(mode="after")
    def _one_operator(self) -> SubjectClause:
        _check_operators(self, SUBJECT_OPERATORS, "subject clause")
        return self


class Filter(Model):
    subject: Annotated[list[SubjectClause], Field(max_length=MAX_SUBJECT_CLAUSES)] = Field(
        default_factory=list,
        description="Clauses on the message's subject (its routing key), all of which hold.",
    )
    headers: Annotated[list[HeaderClause], Field(max_length=MAX_HEADER_CLAUSES)] = Field(
        default_factory=list, description="Clauses on the message's headers, all of which hold."
    )


def operator_of(clause: HeaderClause | SubjectClause) -> tuple[str, Any]:
    """The clause's one operator and its operand, as the evaluators take them: `is` is `eq` on a
    boolean (a value of another type never equals it)."""
    for name in HEADER_OPERATORS:
        value = getattr(clause, _attribute(name), None)
        if value is not None:
            return ("eq", value) if name == "is" else (name, value)
    raise AssertionError("a clause has one operator: checked when it was made")


def _attribute(operator: str) -> str:
    return {"in": "in_", "notIn": "not_in", "is": "is_"}.get(operator, operator)


def _check_operators(clause: HeaderClause | SubjectClause, operators: tuple[str, ...], where: str) -> None:
    given = [op for op in operators if getattr(clause, _attribute(op)) is not None]
    if len(given) != 1:
        raise ValueError(
            f"a {where} names exactly one operator of {', '.join(operators)}, not {len(given)}"
            f"{' (' + ', '.join(given) + ')' if given else ''}: split it into one clause per operator"
        )
    _, operand = operator_of(clause)
    for value in operand if isinstance(operand, list) else [operand]:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
        if isinstance(value, str) and CONTROL.search(value):
            raise ValueError(f"{where}: {value!r} holds a control character (a header value cannot)")
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise ValueError(f"{where}: a value is at most {MAX_TEXT} characters")
