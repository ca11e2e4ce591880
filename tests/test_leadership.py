"""Leader election on a Lease (dbq.controller.leadership) against the real API server: one
holder at a time, takeover only after the lease stood still, optimistic concurrency between
candidates that saw the same record, a graceful release, and a holder that loses the Lease
stopping at once; then `dbq run --leader-elect` replicas (real operator processes, real
PostgreSQL): one acts, the standby serves its probes and metrics only, and takes over when the
leader stops, is killed, or loses the Lease (exit 1)."""

from __future__ import annotations

import secrets
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from kubernetes import client

from dbq.controller.leadership import Elector, LeaseSettings, drain, run_elected
from tests.manifests import queue
from tests.operator_harness import Cluster, Operator, operator_namespace, wait_for

NAMESPACE = "default"
FAST = {"lease_duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.2}


@pytest.fixture
def lease(kube) -> Iterator[str]:
    name = f"dbq-test-{secrets.token_hex(3)}"
    yield name
    try:
        client.CoordinationV1Api(kube.api).delete_namespaced_lease(name, NAMESPACE)
    except client.ApiException as e:
        assert e.status == 404


def elector(kube, lease: str, identity: str) -> Elector:
    return Elector(kube.api, LeaseSettings(NAMESPACE, identity, lease, **FAST))


@contextmanager
def running(
    a: Elector,
) -> Iterator[tuple[threading.Event, threading.Event, threading.Event, threading.Thread]]:
    """`a.run` in a thread, once it holds the Lease: (started, stopped, stop, the thread); stopped
    and joined when the block ends."""
    started, stopped, stop = threading.Event(), threading.Event(), threading.Event()
    runner = threading.Thread(target=a.run, args=(stop, started.set, stopped.set))
    runner.start()
    try:
        assert started.wait(5)
        yield started, stopped, stop, runner
    finally:
        stop.set()
        runner.join(5)


def read(kube, lease: str) -> client.V1LeaseSpec:
    return client.CoordinationV1Api(kube.api).read_namespaced_lease(lease, NAMESPACE).spec


def test_one_candidate_holds_the_lease_and_the_other_waits_while_it_is_renewed(kube, lease):
    a, b = elector(kube, lease, "a"), elector(kube, lease, "b")
    assert a.try_acquire_or_renew() is True  # creates it
    assert b.try_acquire_or_renew() is False
    spec = read(kube, lease)
    assert (spec.holder_identity, spec.lease_duration_seconds, spec.lease_transitions) == ("a", 2, 0)
    for _ in range(4):  # renewed within its duration: b never takes it
        time.sleep(0.6)
        assert a.try_acquire_or_renew() is True
        assert b.try_acquire_or_renew() is False
    assert read(kube, lease).holder_identity == "a"


def test_a_standby_takes_over_only_once_the_record_stood_still_for_the_lease_duration(kube, lease):
    a, b = elector(kube, lease, "a"), elector(kube, lease, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b sees the record now: it ages from here
    seen = time.monotonic()
    while not b.try_acquire_or_renew():
        time.sleep(0.1)
    waited = time.monotonic() - seen
    assert 2.0 <= waited < 3.0, waited  # a stopped renewing: b waited out the lease, no longer
    spec = read(kube, lease)
    assert (spec.holder_identity, spec.lease_transitions) == ("b", 1)
    assert a.try_acquire_or_renew() is False  # the old holder sees it lost


def test_of_candidates_that_saw_the_same_free_lease_exactly_one_takes_it(kube, lease):
    candidates = [elector(kube, lease, f"c{i}") for i in range(8)]
    for round_ in range(5):  # on a Lease to create, then on a released one
        gate = threading.Barrier(len(candidates))

        def attempt(c: Elector, gate: threading.Barrier = gate) -> bool:
            gate.wait()
            return c.try_acquire_or_renew()

        with ThreadPoolExecutor(len(candidates)) as pool:
            won = [c for c, ok in zip(candidates, pool.map(attempt, candidates), strict=True) if ok]
        assert len(won) == 1, (round_, [c.settings.identity for c in won])
        assert read(kube, lease).holder_identity == won[0].settings.identity
        assert won[0].release() is True


def test_a_released_lease_is_taken_at_the_next_try_and_only_the_holder_may_release(kube, lease):
    a, b = elector(kube, lease, "a"), elector(kube, lease, "b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert b.release() is False  # not b's to give
    assert a.release() is True
    spec = read(kube, lease)
    assert (spec.holder_identity, spec.lease_duration_seconds) == (None, 1)
    assert b.try_acquire_or_renew() is True  # no waiting for a released Lease
    assert read(kube, lease).holder_identity == "b"


def test_a_holder_whose_lease_was_taken_stops_at_once(kube, lease):
    a = elector(kube, lease, "a")
    with running(a) as (_, stopped, _, _):
        assert a.leading
        time.sleep(1.0)
        assert not stopped.is_set()  # renewing
        api = client.CoordinationV1Api(kube.api)
        taken = api.read_namespaced_lease(lease, NAMESPACE)
        taken.spec.holder_identity = "intruder"  # as a candidate that took it would write
        api.replace_namespaced_lease(lease, NAMESPACE, taken)
        took_at = time.monotonic()
        assert stopped.wait(5)
        assert time.monotonic() - took_at < 0.2 + 0.5  # at its next renewal, not after the deadline
        assert not a.leading


def test_a_holder_that_cannot_reach_the_api_server_stops_after_the_renew_deadline(kube, lease):
    a = elector(kube, lease, "a")
    with running(a) as (_, stopped, _, _):
        cut_off = client.Configuration(host="https://127.0.0.1:9")  # nothing listens there
        a._api = client.CoordinationV1Api(client.ApiClient(cut_off))
        cut_at = time.monotonic()
        assert stopped.wait(5)
        assert 1.5 - 0.2 <= time.monotonic() - cut_at < 1.5 + 0.5  # its last renewal + renewDeadline
        assert read(kube, lease).holder_identity == "a"  # left to expire: a standby waits it out


def test_a_stopped_run_returns_still_holding_the_lease_for_its_caller_to_release(kube, lease):
    a = elector(kube, lease, "a")
    with running(a) as (_, stopped, stop, runner):
        stop.set()
        runner.join(5)
    assert not runner.is_alive() and not stopped.is_set()
    assert read(kube, lease).holder_identity == "a"
    assert a.release() and read(kube, lease).holder_identity is None


def test_a_holder_may_act_only_while_its_last_renewal_is_younger_than_the_renew_deadline(kube, lease):
    now = [100.0]
    a = Elector(kube.api, LeaseSettings(NAMESPACE, "a", lease, **FAST), clock=lambda: now[0])
    assert a.try_acquire_or_renew()
    a.leading = True  # as run() sets it once the Lease is taken
    now[0] += 1.4
    assert a.acting()
    now[0] += 0.2  # 1.6 s since the renewal: past the deadline, as after a freeze
    assert not a.acting()
    assert a.try_acquire_or_renew() and a.acting()  # renewed: it may act again


def test_draining_waits_for_running_work_until_its_timeout():
    fast = ThreadPoolExecutor(max_workers=1, thread_name_prefix="t-fast")
    slow = ThreadPoolExecutor(thread_name_prefix="t-slow")
    running, queued = fast.submit(time.sleep, 1), fast.submit(time.sleep, 5)
    began = time.monotonic()
    assert drain({"t-fast": fast}, 10)  # the running one ends; the queued one never starts
    assert running.done() and queued.cancelled() and 0.8 <= time.monotonic() - began < 2
    slow.submit(time.sleep, 3)
    began = time.monotonic()
    assert not drain({"t-slow": slow}, 0.3)
    assert time.monotonic() - began < 1


def test_a_leader_told_to_stop_releases_the_lease_only_once_its_handlers_ended(kube, lease):
    """run_elected: when act() returns (kopf stopped) a handler may still run in its thread; the
    Lease stays held (and renewed) until it ended, then it is released. One that runs past the
    renew deadline leaves the Lease to expire instead."""
    settings = LeaseSettings(NAMESPACE, "a", lease, **FAST)
    handlers = ThreadPoolExecutor(thread_name_prefix="t-handler")
    seen: list[str | None] = []

    def handler(seconds: float) -> None:
        time.sleep(seconds)
        seen.append(read(kube, lease).holder_identity)

    assert run_elected(settings, kube.api, lambda: handlers.submit(handler, 1.0) and None, None,
                       finish=lambda timeout: drain({"t-handler": handlers}, timeout)) == 0  # fmt: skip
    assert seen == ["a"] and read(kube, lease).holder_identity is None
    handlers = ThreadPoolExecutor(thread_name_prefix="t-handler")
    began = time.monotonic()
    assert run_elected(settings, kube.api, lambda: handlers.submit(handler, 3.0) and None, None,
                       finish=lambda timeout: drain({"t-handler": handlers}, timeout)) == 0  # fmt: skip
    assert time.monotonic() - began < 3.0 and read(kube, lease).holder_identity == "a"
    handlers.shutdown(wait=True)


@pytest.mark.parametrize(
    ("timings", "named"),
    [
        ({"lease_duration": 10, "renew_deadline": 10, "retry_period": 2}, "renewDeadline < leaseDuration"),
        ({"lease_duration": 15, "renew_deadline": 2, "retry_period": 2}, "retryPeriod < renewDeadline"),
        ({"lease_duration": 15, "renew_deadline": 10, "retry_period": 0}, "0 < retryPeriod"),
    ],
)
def test_settings_that_could_let_two_replicas_act_are_refused(timings, named):
    with pytest.raises(ValueError, match=named):
        LeaseSettings("dbq-system", "pod-a", **timings)


# --- dbq run --leader-elect ----------------------------------------------------------------------
REPLICA_TIMINGS = ("--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms")


def grant_leases(kube, namespace: str) -> None:
    """What the chart will grant the operator in its own namespace: its Lease, nothing more."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "dbq-leases"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "verbs": ["get", "create", "update"]}],
    })  # fmt: skip
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "dbq-leases"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dbq-leases"},
        "subjects": [{"kind": "ServiceAccount", "name": "dbq-operator", "namespace": "dbq-system"}],
    })  # fmt: skip


def scrape(replica: Operator, path: str) -> str:
    port = replica.metrics_port if path == "/metrics" else replica.health_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


def leads(replica: Operator) -> float:
    line = next(x for x in scrape(replica, "/metrics").splitlines() if x.startswith("dbq_leader "))
    return float(line.split()[1])


def holder(kube, namespace: str) -> str | None:
    try:
        return (
            client.CoordinationV1Api(kube.api)
            .read_namespaced_lease("dbq-operator", namespace)
            .spec.holder_identity
        )
    except client.ApiException as e:
        assert e.status == 404
        return None


@pytest.fixture
def replicas(kube, postgres, tmp_path) -> Iterator[tuple[Cluster, dict[str, Operator]]]:
    cluster = operator_namespace(kube, postgres, "lead")
    grant_leases(kube, cluster.ns)
    made: dict[str, Operator] = {}

    def replica(name: str) -> Operator:
        args = ("--leader-elect", "--lease-namespace", cluster.ns, "--identity", name, *REPLICA_TIMINGS)
        made[name] = Operator(kube, cluster.ns, tmp_path / f"{name}.log", args=args)
        made[name].start()
        return made[name]

    replica("one")
    wait_for(lambda: holder(kube, cluster.ns) == "one", 60, "replica one holding the Lease")
    replica("two")
    yield cluster, made
    if not any(r.proc is not None and r.proc.poll() is None for r in made.values()):
        replica("cleanup")  # the Queues' finalizers are the operator's to remove
    cluster.force_delete_all(120)
    for r in made.values():
        r.stop()
    client.CoreV1Api(kube.api).delete_namespace(cluster.ns)


def test_one_replica_acts_the_standby_serves_probes_and_takes_over_when_the_leader_stops(kube, replicas):
    cluster, made = replicas
    one, two = made["one"], made["two"]
    wait_for(lambda: _serves(two), 30, "the standby's /healthz and /metrics")
    assert '"leader": false' in scrape(two, "/healthz")
    assert leads(one) == 1 and leads(two) == 0
    cluster.create(queue("first"))
    cluster.wait_condition("first", "Ready", "True", timeout=60)
    # Ready is written before kopf logs the handler's end: wait for the line, do not race it.
    wait_for(lambda: "Creation is processed" in one.log_text(), 10, "the leader's creation log line")
    assert "kopf" not in two.log_text()  # the standby ran no handler and started no kopf at all
    # A graceful stop: the leader releases the Lease, and the standby takes it at its next try.
    assert one.proc is not None
    stopped_at = time.monotonic()
    one.stop()
    assert one.proc.returncode == 0
    wait_for(lambda: holder(kube, cluster.ns) == "two", 10, "replica two holding the Lease")
    assert time.monotonic() - stopped_at < 0.5 + 3 + 5  # retry period + 3 s, and the stop itself
    cluster.create(queue("second"))
    cluster.wait_condition("second", "Ready", "True", timeout=30)
    assert leads(two) == 1
    assert "dbq_leader_transitions_total 1.0" in scrape(two, "/metrics")


def test_a_killed_leader_is_waited_out_and_a_leader_that_lost_the_lease_exits(kube, replicas):
    cluster, made = replicas
    one, two = made["one"], made["two"]
    wait_for(lambda: _serves(two), 30, "the standby's /healthz and /metrics")
    one.kill()  # SIGKILL: the Lease stays held until it stands still for its duration
    killed_at = time.monotonic()
    cluster.create(queue("after-kill"))
    wait_for(lambda: holder(kube, cluster.ns) == "two", 15, "replica two holding the Lease")
    assert time.monotonic() - killed_at < 3 + 0.5 + 2  # lease duration + retry period + 2 s
    cluster.wait_condition("after-kill", "Ready", "True", timeout=30)
    # Another candidate writes the Lease as its own: the leader sees it lost and exits 1 at once.
    _take_lease(client.CoordinationV1Api(kube.api), cluster.ns, "someone-else")
    assert two.proc is not None
    assert two.proc.wait(timeout=5) == 1
    assert "lost the Lease" in two.log_text()


def _take_lease(api: client.CoordinationV1Api, namespace: str, identity: str) -> None:
    """Write the Lease as `identity`'s, read again when the leader's renewal got there first."""
    for _ in range(20):
        lease = api.read_namespaced_lease("dbq-operator", namespace)
        lease.spec.holder_identity = identity
        try:
            api.replace_namespaced_lease("dbq-operator", namespace, lease)
            return
        except client.ApiException as e:
            if e.status != 409:
                raise
    raise AssertionError("the Lease changed under every one of 20 writes")


def _serves(replica: Operator) -> bool:
    try:
        scrape(replica, "/healthz")
        return "dbq_leader " in scrape(replica, "/metrics")
    except OSError:
        return False


def test_a_frozen_leader_that_resumes_after_a_takeover_exits_without_acting(kube, replicas):
    cluster, made = replicas
    one, two = made["one"], made["two"]
    wait_for(lambda: _serves(two), 30, "the standby's /healthz and /metrics")
    cluster.create(queue("before"))
    cluster.wait_condition("before", "Ready", "True", timeout=60)
    # Frozen only once kopf finished with it: its last patch (the handled configuration) is in,
    # so what follows the freeze is what a woken leader does, not the end of a handler it was in.
    wait_for(lambda: "dbq.dev/last-handled-configuration" in cluster.get("before")["metadata"].get("annotations", {}),
             30, "kopf's last patch of the queue")  # fmt: skip
    wait_for(lambda: "Creation is processed" in one.log_text(), 30, "the creation logged as processed")
    assert one.proc is not None
    one.proc.send_signal(signal.SIGSTOP)  # a hung process or node: it neither renews nor exits
    try:
        wait_for(lambda: holder(kube, cluster.ns) == "two", 15, "replica two holding the Lease")
        cluster.create(queue("during"))
        cluster.wait_condition("during", "Ready", "True", timeout=30)
        seen = len(one.log_text())
    finally:
        one.proc.send_signal(signal.SIGCONT)
    assert one.proc.wait(timeout=10) == 1
    after = one.log_text()[seen:]
    assert "lost the Lease" in after
    assert "Handler" not in after and "succeeded" not in after, after  # no handler ran after it woke
    assert holder(kube, cluster.ns) == "two"
