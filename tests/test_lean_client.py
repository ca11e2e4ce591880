"""The lean install: `pip install dbq-operator` into a fresh virtualenv is the client alone (no
operator, Kubernetes, Cassandra or Spark packages), and it pushes and pops on the local
PostgreSQL from Python and from the `dbq` command; the operator's commands name the extra they
need."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = {"kopf", "kubernetes", "cassandra-driver", "pyspark", "pyarrow", "prometheus-client", "PyYAML"}


@pytest.fixture(scope="module")
def lean(tmp_path_factory) -> Path:
    """A fresh virtualenv with `pip install <this tree>` and nothing else; its bin directory."""
    venv = tmp_path_factory.mktemp("lean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    done = subprocess.run([*pip, "install", str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return venv / "bin"


@pytest.fixture
def queue(postgres) -> Iterator[tuple[str, str]]:
    name = f"q_{secrets.token_hex(3)}"
    backend = OdbcRing(from_url(postgres.url), RingTarget(QueueNames("lean", name), 100, 64))
    backend.apply()
    yield postgres.url, name
    backend.teardown()
    backend.close()


def installed(bin_dir: Path) -> set[str]:
    out = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {p["name"] for p in json.loads(out)}


def test_the_lean_install_leaves_the_operator_out(lean):
    packages = installed(lean)
    assert "dbq-operator" in packages
    assert not packages & LEFT_OUT, packages & LEFT_OUT
    assert len(packages) < 20, sorted(packages)  # the whole operator brought 51


def test_the_lean_client_pushes_and_pops_from_python(lean, queue):
    url, name = queue
    script = f"""
from dbq.client import connect
with connect({url!r}, {name!r}, schema="lean") as q:
    ids = q.push_many([b"a", b"b"])
    m = q.acquire(timeout=1)
    m.ack()
    print(ids, m.body.decode(), q.pop(timeout=1).body.decode(), q.stats().depth)
"""
    done = subprocess.run([str(lean / "python"), "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-3:] == ["a", "b", "0"]


def test_the_lean_dbq_command_pushes_and_pops_and_names_the_extras_it_lacks(lean, queue):
    url, name = queue
    dbq = [str(lean / "dbq")]
    where = ["--url", url, "--schema", "lean"]
    pushed = subprocess.run([*dbq, "push", name, "hello", *where], capture_output=True, text=True)
    assert pushed.returncode == 0, pushed.stderr
    popped = subprocess.run([*dbq, "pop", name, *where, "-o", "json"], capture_output=True, text=True)
    assert popped.returncode == 0, popped.stderr
    assert [m["body"] for m in json.loads(popped.stdout)] == ["hello"]
    for command, extra in ((["run"], "operator"), (["apply", "x.yaml"], "operator"), (["pop", name], "kube")):
        done = subprocess.run([*dbq, *command], capture_output=True, text=True)
        assert done.returncode != 0 and f"pip install 'dbq-operator[{extra}]'" in done.stderr, done.stderr
