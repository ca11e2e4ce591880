"""What routing at publish time costs on the local PostgreSQL (or, with --backend cassandra, the
local Cassandra): a topic with 1 to 64 subscriptions, each its own ring (pipes) queue, 4 publishers (one process each, single publishes of
300 B with one header; with --threads T, T threads each, whose single publishes the client
batches as it does pushes: smart batching), in two shapes:

- broadcast: every subscription matches every message (a copy in every queue);
- partitioned: subscription i takes header `p` = i, and each message carries one p (1 of N).

Beside them, in the same run: a plain push (4 pushers into one queue, the same client), and what
a team would write by hand without topics: on PostgreSQL one transaction from the client that
pushes into each matching queue (BEGIN, one push routine call per match, COMMIT; psycopg); on
Cassandra one push per matching queue with the queue's client, one after the other (no batch
spans queues). Publishes/s count messages, deliveries/s their copies.

    ~/.cache/dbq/venv/bin/python -m bench.fanout
    ~/.cache/dbq/venv/bin/python -m bench.fanout --seconds 10 --rounds 5 --subscriptions 1,8,64
    ~/.cache/dbq/venv/bin/python -m bench.fanout --threads 4
    ~/.cache/dbq/venv/bin/python -m bench.fanout --backend cassandra --subscriptions 1,2,4,8,16

Writes nothing but its report (tee it to bench/results/fanout.txt).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.ring_vs_skiplocked import DB, SCHEMA, admin, bench_database, sampled

# The schema (keyspace) of the queues: a Cassandra run takes a keyspace of its own, named in the
# environment its worker processes inherit (Cassandra may keep statements prepared on a dropped
# keyspace's tables: one made again under the same name would meet them).
SCHEMA_VARIABLE = "DBQ_BENCH_SCHEMA"

# Slots per queue: a 5 s run stays below them. The first queues take the plain pushes and the
# broadcasts to few subscriptions, the fastest; the others at most a publish rate of a topic of 8.
RING_SIZE, BUSY_RING_SIZE, BUSY_QUEUES = 32768, 131072, 8
QUEUES = 64
BODY = 300
PUBLISHERS = 4


def schema() -> str:
    return os.environ.get(SCHEMA_VARIABLE, SCHEMA)


def queue_name(i: int) -> str:
    return f"fan{i}"


def filters(shape: str, n: int) -> list[dict[str, Any]]:
    if shape == "broadcast":
        return [{} for _ in range(n)]
    return [{"headers": [{"key": "p", "eq": i}]} for i in range(n)]


# --- workers, one process each (spawned): `threads` threads add to `counter` until `stop` ---------
def in_threads(threads: int, once: Callable[[], bool], counter: Any, stop: Any) -> None:
    """Call `once` in `threads` threads until `stop`, counting the calls that did their work (a
    publish or push refused by a full queue did not)."""
    lock = threading.Lock()

    def loop() -> None:
        while not stop.is_set():
            if once():
                with lock:
                    counter.value += 1

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def publish_worker(url: str, topic: str, shape: str, n: int, threads: int, counter: Any, stop: Any) -> None:
    from dbq.client import QueueFull, connect_topic

    t = connect_topic(url, topic, schema=schema(), pool_size=threads)
    body = os.urandom(BODY)

    def once() -> bool:
        try:
            t.publish(body, headers={"p": random.randrange(n) if shape == "partitioned" else 0})
        except QueueFull:
            return False
        return True

    in_threads(threads, once, counter, stop)


def by_hand_worker(url: str, shape: str, n: int, threads: int, counter: Any, stop: Any) -> None:
    """One transaction per message, one push call per matching queue (a connection per thread);
    on Cassandra, one push per matching queue."""
    if url.startswith("cassandra"):
        pipes_by_hand(url, shape, n, threads, counter, stop)
        return
    import psycopg

    local = threading.local()
    body = os.urandom(BODY)

    def once() -> bool:
        if not hasattr(local, "conn"):
            local.conn = psycopg.connect(url, autocommit=True)
        p = random.randrange(n) if shape == "partitioned" else 0
        headers = f'{{"p":{p}}}'
        targets = [p] if shape == "partitioned" else range(n)
        with local.conn.transaction():
            for i in targets:
                local.conn.execute(f'SELECT "{schema()}"."{queue_name(i)}_push"(%s, 0, %s)', (body, headers))
        return True

    in_threads(threads, once, counter, stop)


def pipes_by_hand(url: str, shape: str, n: int, threads: int, counter: Any, stop: Any) -> None:
    from dbq.client import connect

    queues = [connect(url, queue_name(i), schema=schema(), smart_batching=threads > 1) for i in range(n)]
    body = os.urandom(BODY)

    def once() -> bool:
        p = random.randrange(n) if shape == "partitioned" else 0
        for i in [p] if shape == "partitioned" else range(n):
            queues[i].push(body, headers={"p": p})
        return True

    in_threads(threads, once, counter, stop)


def push_worker(url: str, threads: int, counter: Any, stop: Any) -> None:
    """Pushes with the same client settings a topic's publishes get: smart batching with threads."""
    from dbq.client import QueueFull, connect

    q = connect(
        url, queue_name(0), schema=schema(), smart_batching=threads > 1, push_timeout=0, pool_size=threads
    )
    body = os.urandom(BODY)

    def once() -> bool:
        try:
            q.push(body, headers={"p": 0})
        except QueueFull:
            return False
        return True

    in_threads(threads, once, counter, stop)


