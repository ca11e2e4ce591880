"""The docs' runnable examples: every fenced `sh` or `python` block right after a
`<!-- runnable -->` line. `tests/test_docs_examples.py` runs them, page by page, in order."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
_RUNNABLE = re.compile(r"^<!-- runnable -->\n```(sh|python)\n(.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Example:
    page: str  # relative to docs/
    line: int
    language: str  # sh | python
    code: str

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line}"


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    return [
        Example(str(page.relative_to(DOCS)), text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2))
        for m in _RUNNABLE.finditer(text)
    ]


def pages_with_examples(docs: Path = DOCS) -> dict[str, list[Example]]:
    """Page (relative to docs/) -> its runnable examples in order, for every page that has some."""
    found = {str(p.relative_to(docs)): examples(p) for p in sorted(docs.rglob("*.md"))}
    return {page: found_here for page, found_here in found.items() if found_here}
