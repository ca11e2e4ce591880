"""A queue client process (ring or pipes, by the url) for the conservation and crash tests
(run as a script, so SIGKILL is real).

    queue_worker.py push   URL QUEUE SCHEMA LOG --prefix P --count N [--batch B]
    queue_worker.py pop    URL QUEUE SCHEMA LOG --mode amo|leased [--batch B] [--stop FILE]
    queue_worker.py repair URL QUEUE SCHEMA LOG [--stop FILE]

Each line of LOG is written (and flushed to the kernel) right after the database answered:
`P <body>` an acknowledged push, `G <body>` a delivery (pop returned, or acquire returned),
`A <body>` an acknowledged ack, `N <body>` a nack, `L <body>` an ack refused (lease lost).
With --large N every fourth body pushed is N bytes: its name, `|`, then filler derived from the
name; lines name it, and a delivery whose filler differs is logged `B <name>` (a body damaged).
With --tolerate-outages a call that failed (the database unreachable for a while) is logged and
the worker goes on, as an application would: `F <body>` a push that failed (stored or not),
`X <body>` an ack or nack that failed (applied or not). A process killed at any point loses at most the line of the call
it was in.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any, TextIO

from dbq.client import AnyQueue, LeaseLost, Queue, QueueUnavailable, connect


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["push", "pop", "repair"])
    p.add_argument("url")
    p.add_argument("queue")
    p.add_argument("schema")
    p.add_argument("log")
    p.add_argument("--prefix", default="m")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=["amo", "leased"], default="amo")
    p.add_argument("--stop", default="")
    p.add_argument("--visibility", type=float, default=30.0)
    p.add_argument("--ack-delay", type=float, default=0.0, help="seconds between a delivery and its ack")
    p.add_argument(
        "--idle-exits", type=int, default=5, help="empty polls after --stop appears before exiting"
    )
    p.add_argument("--tolerate-outages", action="store_true", help="log failed calls and go on")
    p.add_argument("--large", type=int, default=0, help="every fourth body pushed is this many bytes")
    p.add_argument(
        "--pipes-ending",
        type=float,
        default=0.0,
        help="pipes: tuning.ENDING_S (when repair finishes what a killed client left)",
    )
    p.add_argument(
        "--pipes-retake",
        type=float,
        default=0.0,
        help="pipes: tuning.RETAKE_AFTER_S (when a rollback or nack this client left half-done is retried)",
    )
    a = p.parse_args()
    from dbq.client.pipes import tuning

    tuning.ENDING_S = a.pipes_ending or tuning.ENDING_S
    tuning.RETAKE_AFTER_S = a.pipes_retake or tuning.RETAKE_AFTER_S
    q = connect(a.url, a.queue, schema=a.schema, pool_size=1, push_timeout=30, pop_timeout=0.05)
    # Line-buffered: each line reaches the kernel as it is written.
    with q, open(a.log, "a", buffering=1) as log:
        work(a, q, log)


def large_body(name: bytes, size: int) -> bytes:
    """A body of `size` bytes named `name`: the name, `|`, then filler derived from the name."""
    head = name + b"|"
    filler = (name + b".") * ((size - len(head)) // (len(name) + 1) + 1)
    return head + filler[: size - len(head)]


def body_of(name: str, n: int, large: int) -> bytes:
    return large_body(name.encode(), large) if large and n % 4 == 3 else name.encode()


def name_of(body: bytes) -> str:
    """The name a body carries (all of a small one); raises ValueError for a damaged large one."""
    name, bar, _ = body.partition(b"|")
    if bar and body != large_body(name, len(body)):
        raise ValueError(name.decode())
    return name.decode()


def names(messages: list[Any], log: TextIO) -> list[str]:
    """The names of delivered messages; a damaged body is logged as B."""
    out = []
    for m in messages:
        try:
            out.append(name_of(m.body))
        except ValueError as e:
            log.write(f"B {e}\n")
            out.append(str(e))
    return out


def work(a: argparse.Namespace, q: AnyQueue, log: TextIO) -> None:
    rng = random.Random(os.getpid())
    tolerated = (QueueUnavailable,) if a.tolerate_outages else ()

    def failed(kind: str, bodies: list[bytes]) -> None:
        log.write("".join(f"{kind} {name_of(b)}\n" for b in bodies))
        time.sleep(0.2)

    if a.role == "push":
        n = 0
        while n < a.count:
            k = min(rng.randint(1, a.batch), a.count - n)
            bodies = [body_of(f"{a.prefix}-{n + i}", n + i, a.large) for i in range(k)]
            n += k
            try:
                q.push(bodies[0]) if k == 1 else q.push_many(bodies)
            except tolerated:
                failed("F", bodies)
                continue
            log.write("".join(f"P {name_of(b)}\n" for b in bodies))
    elif a.role == "pop":
        idle = 0
        while idle < a.idle_exits:
            k = rng.randint(1, a.batch)
            try:
                if a.mode == "amo":
                    got = q.pop_many(k) if k > 1 else [m for m in [q.pop()] if m]
                else:
                    got = (
                        q.acquire_many(k, visibility=a.visibility)
                        if k > 1
                        else [m for m in [q.acquire(visibility=a.visibility)] if m]
                    )
            except tolerated:
                failed("E", [])
                continue
            if got:
                log.write("".join(f"G {name}\n" for name in names(got, log)))
            if a.mode == "leased" and got:
                time.sleep(a.ack_delay)
                if rng.random() < 0.02:
                    try:
                        got[0].nack()  # given back: delivered again, maybe to another consumer
                        log.write(f"N {name_of(got[0].body)}\n")
                    except tolerated:
                        failed("X", [got[0].body])
                    got = got[1:]
                lost: list[Any] = []  # not acknowledged
                refused: list[Any] = []  # of those, refused for a lost lease
                try:
                    q.ack_many(got)
                except LeaseLost as e:
                    lost = refused = e.messages
                except tolerated:
                    failed("X", [m.body for m in got])
                    lost = list(got)
                log.write("".join(f"A {name}\n" for name in names([m for m in got if m not in lost], log)))
                log.write("".join(f"L {name}\n" for name in names(refused, log)))
            stopping = bool(a.stop) and os.path.exists(a.stop)
            idle = idle + 1 if stopping and not got else 0
    else:
        while not (a.stop and os.path.exists(a.stop)):
            try:
                r = q.repair(orphan_grace=0.0) if isinstance(q, Queue) else q.repair()
            except tolerated:
                failed("E", [])
                continue
            log.write(f"R {r}\n")
            time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
