"""Control-plane benchmark on the local stack (real API server, real PostgreSQL).

Prints: apply-to-Ready p50/p95 for one queue at a time and for N queues applied together
(created by --appliers threads, as a GitOps tool applies several at once; Ready seen by a watch
started before the first create, so nothing polls a thousand queues meanwhile), the operator's
RSS with N queues, the most connections it held to the database (sampled from
pg_stat_activity every 0.5 s), and Kubernetes API writes per queue per minute at steady state
(the operator must not hot-loop). The baseline in the same run is an idle window before any
queue exists, so the API's own background writes are not counted against dbq.

Then a maintenance of one queue that lasts --maintenance seconds: its ring gets dead rows, its
schedule becomes every minute, and the bench holds a lock its VACUUM waits on. Meanwhile every
queue's statistics samples (its history table) must keep coming: printed, the gaps between
consecutive samples of all queues in that time, against the stats interval (15 s).

Several fleet sizes (--queues 100 1000 10000) run one after the other, each in a namespace of
its own with an operator of its own and deleted before the next; then the curve: time to Ready,
idle cores and RSS by fleet size, per queue. --sigkill-after and --sigterm-after hit the largest.

    ~/.cache/dbq/venv/bin/python -m bench.control_plane --queues 1000 --steady 60
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyodbc
from bench.cpu import cpu_of_programs, cpu_seconds
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from dbq.devstack import Stack
from dbq.devstack.kube import ADMIN_USER

ROOT = Path(__file__).resolve().parent.parent
G, V, P = "dbq.dev", "v1alpha1", "queues"


def log_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def api_writes(stack: Stack) -> Counter[str]:
    """Write requests the API server has served so far (all clients), from its /metrics, by
    "VERB resource/subresource"."""
    request = urllib.request.Request(
        f"{stack.kube.url}/metrics", headers={"Authorization": f"Bearer {stack.kube.token(ADMIN_USER)}"}
    )
    with urllib.request.urlopen(request, context=stack.kube.ssl_context(), timeout=10) as resp:
        text = resp.read().decode()
    writes: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in ("POST", "PUT", "PATCH", "DELETE"):
            what = "/".join(filter(None, (labels.get("resource"), labels.get("subresource"))))
            writes[f"{labels['verb']} {what}"] += float(line.rsplit(" ", 1)[1])
    return writes


def per(since: Counter[str], until: Counter[str], unit: float) -> dict[str, float]:
    return {k: (until[k] - since[k]) / unit for k in sorted(until) if until[k] > since[k]}


def say(line: str) -> None:
    print(line, flush=True)


PROGRAMS = ("postgres", "kube-apiserver", "etcd")  # by the start of their process name


class PostgresParts(threading.Thread):
    """PostgreSQL's CPU time by part, from every process of it sampled each 0.5 s (its ended
    processes' time is counted up to their last sample): "sessions" (client backends, the
    operator's pooled connections among them), "autovacuum" (launcher and workers) and "other"
    (postmaster, checkpointer, writers)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.last: dict[int, tuple[str, float]] = {}  # pid: (part, CPU seconds at its last sample)
        self.done: Counter[str] = Counter()  # CPU seconds of processes no longer alive
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            seen = {}
            for stat in Path("/proc").glob("[0-9]*/stat"):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if stat.read_text().split(" (", 1)[1].startswith("postgres)"):
                        seen[int(stat.parent.name)] = (
                            self.part(stat.parent),
                            cpu_seconds(int(stat.parent.name)),
                        )
            for pid, (part, used) in self.last.items():
                if pid not in seen:
                    self.done[part] += used
            self.last = seen

    @staticmethod
    def part(proc: Path) -> str:
        title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if not title.startswith("postgres: "):
            return "other"  # the postmaster
        first = title.split()[1]
        return "autovacuum" if first == "autovacuum" else "other" if first in BACKGROUND else "sessions"

    def totals(self) -> Counter[str]:
        now = Counter(self.done)
        for part, used in list(self.last.values()):
            now[part] += used
        return Counter({f"postgres {k}": v for k, v in now.items()})


