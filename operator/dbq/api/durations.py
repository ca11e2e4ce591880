"""Durations in the Go/Kubernetes spelling (`500ms`, `30s`, `5m`, `1h30m`, `24h`).

The same spelling is understood by CEL's `duration()` in the API server, so ranges are
checked at admission and again here, by one table of bounds per field.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, Field

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> timedelta:
    """`1h30m` -> timedelta(hours=1, minutes=30); raises ValueError naming the accepted form."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration: write it like 500ms, 30s, 5m, 1h30m or 24h")
    return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text)))


def time_or_ago(text: str, now: datetime) -> datetime:
    """A point in time written as a duration before `now` (`24h`) or as an ISO 8601 time (UTC
    unless it names a zone); ValueError for anything else."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    when = datetime.fromisoformat(text)  # raises ValueError on what it cannot read
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def format_duration(seconds: float) -> str:
    """Shortest spelling CEL also accepts: 90 -> `1m30s`."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = "", round(seconds)
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out


def Duration(minimum: str, maximum: str, *, allow_zero: bool = False) -> Any:
    """A duration field bounded to [minimum, maximum] (optionally also `0s`), checked in
    Python and, through the CRD's CEL rule, by the API server."""
    lo, hi = parse_duration(minimum), parse_duration(maximum)

    def check(value: str) -> str:
        d = parse_duration(value)
        if allow_zero and d == timedelta(0):
            return value
        if not lo <= d <= hi:
            zero = " or 0s to turn it off" if allow_zero else ""
            raise ValueError(f"{value} is out of range: use a duration from {minimum} to {maximum}{zero}")
        return value

    rule = f"duration(self) >= duration('{minimum}') && duration(self) <= duration('{maximum}')"
    if allow_zero:
        rule = f"duration(self) == duration('0s') || ({rule})"
    zero_note = " or 0s to turn it off" if allow_zero else ""
    return Annotated[
        str,
        Field(
            pattern=DURATION_PATTERN,
            json_schema_extra={
                "x-kubernetes-validations": [
                    {"rule": rule, "message": f"must be a duration from {minimum} to {maximum}{zero_note}"}
                ]
            },
        ),
        AfterValidator(check),
    ]


@functools.lru_cache(maxsize=256)  # a spec's few durations, read on every upkeep tick
def seconds(value: str) -> float:
    return parse_duration(value).total_seconds()
