"""A pipes queue with replication factor 3 on the three-node cluster (127.0.0.2-4), reads and
writes at QUORUM: 20,000 messages move while one node is killed with SIGKILL and later
restarted. Nothing is lost, nothing is invented, and every message delivered twice in leased
mode has a reason the contract allows: it was nacked, its lease was lost, or its ack failed
while the node went down."""

from __future__ import annotations

import os
import secrets
import signal
import time

import pytest

from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.client import PipesQueue, connect
from dbq.connection import from_url
from tests.workers import finish, read_logs, start

# Alone, after the others: three JVMs and a node's restart beside a Spark job on two cores took
# longer than a node's start-up may take.
pytestmark = pytest.mark.serial

MESSAGES = 20_000
VISIBILITY = "10"


def test_pipes_at_quorum_keep_every_message_while_a_node_is_killed(cassandra3, tmp_path):
    url = cassandra3.url("consistency=QUORUM")
    keyspace, name = f"rf3_{secrets.token_hex(3)}", f"q_{secrets.token_hex(3)}"
    spec = QueueSpec.model_validate(
        {"backend": "cassandra", "design": "pipes", "connection": {"secretRef": {"name": "s"}, "schema": keyspace},
         "pipes": {"maxPushesPerPipe": 500, "replication": {"factor": 3}}}
    )  # fmt: skip
    backend = open_backend(spec, name, from_url(url))
    backend.apply()
    backend.close()
    q = connect(url, name, schema=keyspace)
    assert isinstance(q, PipesQueue)
    stop = tmp_path / "stop"
    logs = [tmp_path / f"w{i}.log" for i in range(5)]
    tolerate = "--tolerate-outages"
    pushers = [
        start(
            "push",
            q,
            url,
            logs[i],
            "--prefix",
            f"p{i}",
            "--count",
            str(MESSAGES // 2),
            "--batch",
            "20",
            tolerate,
        )
        for i in range(2)
    ]
    poppers = [
        start("pop", q, url, logs[2 + i], "--mode", "leased", "--batch", "20", "--stop", str(stop),
              "--visibility", VISIBILITY, tolerate)
        for i in range(2)
    ]  # fmt: skip
    repairer = start("repair", q, url, logs[4], "--stop", str(stop), tolerate)
    victim = cassandra3.nodes[2]
    try:
        time.sleep(8)
        pid = victim.proc.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # a node this test session started
        killed = time.monotonic()
        time.sleep(15)
        victim.start()
        restarted = time.monotonic()
        finish(pushers, timeout=900)
        stop.touch()
        finish([*poppers, repairer], timeout=900)
        done = time.monotonic()
        # Leases held when the poppers stopped expire, and repair puts them back for the drain;
        # a few passes, since a repair skips a pipe whose lease is still held.
        drain = tmp_path / "drain.log"
        passes = []
        with drain.open("w") as out:
            for _ in range(4):
                time.sleep(float(VISIBILITY) + 2.5)
                rolled = q.repair().rolled_back
                drained = 0
                while got := q.acquire_many(200, timeout=1):
                    out.write("".join(f"G {m.body.decode()}\n" for m in got))
                    q.ack_many(got)
                    out.write("".join(f"A {m.body.decode()}\n" for m in got))
                    drained += len(got)
                passes.append((rolled, drained))
                s = q.stats()
                if (s.depth, s.in_flight) == (0, 0):
                    break
        print(f"drain passes (rolled back, drained): {passes}; stats at the end: {s}")
        seen = read_logs([*logs, drain])
        pushed, failed = set(seen["P"]), set(seen["F"])
        delivered = set(seen["G"])
        twice = {body for body, n in seen["G"].items() if n > 1}
        explained = set(seen["N"]) | set(seen["L"]) | set(seen["X"])
        print(
            f"rf3 QUORUM, node killed for {restarted - killed:.0f}s: {len(pushed)} pushes acknowledged,"
            f" {len(failed)} failed (stored or not), {sum(seen['G'].values())} deliveries of {len(delivered)}"
            f" messages, {len(twice)} delivered more than once (nacked {len(seen['N'])}, lease lost"
            f" {len(seen['L'])}, ack failed {len(seen['X'])}), {sum(seen['A'].values())} acks;"
            f" workload took {done - killed + 8:.0f}s"
        )
        assert len(pushed) + len(failed) == MESSAGES
        assert pushed <= delivered, f"lost: {sorted(pushed - delivered)[:10]}"
        assert delivered <= pushed | failed, "a message nobody pushed"
        assert twice <= explained, f"delivered twice without a reason: {sorted(twice - explained)[:10]}"
        assert max(seen["A"].values()) == 1, "a message was acknowledged twice"
        # Nothing is left to deliver (the passes above drained nothing more) and nothing leased.
        # stats() may still count a phantom message or a few: a take that timed out while the
        # node died and was applied later leaves its pipe's counters off by that batch (a known
        # limitation of the pipes' counters, docs/dba/cassandra.md, "Consistency").
        assert s.in_flight == 0 and passes[-1][1] == 0
    finally:
        for p in [*pushers, *poppers, repairer]:
            if p.poll() is None:
                p.kill()
        if not victim.ready():
            victim.start()
        q.close()
        backend = open_backend(spec, name, from_url(url))
        backend.teardown()  # its keyspace too: a restarted node opens every table left behind
        backend.close()
