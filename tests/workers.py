"""Client processes for the conservation and crash tests (tests/queue_worker.py) and their logs."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKER = str(Path(__file__).with_name("queue_worker.py"))


def start(role: str, q: Any, url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A worker process on the queue of client `q` (ring or pipes), logging to `log`."""
    return subprocess.Popen(
        [sys.executable, WORKER, role, url, q.names.queue, q.names.schema, str(log), *args],
        stderr=subprocess.PIPE,
    )


def read_logs(logs: list[Path]) -> dict[str, Counter[str]]:
    """Each kind of line (see tests/queue_worker.py: P pushes, G deliveries, A acks, N nacks,
    L lost leases, F failed pushes, X failed acks, B damaged bodies) as a multiset of bodies (their
    names, for large ones)."""
    seen: dict[str, Counter[str]] = {kind: Counter() for kind in "PGANLFXB"}
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                kind, _, body = line.partition(" ")
                if kind in seen:
                    seen[kind][body] += 1
    return seen


def finish(procs: list[subprocess.Popen[bytes]], timeout: float = 600) -> None:
    """Wait for workers; each must exit 0 (its stderr tail is the failure message)."""
    for p in procs:
        p.wait(timeout=timeout)
        err = p.stderr.read().decode() if p.stderr else ""
        assert p.returncode == 0, f"worker failed: {err[-2000:]}"


def kill(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL workers and reap them."""
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


def conserve_through_logins(
    q: Any,
    producer: str,
    worker: str,
    operator: str,
    tmp_path: Path,
    mode: str,
    final_repair: Callable[[], object],
) -> None:
    """The contract suite's conservation run (4 pushing processes, 4 taking, a repairer) on the
    queue of client `q` (the operator's), with the producers on url `producer`, the workers on
    `worker` and the repairer on `operator`: the multiset delivered equals the multiset pushed."""
    n, stop = 4000, tmp_path / "stop"
    logs = [tmp_path / f"w{i}.log" for i in range(9)]
    before = q.stats()
    pushers = [start("push", q, producer, logs[i], "--prefix", f"p{i}", "--count", str(n // 4), "--batch", "40")
               for i in range(4)]  # fmt: skip
    poppers = [start("pop", q, worker, logs[4 + i], "--mode", mode, "--batch", "40", "--stop", str(stop))
               for i in range(4)]  # fmt: skip
    repairer = start("repair", q, operator, logs[8], "--stop", str(stop))
    finish(pushers)
    stop.touch()
    finish([*poppers, repairer])
    final_repair()
    drained = [m.body.decode() for m in q.pop_many(1000, timeout=0)]
    seen = read_logs(logs)
    delivered = seen["G"] if mode == "amo" else seen["A"]
    delivered.update(drained)
    assert sum(seen["P"].values()) == n and len(seen["P"]) == n
    assert delivered == seen["P"]  # nothing lost, nothing twice
    s = q.stats()
    assert (s.depth, s.in_flight) == (0, 0)
    assert s.pushed - before.pushed == n
