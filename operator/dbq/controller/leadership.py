"""Leader election on a coordination.k8s.io Lease: one operator replica acts, the others wait.

kopf's peering is not a lock (equal priorities freeze every operator, and a crashed peer is
waited out for its whole lifetime), so dbq holds a Lease around kopf, as controller-runtime does
for Go operators. The rules are client-go's:

- a candidate takes the Lease when nobody holds it, or when its record has not changed for
  `lease_duration` seconds by this process's own clock (the holder's clock is never read, so a
  skew between nodes does not matter);
- every write carries the resourceVersion that was read (optimistic concurrency): of two
  candidates that saw the same expired record, the API server lets exactly one write;
- the holder renews every `retry_period`; when no renewal succeeded for `renew_deadline` it
  has lost the Lease and must stop acting at once (`run` calls `on_stopped`);
- a holder that stops on purpose releases the Lease (no holder, duration 1 s), so a standby
  takes it within one retry period instead of waiting out the lease.

A module of its own rather than `kubernetes.leaderelection`, which reads wall clocks to age a
record, never releases the Lease, counts no transitions and sleeps in a loop nothing can stop.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("dbq.leadership")


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is and how it is held (the chart's `leaderElection` values)."""

    namespace: str
    identity: str  # this replica: its pod name, unique among the candidates
    name: str = "dbq-operator"
    lease_duration: float = 15.0  # a standby takes over after the record stood still this long
    renew_deadline: float = 10.0  # the holder gives up after failing to renew this long
    retry_period: float = 2.0  # between tries, to take or to renew

    def __post_init__(self) -> None:
        if not self.namespace or not self.identity or not self.name:
            raise ValueError("leader election needs a Lease namespace, a Lease name and an identity")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retryPeriod < renewDeadline < leaseDuration, not"
                f" {self.retry_period:g} s, {self.renew_deadline:g} s and {self.lease_duration:g} s:"
                " a holder must give up before a standby may take over"
            )


def _now() -> datetime:
    return datetime.now(UTC)


def _record(spec: client.V1LeaseSpec) -> tuple[Any, ...]:
    """What of a Lease tells whether it moved since it was last seen."""
    return (spec.holder_identity, spec.renew_time, spec.acquire_time, spec.lease_transitions)


