"""The docs' runnable examples: every fenced `sh` or `python` block right after a
`<!-- runnable -->` line (run against the local stack by `tests/test_docs_examples.py`), after
`<!-- runnable: spark -->` (Python run with a SparkSession as `spark`, by the Spark tests), or
after `<!-- runnable: cassandra -->` (run with the Secret `events-cassandra` for the stack's
Cassandra as well, by `tests/test_queue_user.py`), or after `<!-- runnable: keda -->` (run with
KEDA and the single-node cluster up and the consumers' image in WORKER_IMAGE, by
`tests/test_keda.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
_RUNNABLE = re.compile(
    r"^<!-- runnable(?:: (spark|cassandra|keda))? -->\n```(sh|python)\n(.*?)^```$", re.M | re.S
)


@dataclass(frozen=True)
class Example:
    page: str  # relative to docs/
    line: int
    language: str  # sh | python
    code: str
    needs: str  # stack | spark | cassandra | keda

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line}"


def in_namespace(text: str, namespace: str) -> str:
    """`text` (an example, a manifest) with the docs' namespace `shop` replaced by `namespace`, so a
    test runs the examples in a namespace of its own."""
    return re.sub(r"\bshop\b", namespace, text)


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    return [
        Example(
            page=str(page.relative_to(DOCS)),
            line=text.count("\n", 0, m.start()) + 2,
            language=m.group(2),
            code=m.group(3),
            needs=m.group(1) or "stack",
        )
        for m in _RUNNABLE.finditer(text)
    ]


def pages_with_examples(needs: str = "stack", docs: Path = DOCS) -> dict[str, list[Example]]:
    """Page (relative to docs/) -> its runnable examples that need `needs`, in order, for every
    page that has some."""
    found = {
        str(p.relative_to(docs)): [e for e in examples(p) if e.needs == needs]
        for p in sorted(docs.rglob("*.md"))
    }
    return {page: here for page, here in found.items() if here}