# --- the run ----------------------------------------------------------------------------------------
def provision(url: str, queues: int) -> None:
    from dbq.backends.odbc_ring import OdbcRing
    from dbq.connection import from_url
    from dbq.contract.ring import RingTarget
    from dbq.names import QueueNames

    settings = from_url(url)
    if settings.backend == "cassandra":
        provision_pipes(url, queues)
        return
    for i in range(queues):
        size = BUSY_RING_SIZE if i < BUSY_QUEUES else RING_SIZE
        backend = OdbcRing(settings, RingTarget(QueueNames(schema(), queue_name(i)), size, 300))
        backend.apply()
        backend.close()


def provision_pipes(url: str, queues: int) -> None:
    from dbq.api.models import QueueSpec
    from dbq.backends import open_backend
    from dbq.connection import from_url

    spec = QueueSpec.model_validate(
        {
            "backend": "cassandra",
            "design": "pipes",
            "connection": {"secretRef": {"name": "x"}, "schema": schema()},
        }
    )
    for i in range(queues):
        backend = open_backend(spec, queue_name(i), from_url(url))
        backend.apply()
        backend.close()


def make_topic(url: str, shape: str, n: int) -> Any:
    from dbq.api.filters import Filter
    from dbq.connection import from_url
    from dbq.contract.topics import Route, TopicNames, TopicTarget
    from dbq.controller.topics import topic_backend
    from dbq.names import QueueNames

    routes = tuple(
        Route(f"s{i}", QueueNames(schema(), queue_name(i)), Filter.model_validate(f))
        for i, f in enumerate(filters(shape, n))
    )
    backend = topic_backend(from_url(url), TopicTarget(TopicNames(schema(), f"{shape}_{n}"), routes))
    backend.apply()
    return backend


def drain(url: str, n: int) -> None:
    """Empty the first n queues, so that rings never fill (pipes have no bound: left as they are)."""
    from dbq.client import connect

    if url.startswith("cassandra"):
        return
    for i in range(n):
        with connect(url, queue_name(i), schema=schema(), smart_batching=False) as q:
            while q.pop_many(5000, timeout=0):
                pass


def cassandra_url() -> str:
    from dbq.devstack import Stack

    cassandra = Stack().component("cassandra")
    if not cassandra.ready():
        cassandra.start()
    os.environ[SCHEMA_VARIABLE] = f"bench_{os.urandom(4).hex()}"
    return Stack().cassandra.url()


def drop_keyspace(url: str) -> None:
    from dbq.connection import from_url
    from dbq.connection.cassandra import SCHEMA_CHANGE_TIMEOUT_S, open_session

    cluster, session = open_session(from_url(url))
    session.execute(f'DROP KEYSPACE IF EXISTS "{schema()}"', timeout=SCHEMA_CHANGE_TIMEOUT_S)
    cluster.shutdown()


def rate(target: Any, args: tuple[Any, ...], seconds: float) -> float:
    return statistics.fmean(sampled(target, [args] * PUBLISHERS, seconds))


