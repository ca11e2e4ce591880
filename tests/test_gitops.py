"""GitOps with Flux for real (`dbq dev up flux`): source-controller fetches a git repository over
smart HTTP, kustomize-controller applies its kustomize tree of Queues to the real API server and
waits for their health (kstatus, through Flux's own code), and the real operator (`dbq run`, the
chart's RBAC) brings them to Ready in the real PostgreSQL. Each test commits to the repository
and asks both Flux objects to reconcile at once (the `reconcile.fluxcd.io/requestedAt`
annotation, as `flux reconcile` does), then reads what Flux reports."""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.flux_harness import GIT_REPOSITORY, KUSTOMIZATION, FluxObjects, Repository
from tests.manifests import queue
from tests.operator_harness import Cluster, Operator, operator_namespace, wait_for

NAME = "queues"  # the GitRepository's and the Kustomization's


class GitOps:
    """The test namespace (watched by its operator), the repository, and the GitRepository and
    Kustomization that apply its queues/ folder there."""

    def __init__(self, kube: Any, cluster: Cluster, repository: Repository) -> None:
        self.cluster, self.repository = cluster, repository
        self.flux = FluxObjects(kube.api, cluster.ns)

    def commit(self, files: dict[str, Any], message: str) -> str:
        """Commit, and have Flux reconcile it now; the revision Flux names it by."""
        sha = self.repository.commit(files, message)
        self.flux.reconcile_now((GIT_REPOSITORY, NAME), (KUSTOMIZATION, NAME))
        return f"main@sha1:{sha}"

    def applied(self, revision: str, timeout: float = 120) -> dict[str, Any]:
        return self.flux.applied(NAME, revision, timeout)


def ring_queue(name: str, schema: str, **spec: Any) -> dict[str, Any]:
    doc = queue(name, **spec)
    doc["spec"]["connection"]["schema"] = schema
    return doc


@pytest.fixture(scope="module")
def gitops(kube, postgres, flux, tmp_path_factory) -> Iterator[GitOps]:
    cluster = operator_namespace(kube, postgres, "gitops")
    operator = Operator(kube, cluster.ns, tmp_path_factory.mktemp("operator") / "operator.log")
    operator.start()
    repository = Repository(flux, f"queues-{secrets.token_hex(3)}", tmp_path_factory.mktemp("repo") / "work")
    env = GitOps(kube, cluster, repository)
    repository.commit({}, "an empty tree")
    env.flux.create(
        GIT_REPOSITORY, NAME, {"url": repository.url, "ref": {"branch": "main"}, "interval": "1m"}
    )
    env.flux.create(KUSTOMIZATION, NAME, {
        "sourceRef": {"kind": "GitRepository", "name": NAME}, "path": "./queues", "prune": True, "wait": True,
        "timeout": "30s", "interval": "1m", "retryInterval": "5s", "targetNamespace": cluster.ns,
    })  # fmt: skip
    yield env
    for kind in (KUSTOMIZATION, GIT_REPOSITORY):
        env.flux.delete(kind, NAME)
    cluster.force_delete_all(120)
    operator.stop()
    client.CoreV1Api(kube.api).delete_namespace(cluster.ns)


def test_a_commit_of_queues_is_applied_and_the_kustomization_is_ready_at_that_commit(gitops, postgres):
    """A Queue and its dead-letter keeper committed together converge with no ordering: the
    user's Queue waits (DeadLetterQueueNotFound) until its keeper is Ready."""
    schema = f"gitops_{secrets.token_hex(3)}"
    revision = gitops.commit({
        "keeper.yaml": ring_queue("keeper", schema),
        "orders.yaml": ring_queue("orders", schema, deadLetter={"queue": "keeper", "maxAttempts": 5}),
    }, "orders and its dead-letter keeper")  # fmt: skip
    ready = gitops.applied(revision)
    assert ready["status"] == "True", ready
    assert gitops.flux.get(KUSTOMIZATION, NAME)["status"]["lastAppliedRevision"] == revision
    for name in ("keeper", "orders"):
        assert gitops.cluster.condition(name, "Ready")["status"] == "True"  # Flux waited for it


