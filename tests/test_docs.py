"""The docs' generated parts follow the code, and the docs speak of the product only.

The reference tables come from the pydantic models, `dbq.errors` and the metrics registry; each
test changes one of them and sees the table change. The performance tables come from
`bench/results/`. The README stays a front door."""

from __future__ import annotations

import re
import subprocess

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from dbq import errors
from dbq.api.models import QueueSpec, Ring
from dbq.controller import metrics as operator_metrics
from docgen import hooks, performance, reference
from tests.operator_harness import ROOT


@pytest.fixture
def ring_size_description():
    """spec.ring.size's description, restored after the test."""
    field = Ring.model_fields["size"]
    before = field.description
    yield field
    field.description = before
    Ring.model_rebuild(force=True)
    QueueSpec.model_rebuild(force=True)


def test_a_changed_field_description_changes_the_spec_reference(ring_size_description):
    assert "Preallocated slots" in reference.queue_spec()
    ring_size_description.description = "Slots of the ring, as the docs test rewrote them."
    Ring.model_rebuild(force=True)
    QueueSpec.model_rebuild(force=True)
    page = reference.queue_spec()
    row = next(line for line in page.splitlines() if line.startswith("| `spec.ring.size`"))
    assert "Slots of the ring, as the docs test rewrote them." in row
    assert "**Immutable.**" not in row and "16..10000000" in row and "`100000`" in row  # resized online


def test_the_spec_reference_has_every_field_and_the_admission_rules():
    page = reference.queue_spec()
    for field in ("spec.backend", "spec.deadLetter.maxAttempts", "spec.reindex.threshold.fragmentationPercent",
                  "spec.serviceBroker.activation.procedure", "spec.deletionPolicy"):  # fmt: skip
        assert f"| `{field}` |" in page, field
    assert "does not exist on backend" in page  # the backend/design rule's message
    assert "| `status.stats.depth` |" in reference.queue_status()


def test_a_new_reason_in_dbq_errors_changes_the_reasons_reference(monkeypatch):
    class ReplicaMissing(errors.DbqError):
        """A replica of the keyspace is down."""

        reason = "ReplicaMissing"
        retry = False
        fix = "Bring the node back, then run nodetool repair."

    ReplicaMissing.__module__ = errors.__name__
    assert "ReplicaMissing" not in reference.error_reasons()
    monkeypatch.setattr(errors, "ReplicaMissing", ReplicaMissing, raising=False)
    row = next(line for line in reference.error_reasons().splitlines() if "`ReplicaMissing`" in line)
    assert "A replica of the keyspace is down." in row
    assert "Bring the node back" in row and "Stalled" in row


def test_every_reason_of_the_error_family_has_a_meaning_and_a_fix():
    page = reference.error_reasons()
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, errors.DbqError) and cls is not errors.DbqError:
            assert cls.fix, f"{cls.__name__} has no fix"
            assert f"`{cls.reason}`" in page


def test_a_new_metric_changes_the_metrics_reference():
    registry = CollectorRegistry()
    gauge = Gauge("dbq_test_docs_gauge", "A gauge the docs test made", ["namespace"], registry=registry)
    counter = Counter("dbq_test_docs", "A counter the docs test made", registry=registry)
    page = reference.metrics([gauge, counter])
    assert "| `dbq_test_docs_gauge` | gauge | `namespace` | A gauge the docs test made |" in page
    assert "| `dbq_test_docs_total` | counter |" in page


def test_the_metrics_reference_lists_every_metric_the_operator_registers():
    """The oracle is the registry the operator serves, not the module's names."""
    page = reference.metrics()
    assert operator_metrics.QUEUE_READY  # registered on import
    served = [m for m in REGISTRY.collect() if m.name.startswith("dbq_")]
    assert len(served) >= 17
    for metric in served:
        name = metric.name + ("_total" if metric.type == "counter" else "")
        assert f"| `{name}` | {metric.type} |" in page, name


def test_the_helm_values_reference_follows_values_yaml(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("operator:\n  # -- How loud the docs test is.\n  loudness: 11\n")
    assert "| `operator.loudness` | int | `11` | How loud the docs test is. |" in reference.helm_values(
        values
    )
    assert "`watchNamespaces`" in reference.helm_values()


def test_an_unknown_marker_fails_the_build_and_every_marker_in_the_docs_is_known():
    with pytest.raises(KeyError, match="no such table"):
        hooks.expand("<!-- dbq:reference no-such-table -->")
    for page in (ROOT / "docs").rglob("*.md"):
        hooks.expand(page.read_text())  # raises on an unknown marker


def test_the_performance_tables_and_charts_come_from_the_bench_results():
    ring = performance.ring_vs_skiplocked()
    text = (performance.RESULTS / "ring_vs_skiplocked.txt").read_text()
    assert f"{ring['skiplocked']['sustained']:,.0f}" in performance.ring_table()
    assert re.search(rf"skiplocked\s+sustained\s+{ring['skiplocked']['sustained']:,.0f} /s", text)
    smart = performance.smart_batching()
    assert smart["ring", "push+pop", "on"][64] > smart["ring", "push+pop", "off"][64]
    assert [s for s, _, _ in performance.stats_cost()] == [100_000, 1_000_000, 10_000_000]
    queues, points = performance.control_plane()
    assert points[-1][1] == queues
    charts = performance.charts()
    assert set(charts) == set(performance.CHARTS)
    assert all(png.startswith(b"\x89PNG") for png in charts.values())


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link


def test_the_product_speaks_of_itself_only():
    """No internal run or session numbers in what users read."""
    tracked = subprocess.run(
        ["git", "ls-files", "README.md", "docs", "bench/results", "operator/dbq", "charts"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    internal = re.compile(r"\bstop [0-9]+|\brun [0-9]+ of\b|\bs[0-9]{2}\b")
    found = [
        f"{path}: {match.group(0)}"
        for path in tracked
        if not path.endswith((".png", ".svg", ".gz"))
        for match in [internal.search((ROOT / path).read_text(errors="replace"))]
        if match
    ]
    assert not found, found