# The first word of a background process's title ("postgres: checkpointer").
BACKGROUND = {"checkpointer", "background", "walwriter", "logical", "io", "archiver", "startup"}
PARTS = ("postgres sessions", "postgres autovacuum", "postgres other")


def cpu_by_program(operator: int, parts: PostgresParts) -> Counter[str]:
    """CPU time so far of the operator, of every process of PROGRAMS on the machine, and of
    PostgreSQL by part."""
    return Counter({"operator": cpu_seconds(operator)}) + cpu_of_programs(PROGRAMS) + parts.totals()


def core_figures(since: Counter[str], until: Counter[str], seconds: float) -> dict[str, float]:
    """Cores used between two `cpu_by_program` readings `seconds` apart, by program."""
    return {k: (until[k] - since[k]) / seconds for k in ("operator", *PROGRAMS, *PARTS)}


def cores_text(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in figures.items())


def cores(since: Counter[str], until: Counter[str], seconds: float) -> str:
    return cores_text(core_figures(since, until, seconds))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def queue(name: str, ns: str, schema: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}", "kind": "Queue", "metadata": {"name": name, "namespace": ns},
        "spec": {"backend": "postgres", "design": "ring", "ring": {"size": size}, "deletionPolicy": "Delete",
                 "connection": {"secretRef": {"name": "bench-db"}, "schema": schema}},
    }  # fmt: skip


def schema_of(name: str, index: int, schemas: int) -> str:
    """A schema per queue (--schemas 0), or the queues spread over that many schemas."""
    return f"bench_{name.replace('-', '_')}" if schemas <= 0 else f"bench_s{index % schemas:03d}"


class ReadyWatch:
    """When each Queue of the namespace first had Ready=True, from a watch started before they
    are created (as `kubectl wait` does): no polling of a thousand queues, which would load the
    API server the operator is measured on. While `counting`, it also counts which parts of
    the Queues changed (a status field, metadata, spec), to tell what the steady writes are."""

    def __init__(self, custom: client.CustomObjectsApi, ns: str) -> None:
        self.custom, self.ns = custom, ns
        self.seen: dict[str, float] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.counting = False
        self.changes: Counter[str] = Counter()
        self.changed = threading.Condition()
        self.watch = watch.Watch()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        version = self.relist()
        while True:
            try:
                for event in self.watch.stream(self.custom.list_namespaced_custom_object, G, V, self.ns, P,
                                               resource_version=version, timeout_seconds=240):  # fmt: skip
                    version = event["object"]["metadata"]["resourceVersion"]
                    self.saw(event["object"])
            except ApiException as e:
                if e.status != 410:  # 410: that version is compacted away; list again
                    raise
                version = self.relist()

    def relist(self) -> str:
        listed = self.custom.list_namespaced_custom_object(G, V, self.ns, P)
        for item in listed["items"]:
            self.saw(item)
        return str(listed["metadata"]["resourceVersion"])

    def saw(self, item: dict[str, Any]) -> None:
        conds = (item.get("status") or {}).get("conditions") or []
        name = item["metadata"]["name"]
        if self.counting:
            self.changes.update(changed_parts(self.last.get(name, {}), item))
        self.last[name] = item
        if name not in self.seen and any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            with self.changed:
                self.seen[name] = time.monotonic()
                self.changed.notify_all()

    def wait(self, names: set[str], timeout: float) -> dict[str, float]:
        with self.changed:
            if not self.changed.wait_for(lambda: names <= self.seen.keys(), timeout):
                left = len(names - self.seen.keys())
                raise SystemExit(f"{left} of {len(names)} queues did not become Ready within {timeout}s")
            return {n: self.seen[n] for n in names}


