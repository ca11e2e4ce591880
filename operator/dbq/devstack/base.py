"""Process bookkeeping shared by the local stack's components.

Each component runs as one process we start ourselves; its pid is kept in a file
under the state directory so `down` stops exactly what `up` started and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

KEEPER = Path(__file__).with_name("keeper.py")
# A component's log past this size when it starts is moved to <log>.old (replacing the one
# before): logs of a stack that runs for months stay bounded.
LOG_KEEP_BYTES = 64 << 20
# The single-node cluster's bridge address: the pods' gateway and the node's address, where the
# kubelet serves (the API server reaches it there for logs and exec; a loopback node address is
# refused), and where pods reach the stack's databases.
NODE_IP = "10.244.0.1"


class StackError(RuntimeError):
    """A component could not be started or is not ready; the message carries its log tail."""


@dataclass(frozen=True)
class Paths:
    """Where binaries are cached (survives clones) and where runtime state lives."""

    cache: Path
    state: Path

    @classmethod
    def from_env(cls) -> Paths:
        cache = Path(os.environ.get("DBQ_CACHE", Path.home() / ".cache" / "dbq"))
        # Under /var/tmp rather than $HOME: PostgreSQL runs as the `postgres` user when we are
        # root and must be able to reach its data directory.
        state = Path(os.environ.get("DBQ_STATE", f"/var/tmp/dbq-{os.getuid()}"))
        return cls(cache=cache, state=state)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class ManagedProcess:
    """One long-running process identified by a pid file and an executable marker. A `kept`
    one runs under keeper.py, which starts it again when it crashes (the pid file names the
    keeper)."""

    def __init__(self, name: str, state: Path, marker: str, kept: bool = False) -> None:
        self.name = name
        self.dir = state / name
        self.pid_file = self.dir / "pid"
        self.log = self.dir / f"{name}.log"
        # A substring of /proc/PID/cmdline, so a recycled pid is never mistaken for ours.
        self.marker = marker
        self.child: subprocess.Popen[bytes] | None = None  # set when this process started it
        self.kept = kept

    def running(self) -> bool:
        """Whether the process is up; for a child we started, asks the child itself (and reaps it)."""
        if self.child is not None:
            return self.child.poll() is None
        return self.pid() is not None

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        return pid if self.marker in _cmdline(pid) else None

    def unkept(self) -> bool:
        """Whether this should run under a keeper but was started without one (by an older dbq)."""
        pid = self.pid()
        return self.kept and pid is not None and f"{KEEPER.name} -- " not in _cmdline(pid)

    def start(self, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.kept:
            argv = [sys.executable, str(KEEPER), "--", *argv]
        if self.log.exists() and self.log.stat().st_size > LOG_KEEP_BYTES:
            self.log.replace(self.log.with_name(self.log.name + ".old"))
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        self.pid_file.write_text(str(proc.pid))
        self.child = proc
        return proc.pid

    def stop(self, grace: float = 20.0) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pid_alive(pid):
            _reap(pid)
            time.sleep(0.2)
        if pid_alive(pid) and self.kept:  # the keeper with the process it keeps (its group)
            os.killpg(pid, signal.SIGKILL)
        elif pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
        self.pid_file.unlink(missing_ok=True)
        return True


def _cmdline(pid: int) -> str:
    """The process's command line, words joined by spaces; empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def wait_until(
    check: Callable[[], bool], *, timeout: float, what: str, log: Path, alive: Callable[[], bool]
) -> None:
    """Poll `check` until it is true; fail fast with the log tail if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            time.sleep(0.5)  # let its last words reach the log
            raise StackError(f"{what} exited during start-up; last log lines:\n{log_tail(log)}")
        time.sleep(0.5)
    raise StackError(f"{what} not ready after {timeout:.0f}s; last log lines:\n{log_tail(log)}")
