"""A static check of the T-SQL dbq renders, for the mistakes a reading against Microsoft's
documentation found and that no SQL Server here can catch. It reads rendered statements (what
SQL Server would run), not the Python that builds them.

Rules:
- `applock-unchecked`: `sp_getapplock` returns < 0 when the lock is not granted (-999 when a
  Transaction-owned lock is asked outside a transaction) and raises nothing: its return code must
  be kept (`EXEC @v = sp_getapplock`) and tested, and a Transaction-owned one needs
  `@@TRANCOUNT` checked in the same batch.
- `rowcount-late`: `@@ROWCOUNT` only in `SET @v = @@ROWCOUNT` (or `+=`) right after the DML (or RECEIVE) it
  counts: statements such as IF may reset it.
- `dateadd-ms-overflow`: `DATEADD(millisecond, n, ...)` takes an int; a bigint number of
  milliseconds past 2^31 (about 596 hours) overflows. The number must be a literal or `x % 1000`
  (seconds go through `DATEADD(second, x / 1000, ...)`).
- `cleanup-outside-error-path`: `END CONVERSATION ... WITH CLEANUP` tells the other side nothing;
  only in a statement marked `-- dbq: error path` (errored or long-dead endpoints, forced teardown).
- `above-version-floor`: a feature newer than dbq's floor, SQL Server 2017 (14.x) at database
  compatibility level 130.
- `sequence-read-alone`: `sys.sequences.last_used_value` is documented for NEXT VALUE FOR only
  (not sys.sp_sequence_get_range): a sequence's last value is read with
  `dbq.contract.broker.SEQUENCE_DRAWN`, never from last_used_value alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dbq.contract.broker import SEQUENCE_DRAWN

ERROR_PATH_MARK = "-- dbq: error path"
# Features newer than SQL Server 2017 / compatibility level 130, by their syntax.
ABOVE_FLOOR = {
    "GREATEST/LEAST (2022)": r"\b(GREATEST|LEAST)\s*\(",
    "GENERATE_SERIES (2022)": r"\bGENERATE_SERIES\s*\(",
    "DATE_BUCKET/DATETRUNC (2022)": r"\b(DATE_BUCKET|DATETRUNC)\s*\(",
    "JSON_OBJECT/JSON_ARRAY (2022)": r"\bJSON_(OBJECT|ARRAY)\s*\(",
    "IS [NOT] DISTINCT FROM (2022)": r"\bIS\s+(NOT\s+)?DISTINCT\s+FROM\b",
    "APPROX_COUNT_DISTINCT (2019)": r"\bAPPROX_(COUNT_DISTINCT|PERCENTILE_\w+)\s*\(",
    "STRING_SPLIT with enable_ordinal (2022)": r"\bSTRING_SPLIT\s*\([^()]*,[^()]*,",
    "LTRIM/RTRIM with characters (2022)": r"\b[LR]TRIM\s*\([^()]*,",
    "TRIM LEADING/TRAILING/BOTH (2022)": r"\bTRIM\s*\(\s*(LEADING|TRAILING|BOTH)\b",
    "WINDOW clause (2022)": r"\bWINDOW\s+\w+\s+AS\s*\(",
    "OPTIMIZE_FOR_SEQUENTIAL_KEY (2019)": r"\bOPTIMIZE_FOR_SEQUENTIAL_KEY\b",
}
_DML = re.compile(r"^(UPDATE|INSERT|DELETE|MERGE|RECEIVE)\b", re.I)


@dataclass(frozen=True)
class Finding:
    rule: str
    at: str  # the text around the mistake

    def __str__(self) -> str:
        return f"{self.rule}: ...{self.at}..."


def _code(statement: str) -> str:
    """The statement without comments and string literals' contents, so neither is checked."""
    text = re.sub(r"N?'(?:[^']|'')*'", "''", statement)
    return re.sub(r"--[^\n]*", "", text)


def _around(text: str, at: int) -> str:
    return " ".join(text[max(0, at - 60) : at + 60].split())


def _argument(text: str, start: int) -> str:
    """The text from `start` to the comma or parenthesis that ends this argument."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        i += 1
    return text[start:i].strip()


def applock_unchecked(code: str) -> list[Finding]:
    out = []
    for m in re.finditer(r"\bsp_getapplock\b", code, re.I):
        kept = re.search(r"EXEC(?:UTE)?\s+(@\w+)\s*=\s*(?:sys\.)?$", code[: m.start()], re.I)
        tested = kept and re.search(
            rf"(IF|WHEN)\s+{re.escape(kept.group(1))}\s*(<|>|=)", code[m.end() :], re.I
        )
        if not tested:
            out.append(Finding("applock-unchecked", _around(code, m.start())))
        call = _argument(code, m.end()) + code[m.end() : m.end() + 200]
        owned_by_transaction = re.search(r"@LockOwner\s*=\s*'Transaction'", call, re.I) or not re.search(
            r"@LockOwner", call, re.I
        )
        if owned_by_transaction and "@@TRANCOUNT" not in code.upper():
            why = "Transaction-owned lock without @@TRANCOUNT: "
            out.append(Finding("applock-unchecked", why + _around(code, m.start())))
    return out


def rowcount_late(code: str) -> list[Finding]:
    out = []
    for m in re.finditer(r"@@ROWCOUNT", code, re.I):
        head = code[: m.start()]
        assignment = re.search(r"\bSET\s+@\w+\s*\+?=\s*$", head, re.I)
        prior = head[: assignment.start()].rstrip() if assignment else ""
        # The statement before the SET, back to the previous `;` or BEGIN (an IF or ELSE in front
        # of the DML makes it conditional, and is found).
        previous = re.split(r";|\bBEGIN\b", prior[:-1], flags=re.I)[-1].strip() if prior.endswith(";") else ""
        if not _DML.match(previous):
            out.append(Finding("rowcount-late", _around(code, m.start())))
    return out


def dateadd_ms_overflow(code: str) -> list[Finding]:
    out = []
    for m in re.finditer(r"\bDATEADD\s*\(\s*(millisecond|ms)\s*,", code, re.I):
        number = _argument(code, m.end())
        if not (re.fullmatch(r"-?\d+", number) or re.search(r"%\s*1000\s*\)*$", number)):
            out.append(Finding("dateadd-ms-overflow", _around(code, m.start())))
    return out


def cleanup_outside_error_path(statement: str, code: str) -> list[Finding]:
    if ERROR_PATH_MARK in statement:
        return []
    return [Finding("cleanup-outside-error-path", _around(code, m.start()))
            for m in re.finditer(r"\bWITH\s+CLEANUP\b", code, re.I)]  # fmt: skip


def above_version_floor(code: str) -> list[Finding]:
    return [
        Finding("above-version-floor", f"{feature}: " + _around(code, m.start()))
        for feature, pattern in ABOVE_FLOOR.items()
        for m in re.finditer(pattern, code, re.I)
    ]


def sequence_read_alone(code: str) -> list[Finding]:
    rest = re.sub(r"\s+", " ", code).replace(re.sub(r"\s+", " ", SEQUENCE_DRAWN), "SEQUENCE_DRAWN")
    return [
        Finding("sequence-read-alone", _around(rest, m.start()))
        for m in re.finditer(r"\blast_used_value\b", rest, re.I)
    ]


def findings(statement: str) -> list[Finding]:
    code = _code(statement)
    return [
        *applock_unchecked(code),
        *rowcount_late(code),
        *dateadd_ms_overflow(code),
        *cleanup_outside_error_path(statement, code),
        *above_version_floor(code),
        *sequence_read_alone(code),
    ]
