"""Index and table maintenance of ring queues: what to measure, and what to do about it.

`plan_maintenance` is pure: from measured figures and the spec's thresholds it picks, per
object, VACUUM (dead rows), REINDEX or REBUILD/REORGANIZE (index bloat or fragmentation). The
dialects render the actions; `OdbcRing.maintain` runs them under a lock that outlives the
operator's process, so a restarted operator never starts a second run beside one still going.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# An index this small is all noise: its bloat is not worth a rebuild.
MIN_INDEX_PAGES = 16
# Bytes an index entry of a bigint key takes on a btree leaf page (tuple header, key, line pointer).
BTREE_ENTRY_BYTES = 20
PAGE_BYTES = 8192
BTREE_FILL = 0.9


@dataclass(frozen=True)
class TableFigures:
    table: str
    live_rows: int
    dead_rows: int

    @property
    def dead_percent(self) -> float:
        total = self.live_rows + self.dead_rows
        return 100.0 * self.dead_rows / total if total else 0.0


@dataclass(frozen=True)
class IndexFigures:
    index: str
    table: str
    pages: int
    rows: int
    fragmentation: float | None = None  # SQL Server reports it; PostgreSQL's is estimated

    @property
    def bloat_percent(self) -> float:
        if self.fragmentation is not None:
            return self.fragmentation
        if self.pages < MIN_INDEX_PAGES:
            return 0.0
        expected = math.ceil(self.rows * BTREE_ENTRY_BYTES / (PAGE_BYTES * BTREE_FILL)) + 1
        return max(0.0, 100.0 * (1 - expected / self.pages))


@dataclass(frozen=True)
class MaintenanceStep:
    action: str  # vacuum | reindex | reorganize | rebuild
    target: str  # table or index name (unquoted, validated by the caller)
    table: str
    why: str


@dataclass
class MaintenanceResult:
    result: str  # Succeeded | NotNeeded | Skipped | Failed
    message: str
    steps: list[MaintenanceStep] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def figures(tables: list[TableFigures], indexes: list[IndexFigures]) -> dict[str, float]:
    """What status shows: dead-row % per table, bloat or fragmentation % per index."""
    out = {f"{t.table} dead %": t.dead_percent for t in tables}
    out |= {f"{i.index} bloat %": i.bloat_percent for i in indexes}
    return out


def plan_maintenance(
    tables: list[TableFigures],
    indexes: list[IndexFigures],
    *,
    dead_percent: float,
    fragmentation_percent: float,
    dialect: str,
) -> list[MaintenanceStep]:
    steps: list[MaintenanceStep] = []
    for t in tables:
        if t.dead_percent >= dead_percent:
            why = f"{t.dead_percent:.1f}% dead rows >= {dead_percent:g}%"
            steps.append(MaintenanceStep("vacuum", t.table, t.table, why))
    for i in indexes:
        bloat = i.bloat_percent
        if bloat < fragmentation_percent:
            if dialect == "sqlserver" and bloat >= 5:  # the usual light touch below the threshold
                steps.append(MaintenanceStep("reorganize", i.index, i.table, f"{bloat:.1f}% fragmented"))
            continue
        action = "rebuild" if dialect == "sqlserver" else "reindex"
        steps.append(MaintenanceStep(action, i.index, i.table, f"{bloat:.1f}% >= {fragmentation_percent:g}%"))
    return steps