def changed_parts(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """status.<field>, metadata or spec: the parts that differ between two versions of a Queue."""

    def parts(doc: dict[str, Any]) -> dict[str, Any]:
        meta = {
            k: v for k, v in doc.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")
        }
        status = {f"status.{k}": v for k, v in (doc.get("status") or {}).items()}
        return {**status, "metadata": meta, "spec": doc.get("spec")}

    before, after = parts(old), parts(new)
    return [k for k in before.keys() | after.keys() if before.get(k) != after.get(k)]


class ConnectionCount:
    """The operator's connections to the database, sampled every 0.5 s: the most per phase."""

    def __init__(self, odbc: str) -> None:
        self.cur = pyodbc.connect(odbc, autocommit=True).cursor()
        self.phase = "idle"
        self.most: dict[str, int] = {}
        self.exclude: set[int] = set()  # the bench's own
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            pids = [r[0] for r in self.cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()]  # fmt: skip
            n = len([p for p in pids if p not in self.exclude])
            self.most[self.phase] = max(self.most.get(self.phase, 0), n)


def maintenance_gaps(
    custom: client.CustomObjectsApi,
    odbc: str,
    ns: str,
    schemas: dict[str, str],
    hold_s: float,
    exclude: set[int],
) -> tuple[list[float], float, float]:
    """Holds the first queue's maintenance for `hold_s` s; the gaps (s) between consecutive
    stats samples of every queue (by name: its schema) in that time, the first queue's longest
    gap, and how long the VACUUM waited."""
    names = sorted(schemas)
    victim = names[0]
    ring = f'"{schemas[victim]}"."{victim.replace("-", "_")}_ring"'
    admin = pyodbc.connect(odbc, autocommit=True)
    admin.execute(f"ALTER TABLE {ring} SET (autovacuum_enabled = false)")
    for _ in range(3):
        admin.execute(f"UPDATE {ring} SET attempts = attempts")  # dead rows: 3 per slot
    holder = pyodbc.connect(odbc, autocommit=False)
    for conn in (admin, holder):  # the bench's own, not counted as the operator's
        exclude.add(int(conn.execute("SELECT pg_backend_pid()").fetchval()))
    holder.execute(f"LOCK TABLE {ring} IN SHARE UPDATE EXCLUSIVE MODE")  # VACUUM waits on it
    time.sleep(2)  # the dead rows reach pg_stat_user_tables
    patch = {"spec": {"reindex": {"schedule": "* * * * *", "threshold": {"deadTuplePercent": 5}}}}
    custom.patch_namespaced_custom_object(G, V, ns, P, victim, patch)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        waiting = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'VACUUM%' AND wait_event_type = 'Lock'"
        ).fetchval()
        if waiting:
            break
        time.sleep(0.5)
    else:
        raise SystemExit("the maintenance never started its VACUUM")
    started = float(admin.execute("SELECT extract(epoch FROM clock_timestamp())").fetchval())
    time.sleep(hold_s)
    holder.rollback()
    holder.close()
    ended = float(admin.execute("SELECT extract(epoch FROM clock_timestamp())").fetchval())
    gaps: list[float] = []
    victim_gap = 0.0
    samples: dict[str, list[float]] = {name.replace("-", "_"): [] for name in names}
    for schema in set(schemas.values()):
        for queue_name, at in admin.execute(
            f'SELECT queue, extract(epoch FROM at) FROM "{schema}".dbq_stats_history WHERE at >= to_timestamp(?)'
            " - interval '30 seconds' AND at <= to_timestamp(?) ORDER BY at", started, ended).fetchall():  # fmt: skip
            if queue_name in samples:
                samples[queue_name].append(float(at))
    for name in names:
        ats = samples[name.replace("-", "_")]
        inside = [b - a for a, b in itertools.pairwise(ats) if b >= started]
        inside.append(ended - ats[-1] if ats else ended - started)  # the wait since the last one
        gaps += inside
        if name == victim:
            victim_gap = max(inside)
    admin.close()
    return gaps, victim_gap, ended - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, nargs="+", default=[200],
                    help="fleet sizes, smallest first: each is applied, measured and deleted in turn, then the curve")  # fmt: skip
    ap.add_argument("--singles", type=int, default=10)
    ap.add_argument("--appliers", type=int, default=8, help="threads creating the queues")
    ap.add_argument("--steady", type=float, default=90, help="seconds of steady state to count API writes")
    ap.add_argument("--maintenance", type=float, default=60, help="seconds one queue's maintenance is held")
    ap.add_argument("--schemas", type=int, default=0, help="schemas the queues share (0: one each)")
    ap.add_argument("--ring-size", type=int, default=64)
    ap.add_argument(
        "--sigterm-after",
        type=float,
        default=None,
        help="SIGTERM the operator this many seconds into the deletion of the largest fleet, then start a successor",
    )
    ap.add_argument(
        "--sigkill-after",
        type=float,
        default=None,
        help="SIGKILL the operator this many seconds after the largest fleet's first create, then start a successor",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=5,
        help="seconds between all Ready and the steady window (a used queue rests after stalledAfter, 5m)",
    )
    args = ap.parse_args()
    if args.queues != sorted(args.queues):
        ap.error("--queues: give the fleet sizes smallest first, e.g. --queues 100 1000 10000")

    stack = Stack()
    stack.up(("kube", "postgres"))
    api = config.new_client_from_config(config_file=str(stack.kube.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    subprocess.run(["kubectl", "--kubeconfig", str(stack.kube.kubeconfig), "apply", "-k", str(ROOT / "crds")],
                   check=True, capture_output=True)  # fmt: skip
    curve = []
    for count in args.queues:
        faults = count == args.queues[-1]
        say(f"## {count} queues")
        curve.append(run_fleet(args, stack, core, custom, count, faults))
    if len(curve) > 1:
        say_curve(curve)


@dataclass
class Figures:
    """What the curve compares across fleet sizes."""

    queues: int
    ready_after_s: float = 0.0
    idle: dict[str, float] = field(default_factory=dict)  # cores at steady state, by program
    rss_mib: float = 0.0
    gap_p95_s: float = 0.0
    delete_s: float = 0.0


def say_curve(curve: list[Figures]) -> None:
    say("## the curve: cost per queue by fleet size")
    say("queues   all Ready after   per queue   idle operator   idle PostgreSQL   per 1,000 queues (op + PG)"
        "   RSS        stats gap p95   deleted in   per second")  # fmt: skip
    for f in curve:
        op, pg = f.idle.get("operator", 0.0), f.idle.get("postgres", 0.0)
        say(f"{f.queues:>6}   {f.ready_after_s:>13.1f} s   {1000 * f.ready_after_s / f.queues:>6.1f} ms"
            f"   {op:>10.2f} core   {pg:>12.2f} core   {1000 * (op + pg) / f.queues:>21.3f} core"
            f"   {f.rss_mib:>5.0f} MiB   {f.gap_p95_s:>11.1f} s   {f.delete_s:>8.0f} s   {f.queues / max(f.delete_s, 1e-9):>9.1f}")  # fmt: skip


def run_fleet(args: argparse.Namespace, stack: Stack, core: client.CoreV1Api, custom: client.CustomObjectsApi,
              count: int, faults: bool) -> Figures:  # fmt: skip
    """One fleet of `count` queues in a namespace of its own, from the first apply to the last
    deletion, with an operator of its own; SIGKILL and SIGTERM (`faults`) as the options say."""
    env = {**os.environ, "KUBECONFIG": str(stack.kube.kubeconfig)}
    figures = Figures(count)
    sigkill_after, sigterm_after = (args.sigkill_after, args.sigterm_after) if faults else (None, None)
    ns = f"bench-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_secret(
        ns,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="bench-db"), string_data={"url": stack.postgres.url()}
        ),
    )
    log = open(stack.paths.state / "bench-operator.log", "wb")  # noqa: SIM115
    op = operator(ns, env, log)
    connections = ConnectionCount(stack.postgres.odbc())
    pg_parts = PostgresParts()
    readiness = ReadyWatch(custom, ns)
    try:
        time.sleep(3)
        base_start, t0 = api_writes(stack), time.monotonic()
        time.sleep(20)
        baseline = sum(per(base_start, api_writes(stack), (time.monotonic() - t0) / 60).values())

        singles = []
        for i in range(args.singles):
            name = f"single-{i}"
            start = time.monotonic()
            custom.create_namespaced_custom_object(
                G, V, ns, P, queue(name, ns, f"bench_{name.replace('-', '_')}", args.ring_size)
            )
            singles.append(readiness.wait({name}, 60)[name] - start)

        names = {f"q-{i:03d}" for i in range(count)}
        schemas = {name: schema_of(name, i, args.schemas) for i, name in enumerate(sorted(names))}
        connections.phase = "apply"
        created: dict[str, float] = {}

        def create(name: str) -> None:
            created[name] = time.monotonic()
            custom.create_namespaced_custom_object(
                G, V, ns, P, queue(name, ns, schemas[name], args.ring_size)
            )

        apply_cpu, apply_start, apply_writes = (
            cpu_by_program(op.pid, pg_parts),
            time.monotonic(),
            api_writes(stack),
        )
        with ThreadPoolExecutor(args.appliers + 1) as appliers:  # a GitOps tool applies several at once
            killed = None
            if sigkill_after is not None:
                killed = appliers.submit(kill_and_succeed, op, sigkill_after, ns, env, log)
            list(appliers.map(create, sorted(names)))
            created_all = time.monotonic()
            op = killed.result() if killed is not None else op
        ready = readiness.wait(names, max(600.0, 0.3 * count))  # 10,000 take minutes
        apply_cores = (
            cores(apply_cpu, cpu_by_program(op.pid, pg_parts), time.monotonic() - apply_start)
            if killed is None
            else "not measured (the operator was killed)"
        )
        writes_per_queue = per(apply_writes, api_writes(stack), count)
        many = [ready[n] - created[n] for n in names]
        rss = rss_mib(op.pid)
        say(f"apply-to-Ready, one queue at a time (n={len(singles)}): p50 {pct(singles, 0.5):.3f}s"
            f"  p95 {pct(singles, 0.95):.3f}s")  # fmt: skip
        say(f"apply-to-Ready, {count} queues at once:         p50 {pct(many, .5):.3f}s  p95 {pct(many, .95):.3f}s"
            f"  (all Ready after {max(ready.values()) - min(created.values()):.1f}s;"
            f" creating them took {created_all - min(created.values()):.1f}s)")  # fmt: skip
        first = min(created.values())
        figures.ready_after_s = max(ready.values()) - first
        say("queues Ready, by seconds since the first was created: " + ", ".join(
            f"{t}s {sum(ready[n] - first <= t for n in names)}"
            for t in range(10, int(max(ready.values()) - first) + 10, 10)))  # fmt: skip
        say(f"CPU until all were Ready, cores: {apply_cores}")
        say(f"API writes until all were Ready, per queue: {sum(writes_per_queue.values()):.2f}; by request: "
            + ", ".join(f"{k} {v:.2f}" for k, v in writes_per_queue.items()))  # fmt: skip
        if killed is not None:
            say(whole_queues(stack.postgres.odbc(), schemas))

        time.sleep(args.settle)
        connections.phase = "steady"
        w0, lines0, t0 = api_writes(stack), log_lines(log.name), time.monotonic()
        cpu0 = cpu_by_program(op.pid, pg_parts)
        readiness.counting = True
        time.sleep(args.steady)
        readiness.counting = False
        minutes = (time.monotonic() - t0) / 60
        figures.idle = core_figures(cpu0, cpu_by_program(op.pid, pg_parts), minutes * 60)
        figures.rss_mib = rss_mib(op.pid)
        steady_writes = per(w0, api_writes(stack), minutes)
        steady = sum(steady_writes.values())
        log_rate = (log_lines(log.name) - lines0) / minutes
        total_queues = count + args.singles
        say(f"operator RSS with {total_queues} queues: {rss:.0f} MiB after apply,"
            f" {figures.rss_mib:.0f} MiB after steady state")  # fmt: skip
        say(f"API writes at steady state ({args.steady:.0f}s, drift timer every 60s): {steady:.1f}/min in all, "
            f"{(steady - baseline) / total_queues:.3f} per queue per minute (idle baseline {baseline:.1f}/min)")  # fmt: skip
        say("  by request: " + ", ".join(f"{k} {v:.1f}/min" for k, v in steady_writes.items()))
        say("  Queue changes seen by a watch: " + (", ".join(
            f"{k} {v}" for k, v in readiness.changes.most_common()) or "none"))  # fmt: skip
        say(f"operator log lines at steady state: {log_rate:.1f}/min with {total_queues} idle queues")
        say(f"CPU at steady state, cores: {cores_text(figures.idle)}")
        connections.phase = "maintenance"
        gaps, victim_gap, held = maintenance_gaps(
            custom, stack.postgres.odbc(), ns, schemas, args.maintenance, connections.exclude
        )
        figures.gap_p95_s = pct(gaps, 0.95)
        say(f"stats samples while one queue's maintenance waited {held:.0f} s: gap p50 {pct(gaps, .5):.1f}s"
            f"  p95 {pct(gaps, .95):.1f}s  max {max(gaps):.1f}s (interval 15 s; target p95 <= 30 s);"
            f" the maintained queue's longest gap {victim_gap:.1f}s; RSS then {rss_mib(op.pid):.0f} MiB")  # fmt: skip
        say("most connections of the operator to the database: " + ", ".join(
            f"{phase} {n}" for phase, n in connections.most.items()))  # fmt: skip
    finally:
        connections.phase = "delete"
        started, delete_cpu, delete_writes = (
            time.monotonic(),
            cpu_by_program(op.pid, pg_parts),
            api_writes(stack),
        )
        with ThreadPoolExecutor(args.appliers) as deleters:
            list(deleters.map(lambda item: delete(custom, ns, item["metadata"]["name"]),
                              custom.list_namespaced_custom_object(G, V, ns, P)["items"]))  # fmt: skip
        if sigterm_after is not None:
            op = stop_and_succeed(op, sigterm_after, started, custom, ns, env, log)
        deadline = time.monotonic() + max(300.0, 0.1 * count)
        while (left := count_queues(custom, ns)) and time.monotonic() < deadline:
            time.sleep(2)
        took = figures.delete_s = time.monotonic() - started
        say(f"deleted the queues in {took:.0f} s from the first delete ({left} left);"
            f" connections while deleting {connections.most.get('delete', 0)}")  # fmt: skip
        if sigterm_after is None:  # one operator did it all
            say(f"CPU while deleting, cores: {cores(delete_cpu, cpu_by_program(op.pid, pg_parts), took)}")
            say("API writes while deleting, per queue: " + ", ".join(
                f"{k} {v:.2f}" for k, v in per(delete_writes, api_writes(stack), count + args.singles).items()))  # fmt: skip
        if sigterm_after is not None:
            say(leftovers(stack.postgres.odbc(), core, ns))
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(timeout=60)
        except subprocess.TimeoutExpired:
            say("the operator did not stop within 60 s of SIGTERM: killed")
            op.kill()
        connections.stop.set()
        pg_parts.stop.set()
    return figures