def test_commit_to_ready_takes_seconds(gitops):
    """Five commits, each adding a Queue: seconds from `git push` (with the reconcile-now
    annotation) to the Queue Ready."""
    took = []
    for i in range(5):
        name = f"timed-{i}"
        began = time.monotonic()
        revision = gitops.commit(
            {f"{name}.yaml": ring_queue(name, f"gitops_{secrets.token_hex(3)}")}, f"add {name}"
        )
        wait_for(lambda name=name: gitops.cluster.exists(name)
                 and gitops.cluster.condition(name, "Ready").get("status") == "True", 120, f"{name} Ready")  # fmt: skip
        took.append(time.monotonic() - began)
        assert gitops.applied(revision)["status"] == "True"  # Flux's health check done before the next commit
    print(f"git commit to Queue Ready: p50 {statistics.median(took):.1f} s, max {max(took):.1f} s ({took})")
    assert max(took) < 60, took


def test_a_queue_that_cannot_become_ready_fails_the_health_check_until_its_secret_is_committed(
    gitops, postgres
):
    schema = f"gitops_{secrets.token_hex(3)}"
    revision = gitops.commit({"ledger.yaml": ring_queue("ledger", schema, connection={
        "secretRef": {"name": "ledger-db"}, "schema": schema})}, "ledger, its Secret forgotten")  # fmt: skip
    waiting = gitops.applied(revision, timeout=120)
    assert waiting["status"] == "False" and waiting["reason"] == "HealthCheckFailed", waiting
    # Flux names the unhealthy objects, unless its poller's last request was cut by the deadline
    # (then the message is its client's rate-limiter error): its next attempt, retryInterval
    # later, names them.
    named = wait_for(lambda: _names_the_queue(gitops, "ledger"), 120, "Flux to name the unhealthy Queue")
    assert named["reason"] == "HealthCheckFailed", named
    assert gitops.cluster.condition("ledger", "Ready")["status"] == "False"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ledger-db"},
              "stringData": {"url": postgres.url, "ca": postgres.ca}}  # fmt: skip
    healed_at = gitops.commit({"ledger-db.yaml": secret}, "ledger's Secret")
    # The Queue is provisioned at the operator's next retry of it (its backoff grew while the
    # Secret was missing: 5 s doubling, at most 5 min), and Flux's attempts meanwhile may time out
    # on it; the first attempt after that is Ready.
    healed = wait_for(
        lambda: _ready_at(gitops, healed_at), 240, "the Kustomization Ready at the Secret's commit"
    )
    assert healed["status"] == "True", healed
    gitops.cluster.wait_condition("ledger", "Ready", "True", timeout=60)


def _ready_at(gitops: GitOps, revision: str) -> dict[str, Any] | None:
    status = gitops.flux.get(KUSTOMIZATION, NAME).get("status") or {}
    ready = gitops.flux.ready(KUSTOMIZATION, NAME)
    return ready if status.get("lastAppliedRevision") == revision and ready.get("status") == "True" else None


def _names_the_queue(gitops: GitOps, name: str) -> dict[str, Any] | None:
    ready = gitops.flux.ready(KUSTOMIZATION, NAME)
    return (
        ready
        if ready.get("status") == "False"
        and "Queue/" in ready.get("message", "")
        and name in ready["message"]
        else None
    )


