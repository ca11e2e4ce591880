"""One step of an online resize in a process of its own, as the operator runs it (so the crash
tests can SIGKILL it at any point):

    resize_step.py resize URL SCHEMA QUEUE SIZE   # prepare and switch (OdbcRing.resize)
    resize_step.py retire URL SCHEMA QUEUE SIZE   # retire until one ring is left (OdbcRing.retire)
"""

from __future__ import annotations

import sys
import time

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url


def ring(url: str, schema: str, queue: str, size: int) -> OdbcRing:
    spec = QueueSpec.model_validate(
        {
            "backend": "postgres",
            "design": "ring",
            "connection": {"secretRef": {"name": "s"}, "schema": schema},
            "ring": {"size": size},
        }
    )
    made = open_backend(spec, queue, from_url(url))
    assert isinstance(made, OdbcRing)
    return made


def main() -> None:
    step, url, schema, queue, size = sys.argv[1:6]
    backend = ring(url, schema, queue, int(size))
    if step == "resize":
        backend.resize()
        return
    while (done := backend.retire()) is None or done.resizing:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
