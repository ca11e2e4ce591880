"""KEDA's external scaler, answered for QueueConsumers (`spec.trigger: push`).

KEDA names the ScaledObject in each call; the ScaledObject a QueueConsumer gets carries its
name, so the QueueConsumer says what to read: its Queues that are Ready, their one database and
the backlog query (`dbq.controller.consumer_plan.scaled_queues`). Every call reads the figures
anew with the operator's connection to that database, one per database, shared by the calls.

StreamIsActive listens on the Queues' notification channels and, while the backlog is at or
below spec.activation, keeps their wait mark set, so the push that makes a queue non-empty
notifies at once (`dbq.client.notify`: a ring notifies only while someone waits, so busy queues
pay nothing). While active it measures every spec.pollingIntervalSeconds, to tell KEDA when the
backlog is gone.

Every operator replica serves it: it only reads, so whichever replica KEDA reaches answers.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import psycopg

from dbq.api.consumers import QUEUE_CONSUMER_PLURAL, QueueConsumerSpec
from dbq.api.models import PLURAL
from dbq.client.notify import WAIT_MARK_S, Notifications
from dbq.connection import ConnectionSettings, postgres
from dbq.controller.consumer_plan import ScaledQueues, parse_queue_consumer, scaled_queues
from dbq.errors import DbqError
from dbq.kube import Kube
from dbq.names import pg_quote
from dbq.resource import SecretReader, settings_for
from dbq.scaler import externalscaler_pb2 as pb
from dbq.scaler import externalscaler_pb2_grpc as rpc

log = logging.getLogger("dbq.scaler")
METRIC = "backlog"
# The scaler's sessions are told apart from applications that log in with the operator's Secret
# (status.operatorLoginSessions counts those).
APPLICATION = "dbq-push-scaler"
MARK_EVERY_S = 1.0  # the wait mark is renewed this often, within WAIT_MARK_S
STREAM_THREADS = 64  # open streams (one a push-scaled QueueConsumer) and calls at once


@dataclass(frozen=True)
class Target:
    spec: QueueConsumerSpec
    scaled: ScaledQueues


class Databases:
    """One connection per database, opened on first use and again after it breaks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int, str, str], tuple[threading.Lock, list[Any]]] = {}

    def value(self, settings: ConnectionSettings, query: str) -> float:
        key = (settings.host, settings.port, settings.database, settings.username)
        with self._lock:
            guard, held = self._open.setdefault(key, (threading.Lock(), []))
        with guard:
            for attempt in (1, 2):
                if not held:
                    held.append(postgres.connect(settings))
                try:
                    row = held[0].execute(query).fetchone()
                    return float(row[0] or 0)
                except psycopg.OperationalError:
                    held.pop().close()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def call(self, settings: ConnectionSettings, query: str) -> None:
        self.value(settings, f"SELECT 0 FROM ({query}) AS called")


