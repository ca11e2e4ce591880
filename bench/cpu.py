"""CPU time of processes on this machine, from /proc (the benches run alone on it)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User and system CPU time of a process so far (and of its children that ended)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11 : 15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def backend_ns(pid: int) -> int:
    """CPU time a process (a PostgreSQL backend, say) has used so far, in nanoseconds."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def cpu_of_programs(programs: Iterable[str]) -> Counter[str]:
    """CPU time so far of every process whose name starts with one of `programs`, with the
    children that ended (a postmaster counts its finished sessions), by program."""
    programs = tuple(programs)
    total: Counter[str] = Counter()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = stat.read_text().split(" (", 1)[1].split(")", 1)[0]
            for program in programs:
                if comm.startswith(program):
                    total[program] += cpu_seconds(int(stat.parent.name), children=True)
    return total


@contextlib.contextmanager
def on_one_cpu() -> Iterator[int]:
    """Every thread of this process, and the threads they start meanwhile, on one CPU, as
    `taskset -a -c` would; the CPUs they had, back afterwards."""
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), {cpu})
    try:
        yield cpu
    finally:
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task.name), allowed)
