"""What every dbq data source shares: its name, schema and options declared on the class
(`Source`), and the options read through `Options`, which refuses a bad or unknown one with an
error naming it and the fix (a `DbqError`, reason InvalidSpec)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import ClassVar

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from dbq.api.durations import time_or_ago
from dbq.errors import InvalidSpec


class Options:
    """The options given to one source, checked against the ones it declares."""

    def __init__(self, source: str, given: Mapping[str, str], known: Mapping[str, str]) -> None:
        self.source = source
        self.known = known  # option -> what it is, for the error messages
        lowered = {k.lower(): k for k in known}
        self.values: dict[str, str] = {}
        for key, value in given.items():
            if key.lower() == "path":  # Spark passes load()'s argument as `path`
                continue
            if key.lower() not in lowered:
                names = ", ".join(sorted(known))
                raise InvalidSpec(f"{source}: unknown option {key!r}: the options are {names}")
            self.values[lowered[key.lower()]] = str(value)

    def text(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def names(self, name: str) -> list[str]:
        """A comma-separated list, blanks dropped."""
        return [part.strip() for part in self.text(name).split(",") if part.strip()]

    def count(self, name: str, default: int, *, minimum: int = 1) -> int:
        raw = self.values.get(name)
        if raw is None:
            return default
        if not re.fullmatch(r"[0-9]+", raw.strip()) or int(raw) < minimum:
            raise InvalidSpec(f"{self.source}: option {name}={raw!r}: write a whole number >= {minimum}")
        return int(raw)

    def time(self, name: str, default: datetime, now: datetime) -> datetime:
        """An ISO 8601 time (UTC unless it says otherwise), or a duration before `now` ("24h")."""
        raw = self.values.get(name, "").strip()
        if not raw:
            return default
        try:
            return time_or_ago(raw, now)
        except ValueError:
            raise InvalidSpec(
                f"{self.source}: option {name}={raw!r}: write an ISO 8601 time such as"
                " 2026-11-23T08:00:00Z, or a duration before now such as 24h or 90m"
            ) from None


class SourceReader(DataSourceReader):
    """A dbq source's reader (abstract, as DataSourceReader is): made from the checked options."""

    def __init__(self, options: Options) -> None:
        """Each reader reads the options it declared."""


class Source(DataSource):
    """A dbq data source: NAME (the format), SCHEMA, OPTIONS (option -> what it is) and READER
    (made from the options, checked against OPTIONS) declared by each subclass."""

    NAME: ClassVar[str]
    SCHEMA: ClassVar[str]
    OPTIONS: ClassVar[Mapping[str, str]]
    READER: ClassVar[type[SourceReader]]

    @classmethod
    def name(cls) -> str:
        return cls.NAME

    def schema(self) -> str:
        return self.SCHEMA

    def checked_options(self) -> Options:
        return Options(self.NAME, self.options, self.OPTIONS)

    def reader(self, schema: StructType) -> DataSourceReader:
        return self.READER(self.checked_options())