class Elector:
    """One candidate for one Lease. `try_acquire_or_renew` is one read and at most one write;
    `run` is the loop of a replica."""

    def __init__(
        self,
        api: client.ApiClient | None,
        settings: LeaseSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._api = client.CoordinationV1Api(api)
        self._clock = clock
        self._observed: tuple[Any, ...] | None = None  # the last record read, and when it changed
        self._observed_at = 0.0
        self._renewed_at = 0.0  # when this candidate last wrote the Lease as its holder
        self.leading = False

    # --- one try ----------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """Whether this candidate holds the Lease after this try (it took or renewed it)."""
        s = self.settings
        timeout = s.retry_period
        try:
            lease = self._api.read_namespaced_lease(s.name, s.namespace, _request_timeout=timeout)
        except ApiException as e:
            if e.status != 404:
                log.warning("reading Lease %s/%s failed: %s", s.namespace, s.name, e.reason)
                return False
            return self._create(timeout)
        spec = lease.spec or client.V1LeaseSpec()
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or s.lease_duration
        if holder and holder != s.identity and self._clock() < self._observed_at + duration:
            return False  # held by another, renewed within its duration as far as we have seen
        now = _now()
        if holder != s.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = s.identity
        spec.renew_time = now
        spec.lease_duration_seconds = self._duration_s()
        lease.spec = spec
        return self._write(lease, timeout, took=holder != s.identity)

    def _duration_s(self) -> int:
        """The lease duration as the Lease records it: whole seconds, at least one."""
        return max(1, round(self.settings.lease_duration))

    def _create(self, timeout: float) -> bool:
        s = self.settings
        now = _now()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=s.name, namespace=s.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=s.identity,
                lease_duration_seconds=self._duration_s(),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            created = self._api.create_namespaced_lease(s.namespace, body, _request_timeout=timeout)
        except ApiException as e:
            if e.status != 409:  # 409: another candidate created it first
                log.warning("creating Lease %s/%s failed: %s", s.namespace, s.name, e.reason)
            return False
        self._saw(created.spec, took=True)
        return True

    def _write(self, lease: client.V1Lease, timeout: float, took: bool) -> bool:
        """Replace the Lease as read: the API server refuses it (409) when anyone wrote since."""
        s = self.settings
        try:
            written = self._api.replace_namespaced_lease(s.name, s.namespace, lease, _request_timeout=timeout)
        except ApiException as e:
            if e.status != 409:
                log.warning("writing Lease %s/%s failed: %s", s.namespace, s.name, e.reason)
            return False
        self._saw(written.spec, took)
        return True

    def _saw(self, spec: client.V1LeaseSpec | None, took: bool) -> None:
        spec = spec or client.V1LeaseSpec()
        self._observed = _record(spec)
        self._observed_at = self._clock()
        if spec.holder_identity == self.settings.identity:
            self._renewed_at = self._observed_at
        if took:
            log.info(
                "%s holds Lease %s/%s", self.settings.identity, self.settings.namespace, self.settings.name
            )

    def release(self) -> bool:
        """Give the Lease up (a graceful stop): no holder, so a standby takes it at its next try.
        False when this candidate did not hold it."""
        s = self.settings
        try:
            lease = self._api.read_namespaced_lease(s.name, s.namespace, _request_timeout=s.retry_period)
        except ApiException:
            return False
        if lease.spec is None or lease.spec.holder_identity != s.identity:
            return False
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        lease.spec.renew_time = _now()
        released = self._write(lease, s.retry_period, took=False)
        self.leading = False
        return released

    def acting(self) -> bool:
        """Whether this candidate may act now: it leads, and its last renewal is younger than
        `renew_deadline` by its own clock (a process frozen past that may have been replaced)."""
        return self.leading and self._clock() < self._renewed_at + self.settings.renew_deadline

    def _lost(self) -> bool:
        """After a failed renewal: whether the Lease is lost, because another candidate holds it
        or because no renewal succeeded for `renew_deadline`."""
        holder = self._observed[0] if self._observed else None
        taken = holder is not None and holder != self.settings.identity
        return taken or self._clock() >= self._renewed_at + self.settings.renew_deadline

    def _try(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception as e:  # the API server unreachable: a failed try, like any other
            log.warning("Lease %s/%s: %s", self.settings.namespace, self.settings.name, e)
            return False

    # --- the loop of a replica ----------------------------------------------------------------
    def run(
        self, stop: threading.Event, on_started: Callable[[], None], on_stopped: Callable[[], None]
    ) -> None:
        """Wait for the Lease, call `on_started`, then renew it until `stop` is set (then return,
        still holding it: release it once the work stopped) or until a renewal fails for
        `renew_deadline` or another candidate took it (then `on_stopped`, and return)."""
        s = self.settings
        while not self._try():
            if stop.wait(s.retry_period):
                return
        self.leading = True
        on_started()
        while not stop.wait(s.retry_period):
            if not self.acting() or (not self._try() and self._lost()):
                self.leading = False
                log.error("%s lost Lease %s/%s", s.identity, s.namespace, s.name)
                on_stopped()
                return


# --- a replica's life --------------------------------------------------------------------------
class _StandbyHealth(BaseHTTPRequestHandler):
    """/healthz of a replica standing by (kopf serves it once the replica leads)."""

    def do_GET(self) -> None:
        ok = self.path.split("?")[0] == "/healthz"
        body = json.dumps({"leader": False}).encode() if ok else b""
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:  # probes every few seconds: not worth a log line
        pass


# The elector of this process while it acts under leader election (run_elected); empty otherwise.
_elected: list[Elector] = []
# Set once the operator is told to stop (SIGTERM, SIGINT), before kopf stops: kopf waits for
# every sync handler it has queued, started or not, so the queued ones must see it and end.
stopping = threading.Event()


def fence() -> None:
    """Called before the operator acts (a handler starts, a status is written). A replica whose
    Lease may have lapsed (the process was frozen, or its renewals failed past renewDeadline)
    must not act: it exits at once with code 1, before the renewing thread notices. Nothing
    outside leader election."""
    if _elected and not _elected[0].acting():
        _exit_lost(_elected[0].settings)


def acting_now() -> bool:
    """Whether this process holds the Lease and may act right now (under leader election)."""
    return bool(_elected) and _elected[0].acting()


def drain(executors: Mapping[str, Executor], timeout: float) -> bool:
    """Stop the executors (by their threads' name prefix) taking work, and wait up to `timeout`
    seconds for what their threads still run; whether every thread ended. A handler kopf gave up
    on at shutdown goes on in its thread: the Lease is not released before it ends."""
    for executor in executors.values():
        executor.shutdown(wait=False, cancel_futures=True)
    prefixes = tuple(executors)
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith(prefixes):
            thread.join(max(0.0, deadline - time.monotonic()))
    return not any(t.name.startswith(prefixes) and t.is_alive() for t in threading.enumerate())


def _exit_lost(settings: LeaseSettings) -> None:
    log.critical("%s lost the Lease while acting: exiting", settings.identity)
    logging.shutdown()
    os._exit(1)


def run_elected(
    settings: LeaseSettings,
    api: client.ApiClient | None,
    act: Callable[[], None],
    health: tuple[str, int] | None,
    on_leading: Callable[[bool], None] = lambda _: None,
    finish: Callable[[float], bool] = lambda _: True,
) -> int:
    """A replica under leader election; its exit code. It stands by (serving `health`'s
    /healthz, nothing else: no handler, timer or database connection) until it holds the Lease,
    then runs `act` (kopf, which serves /healthz from then on) in this thread. When `act`
    returns (SIGTERM, SIGINT), `finish` waits (at most renew_deadline, still renewing) for the
    handlers still running, then the Lease is released, so a standby takes over at its next
    try; when they did not end, the Lease is left to expire instead. A lost Lease ends the
    process at once with exit code 1, as controller-runtime does: two replicas must never act
    together. SIGTERM while standing by exits 0."""
    elector = Elector(api, settings)
    stop, started = threading.Event(), threading.Event()

    def lost() -> None:
        on_leading(False)
        _exit_lost(settings)

    renewing = threading.Thread(target=elector.run, args=(stop, started.set, lost), name="lease", daemon=True)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = ThreadingHTTPServer(health, _StandbyHealth) if health else None
    if server is not None:
        threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    on_leading(False)
    renewing.start()
    log.info("%s stands by for Lease %s/%s", settings.identity, settings.namespace, settings.name)
    while not started.wait(0.5):
        if stop.is_set():
            renewing.join(settings.retry_period * 2)
            return 0
    if server is not None:
        server.shutdown()
        server.server_close()  # the port is kopf's now
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if stop.is_set():  # told to stop just as it took the Lease: give it back without acting
        renewing.join(settings.retry_period * 2)
        elector.release()
        return 0
    _elected.append(elector)
    on_leading(True)
    try:
        act()
    finally:
        finished = finish(settings.renew_deadline)
        _elected.clear()
        stop.set()
        renewing.join(settings.retry_period * 2)
        on_leading(False)
        if finished:
            log.info("%s releases Lease %s/%s: %s", settings.identity, settings.namespace, settings.name,
                     "released" if elector.release() else "not held")  # fmt: skip
        else:
            log.warning("%s: handlers still ran %g s after the stop; Lease %s/%s is left to expire",
                        settings.identity, settings.renew_deadline, settings.namespace, settings.name)  # fmt: skip
    return 0
