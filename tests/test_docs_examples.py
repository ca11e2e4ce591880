"""Every runnable example of the docs (a `sh` or `python` block after `<!-- runnable -->`) runs
against the real local stack, page by page, in order, so a doc that rots fails CI.

Each page runs as a reader would after `make demo`: kubectl and dbq on PATH, KUBECONFIG set, an
operator watching the namespace, and the Secret `orders-db` in it. Two things differ, so that
the examples never touch a developer's own demo: the namespace `shop` is a fresh namespace of
this module (the word `shop` in an example is replaced by its name), and the Secret points at a
database of this module's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docgen.examples import Example, in_namespace, pages_with_examples
from tests.local import NODE_MODULES, scratch_database
from tests.operator_harness import ROOT, Operator, operator_namespace, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.postgres]

PAGES = pages_with_examples()
GETTING_STARTED = "getting-started.md"
# The guides run against the Queue `shop/orders` that `make demo` applies.
DEMO_QUEUE = ROOT / "manifests" / "examples" / "queue-postgres.yaml"


@pytest.fixture(scope="module")
def reader(stack, kube, tmp_path_factory):
    """(namespace, environment, cluster helpers) of a reader after `make demo`."""
    stack.need("postgres")
    with scratch_database(stack, "dbq_docs") as database:
        cluster = operator_namespace(kube, database, "docs")
        operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("operator") / "operator.log")
        operator.start()
        venv_bin = str(Path(sys.executable).parent)
        env = {**os.environ, "KUBECONFIG": kube.kubeconfig, "PATH": f"{venv_bin}:{os.environ['PATH']}",
               "NODE_PATH": str(NODE_MODULES)}  # fmt: skip  # what `npm install pg` gives a reader
        try:
            yield cluster.ns, env, cluster
        finally:
            cluster.force_delete_all(180)
            operator.stop()


def run(example: Example, namespace: str, env: dict[str, str]) -> str:
    code = in_namespace(example.code, namespace)
    command = (
        ["bash", "-euo", "pipefail", "-c", code] if example.language == "sh" else [sys.executable, "-c", code]
    )
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"{example} ({example.language}) exited {done.returncode}\n--- code\n{code}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    return done.stdout


def test_the_docs_have_runnable_examples_where_a_reader_starts():
    assert len(PAGES.get(GETTING_STARTED, [])) >= 5, "Getting started lost its runnable examples"
    for page in ("developers/python.md", "developers/workers.md", "developers/any-language.md"):
        assert PAGES.get(page), f"{page} has no runnable example"


def test_getting_started_runs_as_written(reader):
    namespace, env, cluster = reader
    outputs = [run(example, namespace, env) for example in PAGES[GETTING_STARTED]]
    apply, shell, user, python, inspect, cleanup = outputs
    assert "tasks" in apply and "True" in apply  # kubectl get queues: Ready
    assert "hello" in shell and "world" in shell  # dbq pop printed the bodies
    assert "tasks-app" in user and "as the app" in user  # the QueueUser, and what it popped
    assert "resize image 42" in python and "refused: manage" in python
    assert "tasks_ring" in inspect and "tasks_push_seq" in inspect
    assert "tasks_ring" not in cleanup  # the queue's objects were dropped
    assert not cluster.exists("tasks") and not cluster.of("queueusers").exists("tasks-app")


@pytest.mark.parametrize("page", sorted(set(PAGES) - {GETTING_STARTED}))
def test_guide_runs_as_written(reader, page):
    namespace, env, cluster = reader
    queue = yaml.safe_load(in_namespace(DEMO_QUEUE.read_text(), namespace))
    cluster.create(queue)
    try:
        cluster.wait_condition("orders", "Ready", "True", 120)
        for example in PAGES[page]:
            print(run(example, namespace, env))
    finally:
        cluster.patch("orders", {"metadata": {"annotations": {"dbq.dev/force-delete": "true"}}})
        cluster.delete("orders")
        wait_for(lambda: not cluster.exists("orders"), 120, "the Queue orders deleted")
