"""Keeps one process of the local cluster running: `python keeper.py -- ARGV...` starts ARGV and
starts it again whenever it dies after running a while, as a service manager would (the kubelet
of Kubernetes 1.33 once panicked here and nothing brought the node back). A process that dies
within MIN_UPTIME_S of its start failed to start: the keeper exits with its code, so `dbq dev up`
reports it with the log instead of retrying for ever. SIGTERM and SIGINT are passed on; the
keeper then exits with the process's code.

A script of the standard library only, run by path: it imports nothing of dbq."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

MIN_UPTIME_S = 30.0
RESTART_DELAY_S = 1.0


def keep(argv: list[str]) -> int:
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def pass_on(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    while True:
        started = time.monotonic()
        child = subprocess.Popen(argv)
        code = child.wait()
        ran = time.monotonic() - started
        if stopping or ran < MIN_UPTIME_S:
            return code
        print(f"dbq keeper: {argv[0]} exited with code {code} after {ran:.0f} s; starting it again",
              flush=True)  # fmt: skip
        time.sleep(RESTART_DELAY_S)
        if stopping:
            return code


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--":
        sys.exit("usage: keeper.py -- PROGRAM [ARGUMENT...]")
    sys.exit(keep(sys.argv[2:]))
