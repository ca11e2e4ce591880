"""A publisher process for the topic crash tests (PostgreSQL and Cassandra): publishes bodies
`<prefix>-<n>` to a topic until killed, singly or `--batch` at a time, writing `P <body>` to its
log after each publish returns (so a body published and not yet logged is possible, never the
reverse). With `--large N`, every fourth body is N bytes: its name, then filler."""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from dbq.client import connect_topic


def body_of(name: str, large: int) -> bytes:
    n = int(name.rsplit("-", 1)[1])
    return name.encode() if not large or n % 4 else (name + "|").encode().ljust(large, b"x")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("schema")
    p.add_argument("topic")
    p.add_argument("log")
    p.add_argument("--prefix", default="m")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--large", type=int, default=0, help="bytes of every fourth body (0: all small)")
    p.add_argument("--pipes-ending", type=float, default=0.0, help="pipes: tuning.ENDING_S")
    a = p.parse_args()
    if a.pipes_ending:
        from dbq.client.pipes import tuning

        tuning.ENDING_S = a.pipes_ending
    topic = connect_topic(a.url, a.topic, schema=a.schema)
    n = 0
    with open(a.log, "a", buffering=1) as log:
        while True:
            names = [f"{a.prefix}-{n + i}" for i in range(a.batch)]
            bodies = [body_of(name, a.large) for name in names]
            if a.batch == 1:
                topic.publish(bodies[0], headers={"n": n})
            else:
                topic.publish_many(bodies, headers=[{"n": n + i} for i in range(a.batch)])
            log.write("".join(f"P {name}\n" for name in names))
            n += a.batch


def run_until_killed(
    where: tuple[str, str, str], log: Path, options: list[str], rng: random.Random, most_s: float
) -> None:
    """Start a publisher to `where` (url, schema, topic) that logs to `log`, and kill it with
    SIGKILL a random time (up to `most_s`) after its first publish returned: on a loaded machine
    its start-up alone can take seconds."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *where, str(log), *options],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 120
    while not (log.exists() and log.stat().st_size) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the publisher exited with {proc.returncode} before its first publish"
    time.sleep(rng.uniform(0.0, most_s))
    proc.send_signal(signal.SIGKILL)  # a process this test started
    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