def delete(custom: client.CustomObjectsApi, ns: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        custom.delete_namespaced_custom_object(G, V, ns, P, name)


def count_queues(custom: client.CustomObjectsApi, ns: str) -> int:
    return len(custom.list_namespaced_custom_object(G, V, ns, P)["items"])


def operator(ns: str, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "dbq.cli", "run", "-n", ns, "--metrics-port", "0", "--liveness", ""],
                            env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def kill_and_succeed(op: subprocess.Popen[bytes], after: float, ns: str, env: dict[str, str],
                     log: Any) -> subprocess.Popen[bytes]:  # fmt: skip
    """SIGKILL to the operator `after` seconds from now (into the apply), then a successor."""
    time.sleep(after)
    op.kill()
    op.wait()
    say(f"SIGKILL {after:.0f} s after the first create; a successor started")
    return operator(ns, env, log)


def whole_queues(odbc: str, schemas: dict[str, str]) -> str:
    """Whether every schema holds its queues' objects exactly once each: the relations (tables,
    sequences) and routines of a queue times its queues, its two shared tables, a metadata row a
    queue. A queue made twice, or half made, counts as a mismatch."""
    queues: Counter[str] = Counter(schemas.values())
    mismatched: list[str] = []
    with pyodbc.connect(odbc, autocommit=True) as db:
        counts = {
            schema: tuple(db.execute(
                "SELECT (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'S')),"
                " (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = n.oid)"
                " FROM pg_namespace n WHERE n.nspname = ?", schema).fetchone() or (0, 0))
            for schema in queues
        }  # fmt: skip
        per_queue = None
        for schema, n in queues.items():
            relations, routines = counts[schema]
            rows = db.execute(f'SELECT count(*) FROM "{schema}".dbq_queues').fetchval()
            per_queue = per_queue or ((relations - 2) // n, routines // n)
            if (relations, routines, rows) != (2 + n * per_queue[0], n * per_queue[1], n):
                mismatched.append(schema)
    return (f"after the SIGKILL, objects by schema: {len(queues) - len(mismatched)} of {len(queues)} hold each"
            f" of their queues exactly once ({per_queue[0] if per_queue else 0} relations and"
            f" {per_queue[1] if per_queue else 0} routines a queue); mismatched: {mismatched[:5]}")  # fmt: skip


def stop_and_succeed(op: subprocess.Popen[bytes], after: float, started: float, custom: client.CustomObjectsApi,
                     ns: str, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:  # fmt: skip
    """SIGTERM to the operator `after` seconds into the deletion; how long it took to exit, with
    how many deletions pending; then a successor, which finishes them."""
    time.sleep(max(0.0, started + after - time.monotonic()))
    pending = count_queues(custom, ns)
    stopping = time.monotonic()
    op.send_signal(signal.SIGTERM)
    try:
        op.wait(timeout=120)
        say(f"SIGTERM with {pending} deletions pending: the operator exited in {time.monotonic() - stopping:.1f} s"
            f" (code {op.returncode}); {count_queues(custom, ns)} Queues left for its successor")  # fmt: skip
    except subprocess.TimeoutExpired:
        say(f"SIGTERM with {pending} deletions pending: the operator did not exit within 120 s: killed")
        op.kill()
        op.wait()
    return operator(ns, env, log)


def leftovers(odbc: str, core: client.CoreV1Api, ns: str) -> str:
    """What the deletions left in the database (bench schemas and queue roles) and which queue
    had a Deleted Event more than once."""
    with pyodbc.connect(odbc, autocommit=True) as db:
        schemas = db.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench\\_%'").fetchval()
        roles = db.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname ~ '^dbq_o_bench_(s|q_|single_)[0-9]'"
        ).fetchval()
    deleted: Counter[str] = Counter()
    for event in core.list_namespaced_event(ns, field_selector="reason=Deleted").items:
        deleted[event.involved_object.name] += event.count or 1
    twice = [name for name, n in deleted.items() if n > 1]
    return (f"left behind: {schemas} bench schemas, {roles} bench roles; Deleted Events for {len(deleted)} Queues,"
            f" {len(twice)} of them more than once {sorted(twice)[:5]}")  # fmt: skip


if __name__ == "__main__":
    main()