Medians = dict[tuple[str, int, str], float]  # (shape, subscriptions, publish | by hand) -> per second


def take_turns(
    url: str,
    counts: list[int],
    rounds: int,
    plain: Callable[[], float],
    published: Callable[[str, str, int], float],
    by_hand: Callable[[str, int], float],
) -> Medians:
    """`rounds` rounds, each: the plain push, then for each shape and subscription count a topic
    made, its publishes (`published(topic, shape, n)`) and the hand-written transactions
    measured, and the topic dropped. The medians, the plain push's under ("push", 1, "plain")."""
    runs: dict[tuple[str, int, str], list[float]] = {}
    for round_ in range(1, rounds + 1):
        runs.setdefault(("push", 1, "plain"), []).append(plain())
        drain(url, 1)
        print(f"#{round_} plain push: {runs['push', 1, 'plain'][-1]:,.0f} /s", flush=True)
        for shape in ("broadcast", "partitioned"):
            for n in counts:
                topic = make_topic(url, shape, n)
                publishes = published(topic.target.names.topic, shape, n)
                drain(url, n)
                hand = by_hand(shape, n)
                drain(url, n)
                topic.teardown()
                topic.close()
                runs.setdefault((shape, n, "publish"), []).append(publishes)
                runs.setdefault((shape, n, "by hand"), []).append(hand)
                print(f"#{round_} {shape:12} {n:3} subscriptions: publish {publishes:9,.0f} /s"
                      f"  by hand {hand:9,.0f} /s", flush=True)  # fmt: skip
    return {key: statistics.median(values) for key, values in runs.items()}


def print_table(median: Medians, counts: list[int], heading: str) -> None:
    """The medians of `take_turns`, copies counted, against the hand-written transactions and the
    plain push."""
    plain = median["push", 1, "plain"]
    print(f"\n{heading}; plain push {plain:,.0f} /s")
    print(f"{'shape':>12}{'subs':>6}{'publish/s':>11}{'deliveries/s':>14}{'by hand/s':>11}"
          f"{'deliveries':>12}{'x hand':>8}{'x push':>8}{'deliv. x push':>15}")  # fmt: skip
    for shape in ("broadcast", "partitioned"):
        for n in counts:
            copies = n if shape == "broadcast" else 1
            published, by_hand = median[shape, n, "publish"], median[shape, n, "by hand"]
            print(f"{shape:>12}{n:6}{published:11,.0f}{published * copies:14,.0f}{by_hand:11,.0f}"
                  f"{by_hand * copies:12,.0f}{published / by_hand:8.2f}{published / plain:8.2f}"
                  f"{published * copies / plain:15.2f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of each run")
    p.add_argument("--backend", choices=["postgres", "cassandra"], default="postgres")
    p.add_argument("--subscriptions", default="1,2,4,8,16,32,64", help="subscription counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, taking turns")
    p.add_argument("--threads", type=int, default=1, help="threads of each publisher process")
    a = p.parse_args()
    counts = [int(c) for c in a.subscriptions.split(",")]
    pg, url, _odbc = bench_database()
    queues = QUEUES
    if a.backend == "cassandra":  # each pipes queue is 11 tables: only as many as the largest topic
        url, queues = cassandra_url(), max(counts)
    started = time.monotonic()
    provision(url, queues)
    kind = (
        "pipes queues" if a.backend == "cassandra"
        else f"ring queues ({BUSY_QUEUES} of {BUSY_RING_SIZE} slots, the others {RING_SIZE})"
    )  # fmt: skip
    print(f"{queues} {kind} provisioned in {time.monotonic() - started:.0f} s", flush=True)
    median = take_turns(
        url,
        counts,
        a.rounds,
        lambda: rate(push_worker, (url, a.threads), a.seconds),
        lambda topic, shape, n: rate(publish_worker, (url, topic, shape, n, a.threads), a.seconds),
        lambda shape, n: rate(by_hand_worker, (url, shape, n, a.threads), a.seconds),
    )
    admin(pg.odbc()).execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    if a.backend == "cassandra":
        drop_keyspace(url)
    print_table(
        median,
        counts,
        f"{a.backend}: {PUBLISHERS} publishers of {a.threads} thread(s), single publishes of {BODY} B,"
        f" {a.seconds:g} s each",
    )


if __name__ == "__main__":
    main()