class BacklogScaler(rpc.ExternalScalerServicer):
    def __init__(self, kube: Kube, read_secret: SecretReader) -> None:
        self.kube = kube
        self.read_secret = read_secret
        self.databases = Databases()
        # (endpoint, schema.queue) -> the listener of that queue's channel, and how many streams use it
        self._listeners: dict[tuple[str, str], tuple[Notifications, int]] = {}
        self._lock = threading.Lock()

    # --- what a ScaledObject reads ---------------------------------------------------------
    def _target(self, ref: Any, context: grpc.ServicerContext) -> Target:
        try:
            consumer = self.kube.find(QUEUE_CONSUMER_PLURAL, ref.namespace, ref.name)
            if consumer is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no QueueConsumer {ref.namespace}/{ref.name}")
                raise AssertionError("abort raises")
            spec = parse_queue_consumer(consumer.get("spec") or {})
            queues = {q["metadata"]["name"]: q for q in self.kube.list_resources(PLURAL, ref.namespace)}
            scaled = scaled_queues(ref.namespace, spec, queues, self._settings_of)
        except DbqError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{e.reason}: {e}")
        return Target(spec, scaled)

    def _settings_of(self, spec: Any, namespace: str) -> ConnectionSettings:
        settings = settings_for(spec, namespace, self.read_secret)
        return dataclasses.replace(settings, options={**settings.options, "application_name": APPLICATION})

    def _backlog(self, target: Target, context: grpc.ServicerContext) -> float:
        try:
            return self.databases.value(target.scaled.admin, target.scaled.query)
        except psycopg.Error as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{target.scaled.admin.endpoint}: {type(e).__name__}")
            raise

    # --- the contract ----------------------------------------------------------------------
    def IsActive(self, request: Any, context: grpc.ServicerContext) -> Any:
        target = self._target(request, context)
        return pb.IsActiveResponse(result=self._backlog(target, context) > target.spec.activation)

    def GetMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Any:
        target = self._target(request, context)
        per_replica = float(target.spec.messages_per_replica)
        return pb.GetMetricSpecResponse(
            metricSpecs=[
                pb.MetricSpec(metricName=METRIC, targetSize=int(per_replica), targetSizeFloat=per_replica)
            ]
        )

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:
        target = self._target(request.scaledObjectRef, context)
        value = self._backlog(target, context)
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(
                    metricName=request.metricName or METRIC, metricValue=int(value), metricValueFloat=value
                )
            ]
        )

    def StreamIsActive(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        last: bool | None = None
        held: set[tuple[str, str]] = set()  # the listeners this stream uses, released when it ends
        try:
            while context.is_active():
                target = self._target(request, context)
                listeners = self._listen(target, held)
                marks = [
                    listener.mark() for listener in listeners
                ]  # listening before measuring: no push missed
                active = self._backlog(target, context) > target.spec.activation
                if active != last:
                    log.info("push scaler: %s/%s %s", request.namespace, request.name,
                             "active" if active else "idle")  # fmt: skip
                    yield pb.IsActiveResponse(result=active)
                    last = active
                deadline = time.monotonic() + target.spec.polling_interval_seconds
                while context.is_active() and time.monotonic() < deadline:
                    if active:
                        time.sleep(min(MARK_EVERY_S, max(0.0, deadline - time.monotonic())))
                        continue
                    self._mark_waiting(target)
                    if self._notified(listeners, marks, MARK_EVERY_S):
                        break  # a push: measure now
        finally:
            self._release(held)

    def _listen(self, target: Target, held: set[tuple[str, str]]) -> list[Notifications]:
        """The listeners of the target's queues (one per queue, shared by the streams that
        watch it); `held` becomes the keys of exactly these, those no longer wanted released."""
        keys = [(target.scaled.admin.endpoint, names.qualified) for names in target.scaled.names]
        with self._lock:
            for key, names in zip(keys, target.scaled.names, strict=True):
                if key not in held:
                    if key not in self._listeners:
                        self._listeners[key] = (Notifications(target.scaled.admin, names), 0)
                    listener, users = self._listeners[key]
                    self._listeners[key] = (listener, users + 1)
            listeners = [self._listeners[key][0] for key in keys]
        self._release(held - set(keys))
        held.clear()
        held.update(keys)
        return listeners

    def _release(self, keys: set[tuple[str, str]]) -> None:
        """A stream no longer watches these queues: a listener nobody uses closes its session."""
        with self._lock:
            for key in keys:
                listener, users = self._listeners[key]
                if users > 1:
                    self._listeners[key] = (listener, users - 1)
                else:
                    del self._listeners[key]
                    listener.close()

    def _mark_waiting(self, target: Target) -> None:
        """Pushes onto these queues notify for the next WAIT_MARK_S seconds."""
        calls = " UNION ALL ".join(
            f"SELECT 1 FROM {pg_quote(n.schema)}.{pg_quote(n.routine('wait'))}({WAIT_MARK_S})"
            for n in target.scaled.names
        )
        try:
            self.databases.call(target.scaled.admin, calls)
        except psycopg.Error as e:
            log.info(
                "push scaler: cannot set the wait mark on %s: %s",
                target.scaled.admin.endpoint,
                type(e).__name__,
            )

    @staticmethod
    def _notified(listeners: list[Notifications], marks: list[int], seconds: float) -> bool:
        share = seconds / max(1, len(listeners))
        for listener, mark in zip(listeners, marks, strict=True):
            listener.wait(mark, share)
            if listener.mark() != mark:
                return True
        return False


def serve(port: int, kube: Kube, read_secret: SecretReader, host: str = "0.0.0.0") -> grpc.Server:
    """Start answering KEDA on `host:port` (plain gRPC); the server runs until stopped."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=STREAM_THREADS, thread_name_prefix="dbq-scaler")
    )
    rpc.add_ExternalScalerServicer_to_server(BacklogScaler(kube, read_secret), server)
    server.add_insecure_port(f"{host}:{port}")
    server.start()
    log.info("push scaler: answering KEDA on %s:%d", host, port)
    return server
