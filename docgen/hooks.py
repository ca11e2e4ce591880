"""mkdocs hooks (`mkdocs.yml`: hooks): generated tables in place of their markers, and the
performance charts as generated files.

A page asks for a table with `<!-- dbq:reference NAME -->` (`docgen.reference.GENERATORS`) or
`<!-- dbq:bench NAME -->` (`docgen.performance.TABLES`); an unknown name fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # docgen and stack, from the repo root

from docgen import performance, reference

CHARTS_DIR = "performance/charts"
_MARKER = re.compile(r"<!-- dbq:(reference|bench) ([a-z-]+) -->")


def expand(markdown: str) -> str:
    """The page with every marker replaced by its generated table."""

    def table(match: re.Match[str]) -> str:
        kind, name = match.groups()
        generators: dict[str, Any] = reference.GENERATORS if kind == "reference" else performance.TABLES
        if name not in generators:
            raise KeyError(f"<!-- dbq:{kind} {name} -->: no such table; known: {', '.join(generators)}")
        return str(generators[name]())

    return _MARKER.sub(table, markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, png in performance.charts().items():
        files.append(File.generated(config, f"{CHARTS_DIR}/{name}", content=png))
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)
