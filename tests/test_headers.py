"""Headers as stored: the encoding every design shares, and the refusals before anything is written."""

from __future__ import annotations

import json

import pytest

from dbq.contract import headers
from dbq.contract.headers import HeaderLimits

LIMITS = HeaderLimits()


def test_headers_round_trip_with_their_types_and_store_compact_sorted_json():
    given = {"trace": "00-abc-01", "n": 3, "ratio": 0.5, "urgent": True, "content-type": "application/json"}
    text = headers.encode(given, LIMITS)
    assert text == json.dumps(given, sort_keys=True, separators=(",", ":"))
    back = headers.decode(text)
    assert back == given and type(back["n"]) is int and type(back["urgent"]) is bool
    assert headers.decode(text.encode()) == given  # as a record carries them, UTF-8


def test_no_headers_store_null_not_an_empty_object():
    assert headers.encode(None, LIMITS) is None and headers.encode({}, LIMITS) is None
    assert headers.decode(None) == {} and headers.decode(b"") == {}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"bad key": "x"}, "'bad key'"),
        ({"": "x"}, "''"),
        ({"a\nb": "x"}, "'a\\nb'"),
        ({"trailing\n": "x"}, "'trailing\\n'"),
        ({"k": "line\x00"}, "'k'"),
        ({"k": float("nan")}, "'k'"),
        ({"dbq-error": "mine"}, "'dbq-error'"),
    ],
)
def test_bad_headers_are_refused_naming_the_header(given, named):
    with pytest.raises(ValueError, match=named.replace("\\", "\\\\").replace("(", r"\(")):
        headers.encode(given, LIMITS)


def test_a_value_of_another_type_is_refused_naming_the_header():
    with pytest.raises(TypeError, match="'k' is a string, integer, float or boolean, not list"):
        headers.encode({"k": [1]}, LIMITS)


def test_limits_name_the_spec_field_and_the_figure():
    with pytest.raises(ValueError, match=r"spec.messages.headerBytes \(64\)"):
        headers.encode({"k": "x" * 100}, HeaderLimits(header_bytes=64))
    with pytest.raises(ValueError, match=r"spec.messages.maxHeaders \(2\)"):
        headers.encode({"a": 1, "b": 2, "c": 3}, HeaderLimits(max_headers=2))
    assert headers.encode({"k": "é" * 10}, HeaderLimits(header_bytes=28)) is not None  # bytes, not characters
    with pytest.raises(ValueError, match="27"):
        headers.encode({"k": "é" * 10}, HeaderLimits(header_bytes=27))


def test_dbq_writes_its_reserved_keys_beside_the_pushers():
    stored = headers.encode({"trace": "t"}, LIMITS)
    dead = headers.decode(headers.with_dead_letter_reason(stored, "boom", 3))
    assert dead == {"trace": "t", headers.ERROR: "boom", headers.ATTEMPTS: 3}
    assert headers.encode(dead, LIMITS, reserved=True) is not None