def test_a_mutable_change_and_a_resize_are_applied_and_an_immutable_one_is_refused_with_dbq_s_message(
    gitops, postgres
):
    schema = f"gitops_{secrets.token_hex(3)}"
    doc = ring_queue("billing", schema, ring={"size": 64})
    assert gitops.applied(gitops.commit({"billing.yaml": doc}, "billing"))["status"] == "True"
    generation = gitops.cluster.get("billing")["metadata"]["generation"]
    doc["spec"]["reindex"] = {"schedule": "30 4 * * 0"}
    assert (
        gitops.applied(gitops.commit({"billing.yaml": doc}, "billing: reindex on Sunday at 4:30"))["status"]
        == "True"
    )
    billing = gitops.cluster.get("billing")
    assert billing["metadata"]["generation"] == generation + 1
    assert billing["status"]["observedGeneration"] == generation + 1
    # A size change is a resize online: Ready at that commit, the Queue Ready with the new size.
    doc["spec"]["ring"]["size"] = 128
    assert gitops.applied(gitops.commit({"billing.yaml": doc}, "billing: a bigger ring"))["status"] == "True"
    billing = gitops.cluster.get("billing")
    assert billing["status"]["observedGeneration"] == generation + 2
    cur = postgres.connect().cursor()
    newest = f'SELECT size FROM "{schema}".billing_gens ORDER BY first_pos DESC'
    assert cur.execute(newest).fetchval() == 128
    assert (
        cur.execute(f"SELECT ring_size FROM \"{schema}\".dbq_queues WHERE queue = 'billing'").fetchval()
        == 128
    )
    # An immutable field is refused by the API server with dbq's CEL message, and nothing changes.
    doc["spec"]["connection"]["schema"] = f"{schema}_moved"
    refused = gitops.applied(gitops.commit({"billing.yaml": doc}, "billing: another schema"))
    assert refused["status"] == "False", refused
    assert refused["reason"] == "ReconciliationFailed", refused
    assert "spec.connection.schema cannot change after creation" in refused["message"], refused
    print(f"Flux on an immutable change: {refused['reason']}: {refused['message']}")
    assert gitops.cluster.get("billing")["spec"]["connection"]["schema"] == schema
    assert not cur.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = ?", f"{schema}_moved"
    ).fetchval()
    doc["spec"]["connection"]["schema"] = schema
    assert (
        gitops.applied(gitops.commit({"billing.yaml": doc}, "billing: back to its schema"))["status"]
        == "True"
    )


def test_a_queue_removed_from_git_is_pruned_under_its_deletion_policy(gitops, postgres):
    gone, kept = f"gitops_{secrets.token_hex(3)}", f"gitops_{secrets.token_hex(3)}"
    revision = gitops.commit({
        "scratch.yaml": ring_queue("scratch", gone, deletionPolicy="Delete"),
        "audit.yaml": ring_queue("audit", kept, deletionPolicy="DeleteIfEmpty"),
    }, "scratch and audit")  # fmt: skip
    assert gitops.applied(revision)["status"] == "True"
    cursor = postgres.connect().cursor()
    cursor.execute(f'SELECT * FROM "{kept}".audit_push(?, 0)', b"kept").fetchone()
    revision = gitops.commit({"scratch.yaml": None, "audit.yaml": None}, "scratch and audit removed")
    # Flux deletes what left git and reports the revision applied: it does not wait for the
    # deletion (the operator's finalizer) to end. The blocked Queue says so itself.
    pruned = gitops.applied(revision)
    assert pruned["status"] == "True" and pruned["reason"] == "ReconciliationSucceeded", pruned
    wait_for(lambda: not gitops.cluster.exists("scratch"), 60, "scratch deleted")
    schemas = "SELECT count(*) FROM pg_namespace WHERE nspname = ?"
    assert cursor.execute(schemas, gone).fetchval() == 0
    gitops.cluster.wait_condition("audit", "DeletionBlocked", "True", timeout=60)
    assert cursor.execute(schemas, kept).fetchval() == 1
    assert cursor.execute(f'SELECT "{kept}".audit_pop(0)').fetchval().endswith(b"kept")  # drained
    wait_for(lambda: not gitops.cluster.exists("audit"), 120, "audit deleted once empty")
    assert cursor.execute(schemas, kept).fetchval() == 0
