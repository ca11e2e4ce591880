"""Message headers: a flat mapping of string keys to string, integer, float or boolean values,
carried beside the body on every design.

On the wire and in the database a mapping is compact JSON text (UTF-8), keys sorted: a DBA reads
it in SQL, a routine can match on it (PostgreSQL's jsonb operators, SQL Server's JSON_VALUE),
and any language writes it. A message without headers stores NULL (on PostgreSQL one bit of the
null bitmap), never '{}'. Values travel as bound parameters, never inside SQL or CQL text.

Reserved keys start with `dbq-`: dbq writes them, a pusher may not. `content-type` is the one
well-known key a pusher sets.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dbq.api.limits import CONTROL, KEY_HINT, KEY_PATTERN

HeaderValue = str | int | float | bool
Headers = Mapping[str, HeaderValue]

RESERVED_PREFIX = "dbq-"
ERROR = "dbq-error"  # why a message was dead-lettered: nack(error=...) or the lease that expired
ATTEMPTS = "dbq-attempts"  # how many times it was acquired when it was dead-lettered
SUBJECT = "dbq-subject"  # a message published to a topic: its subject (routing key)
CONTENT_TYPE = "content-type"  # the body's media type, e.g. application/json (set by the pusher)

DEFAULT_HEADER_BYTES = 1024
DEFAULT_MAX_HEADERS = 32


@dataclass(frozen=True)
class StoredHeaders:
    """A message's headers as stored (`text()`), pushed again as they are: dbq's own re-pushes
    (a Spark stage given back, a sink's rows checked when staged) keep dbq's keys and are not
    checked a second time."""

    text: str | None


@dataclass(frozen=True)
class HeaderLimits:
    """spec.messages' limits on headers: their encoded size and how many keys."""

    header_bytes: int = DEFAULT_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS


def encode(
    headers: Headers | StoredHeaders | None, limits: HeaderLimits, *, reserved: bool = False
) -> str | None:
    """The JSON text stored for `headers`, or None for none. Raises ValueError naming the
    header and the rule before anything is written; `reserved`: dbq's own keys are allowed."""
    if headers is None:
        return None
    if isinstance(headers, StoredHeaders):
        return headers.text
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers is a mapping of names to values, not {type(headers).__name__}")
    if not headers:
        return None
    if len(headers) > limits.max_headers:
        raise ValueError(
            f"{len(headers)} headers are more than spec.messages.maxHeaders ({limits.max_headers}) allows:"
            " send fewer, or raise the limit in the Queue"
        )
    for key, value in headers.items():
        _check(key, value, reserved)
    stored = _json(headers)
    size = len(stored.encode())
    if size > limits.header_bytes:
        raise ValueError(
            f"headers of {size} bytes (as JSON) are larger than spec.messages.headerBytes ({limits.header_bytes}):"
            " send less in headers (put it in the body), or raise the limit in the Queue"
        )
    return stored


def encode_each(
    headers: Headers | Sequence[Headers | StoredHeaders | None] | None, count: int, limits: HeaderLimits
) -> list[str | None]:
    """The stored headers of `count` messages: `headers` is one mapping for all of them, or a
    sequence of one mapping (or None) per message."""
    if headers is None or isinstance(headers, Mapping):
        return [encode(headers, limits)] * count
    if isinstance(headers, str | bytes) or not isinstance(headers, Sequence):
        raise TypeError(
            "headers is one mapping for every message, or a list of one mapping (or None) per message"
        )
    if len(headers) != count:
        raise ValueError(
            f"headers has {len(headers)} mappings for {count} messages: give one per message, or one for all"
        )
    return [encode(h, limits) for h in headers]


def _check(key: object, value: object, reserved: bool) -> None:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"header name {key!r} is not valid: use {KEY_HINT}")
    if key.startswith(RESERVED_PREFIX) and not reserved:
        raise ValueError(
            f"header {key!r}: names starting with {RESERVED_PREFIX!r} are dbq's own; choose another name"
        )
    if not isinstance(value, str | int | float | bool):
        raise TypeError(f"header {key!r} is a string, integer, float or boolean, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"header {key!r} is {value}: a float header is a finite number")
    if isinstance(value, str) and CONTROL.search(value):
        raise ValueError(f"header {key!r} holds a control character: remove it (a tab is allowed)")


def text(headers: Headers | None) -> str | None:
    """Headers already checked (a message's) as stored: compact JSON, keys sorted; None for none."""
    return _json(headers) if headers else None


def as_text(headers: Headers) -> dict[str, str]:
    """Headers as a map of names to text (Spark's map<string,string>): a number or a boolean as
    its JSON text (7, 0.25, true)."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in headers.items()}


def _json(headers: Headers) -> str:
    return json.dumps(
        dict(headers), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def decode(stored: str | bytes | None) -> dict[str, HeaderValue]:
    """The mapping stored as JSON text (or its UTF-8 bytes); {} for none. Each call returns a
    mapping of its own (the messages of a batch often carry the same headers: parsed once)."""
    if stored is None or stored in ("", b""):
        return {}
    return dict(_parsed(stored if isinstance(stored, str) else bytes(stored).decode()))


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> dict[str, HeaderValue]:
    found = json.loads(text)
    if not isinstance(found, dict):
        raise ValueError(f"stored headers are not a JSON object: {text[:80]!r}")
    return found


def with_dead_letter_reason(stored: str | None, error: str | None, attempts: int) -> str:
    """Stored headers with dbq's dead-letter keys set: the reason (none when not known) and the
    attempts."""
    headers: dict[str, HeaderValue] = decode(stored)
    headers.pop(ERROR, None)
    if error is not None:
        headers[ERROR] = error[:4000]
    headers[ATTEMPTS] = attempts
    return _json(headers)


def without_dead_letter_reason(stored: str | None) -> str | None:
    """A redriven message's stored headers: as pushed, without dbq's dead-letter keys."""
    headers = decode(stored)
    headers.pop(ERROR, None)
    headers.pop(ATTEMPTS, None)
    return text(headers)
