"""`dbq run` (the operator against a cluster) and `dbq crd`."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

import click

# glibc gives the threads that allocate their own malloc arenas (up to eight per core), and what
# is freed in one is seldom handed back: with its dozen threads the operator grew by about 45 MiB
# after applying 1,000 queues, against about 9 MiB with two arenas (bench/control_plane.py).
MALLOC_ARENAS = 2
M_ARENA_MAX = -8  # glibc's mallopt() parameter


def limit_malloc_arenas() -> bool:
    """At most MALLOC_ARENAS, unless MALLOC_ARENA_MAX says otherwise (glibc read it at start-up);
    nothing off glibc. Whether glibc took this limit."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS))


class RoutineSuccessAtDebug(logging.Filter):
    """kopf logs every timer run and every watch event handled that succeeded at INFO: a line
    per Queue per drift check, and per status write. Routine success belongs at DEBUG; state
    changes (created, updated, deleted, failed) stay at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno == logging.INFO and (
            (message.startswith("Timer ") and message.endswith(" succeeded."))
            or message == "Handler 'saw_queue' succeeded."
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


class _Duration(click.ParamType):
    """A duration as Kubernetes writes them (`500ms`, `15s`, `1m`), in seconds."""

    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        from dbq.api.durations import parse_duration

        try:
            return parse_duration(str(value)).total_seconds()
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = _Duration()


@click.command()
@click.argument(
    "kinds", nargs=-1, type=click.Choice(["queue", "topic", "subscription", "queueuser", "queueconsumer"])
)
def crd(kinds: tuple[str, ...]) -> None:
    """Print the CRDs generated from the API models (KINDS: queue, topic, subscription,
    queueuser, queueconsumer; all when none is named), as YAML documents."""
    from dbq.api.crd import CRDS, crd_yaml

    click.echo("---\n".join(crd_yaml(kind) for kind in kinds or CRDS), nl=False)


@click.command()
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch only these namespaces.")
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch the whole cluster (default without -n).")
@click.option(
    "--liveness", default="http://0.0.0.0:8080/healthz", show_default=True, help="Liveness endpoint."
)
@click.option(
    "--metrics-port", default=9090, show_default=True, type=int, help="Prometheus port; 0 disables."
)
@click.option(
    "--scaler-port",
    default=0,
    show_default=True,
    type=int,
    help="Serve KEDA's external scaler (QueueConsumers with trigger push) on this port; 0 disables."
    " Set DBQ_SCALER_ADDRESS to the host:port KEDA dials.",
)
@click.option(
    "--leader-elect", is_flag=True, help="Act only while holding the Lease (for two or more replicas)."
)
@click.option("--lease-namespace", envvar="POD_NAMESPACE", help="The Lease's namespace (env POD_NAMESPACE).")
@click.option("--lease-name", default="dbq-operator", show_default=True)
@click.option(
    "--identity",
    envvar="POD_NAME",
    help="This replica's name in the Lease (env POD_NAME; default: host name).",
)
@click.option("--lease-duration", type=DURATION, default="15s", show_default=True,
              help="How long a standby waits out a silent holder.")  # fmt: skip
@click.option("--renew-deadline", type=DURATION, default="10s", show_default=True,
              help="How long the holder may fail to renew before it exits.")  # fmt: skip
@click.option("--retry-period", type=DURATION, default="2s", show_default=True,
              help="Between tries to take or renew the Lease.")  # fmt: skip
@click.option("--verbose", "-v", is_flag=True)
def run(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness: str,
    metrics_port: int,
    scaler_port: int,
    leader_elect: bool,
    lease_namespace: str | None,
    lease_name: str,
    identity: str | None,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    verbose: bool,
) -> None:
    """Run the operator against the cluster in KUBECONFIG (or in-cluster)."""
    limit_malloc_arenas()  # before any thread starts
    import kopf
    from prometheus_client import start_http_server

    # importing the handler modules registers their handlers
    from dbq.controller import (  # noqa: F401
        access_handlers,
        consumer_handlers,
        handlers,
        leadership,
        metrics,
        topic_handlers,
    )

    # Under leader election every line names the replica that wrote it: the logs of two pods
    # then show which one acted when.
    who = f"[{identity or socket.gethostname()}] " if leader_elect else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s {who.replace('%', '%%')}%(name)s %(message)s",
    )
    logging.getLogger("kopf.objects").addFilter(RoutineSuccessAtDebug())
    if leader_elect:  # checked before anything listens
        if not lease_namespace:
            raise click.BadParameter(
                "give the Lease's namespace (or set POD_NAMESPACE)", param_hint="--lease-namespace"
            )
        try:
            lease = leadership.LeaseSettings(
                lease_namespace, identity or socket.gethostname(), lease_name, lease_duration, renew_deadline,
                retry_period,
            )  # fmt: skip
        except ValueError as e:
            raise click.BadParameter(
                str(e), param_hint="--lease-duration/--renew-deadline/--retry-period"
            ) from None
    if metrics_port:
        start_http_server(metrics_port)
    if scaler_port:  # every replica answers KEDA: the push scaler only reads
        from dbq.scaler.service import serve

        scaler = serve(scaler_port, handlers.kube(), handlers.read_secret)  # noqa: F841  (held: a dropped server stops)

    def act() -> None:
        """kopf in a thread of its own (its documented embedding), so this thread hears SIGTERM
        and SIGINT first: the handlers kopf has queued then end at once, and kopf stops."""
        failed: list[BaseException] = []

        def operate() -> None:
            try:
                kopf.run(
                    standalone=True,
                    clusterwide=all_namespaces or not namespaces,
                    namespaces=list(namespaces),
                    liveness_endpoint=liveness or None,
                    stop_flag=stop,
                )
            except BaseException as e:  # raised again in this thread
                failed.append(e)

        def told_to_stop(*_: Any) -> None:
            leadership.stopping.set()
            stop.set()

        stop = threading.Event()
        kopf_thread = threading.Thread(target=operate, name="kopf")
        previous = {sig: signal.signal(sig, told_to_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            kopf_thread.start()
            while kopf_thread.is_alive():
                kopf_thread.join(0.5)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failed:
            raise failed[0]

    if not leader_elect:
        metrics.LEADER.set(1)
        act()
        return
    from dbq import kube

    address = urlsplit(liveness) if liveness else None
    health = (address.hostname or "0.0.0.0", address.port or 80) if address else None
    sys.exit(leadership.run_elected(lease, kube.Kube().api_client, act, health,
                                    on_leading=lambda now: metrics.leading(now, leadership.acting_now),
                                    finish=handlers.finish_running))  # fmt: skip


COMMANDS = (crd, run)
