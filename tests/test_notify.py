"""Consumers woken by LISTEN/NOTIFY on a real PostgreSQL ring: pushes notify while a consumer
says it waits and not otherwise, a waiting consumer is woken by them, and one whose listening
connection died still gets every message (it polls once a second, and listens again)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue, connect
from dbq.client.notify import POLL_FIRST_S, WAIT_MARK_S, Notifications
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames

SCHEMA = f"notify_{secrets.token_hex(3)}"


@pytest.fixture
def ring(postgres) -> Iterator[tuple[Queue, str]]:
    name = f"q_{secrets.token_hex(4)}"
    backend = OdbcRing(from_url(postgres.url), RingTarget(QueueNames(SCHEMA, name), 256, 100))
    backend.apply()
    q = connect(postgres.url, name, schema=SCHEMA, smart_batching=False)
    assert isinstance(q, Queue)
    yield q, postgres.url
    q.close()
    backend.teardown()
    backend.close()


def counted(url: str, q: Queue) -> Notifications:
    """A listener of the queue's channel, to count what the pushes send."""
    listener = Notifications(from_url(url), q.names)
    listener.mark()
    return listener


def settle(listener: Notifications, expected: int) -> int:
    """The count once it reached `expected` (or after 2 s): notifications arrive after commit."""
    deadline = time.monotonic() + 2
    while listener.mark() < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # and nothing more comes
    return listener.mark()


def test_pushes_notify_only_while_a_consumer_says_it_waits(ring):
    q, url = ring
    listener = counted(url, q)
    try:
        with connect(url, q.names.queue, schema=SCHEMA, notify=False) as pusher:
            pusher.push(b"nobody waits")
            assert settle(listener, 0) == 0  # a busy queue pays nothing
            assert q.pop(timeout=0.2) is not None  # taken at once: no wait, nothing announced
            assert q.pop(timeout=0.3) is None  # this one waited, and said so
            pusher.push(b"a")
            pusher.push_many([b"b", b"c"])
            assert settle(listener, 2) == 2  # one per push while the wait mark holds
            time.sleep(WAIT_MARK_S + 0.2)  # it lapsed: the consumer stopped waiting
            pusher.push(b"d")
            assert settle(listener, 3) == 2
    finally:
        listener.close()


@pytest.mark.parametrize("smart", [False, True], ids=["alone", "smart-batched"])
def test_a_consumer_polls_first_and_says_it_waits_only_after(ring, smart):
    """An empty queue is polled for POLL_FIRST_S before a consumer says it waits, with smart
    batching as without: a busy consumer that finds the queue empty for a moment never makes
    pushes notify (NOTIFY serialises the commits that send it)."""
    q, url = ring
    listener = counted(url, q)
    try:
        with connect(url, q.names.queue, schema=SCHEMA, smart_batching=smart) as consumer, \
                connect(url, q.names.queue, schema=SCHEMA, notify=False) as pusher:  # fmt: skip
            assert POLL_FIRST_S > 0.05 and consumer.pop(timeout=0.05) is None
            pusher.push(b"nobody said it waits")
            assert settle(listener, 0) == 0
            assert consumer.pop(timeout=0) is not None
            assert consumer.pop(timeout=POLL_FIRST_S + 0.2) is None  # waited past it, and said so
            pusher.push(b"a consumer waits")
            assert settle(listener, 1) == 1
    finally:
        listener.close()


def test_a_waiting_consumer_is_woken_by_the_notification(ring):
    q, url = ring
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(q.pop(timeout=30)))
    waiting.start()
    time.sleep(0.5)  # the consumer waits on its channel (it listens from its first wait)
    assert q._notifications is not None and q._notifications.mark() == 0
    with connect(url, q.names.queue, schema=SCHEMA) as pusher:
        pusher.push(b"wake up")
    waiting.join(timeout=10)
    assert got and getattr(got[0], "body", None) == b"wake up"
    assert q._notifications.mark() == 1  # woken by it, not by the once-a-second poll alone


def test_a_consumer_whose_listening_connection_died_still_gets_every_message(ring, postgres):
    q, url = ring
    assert q.pop(timeout=0.5) is None  # it waited past its first 0.1 s of polling: listening now
    cur = postgres.connect().cursor()
    channel = q._notifications.channel if q._notifications else ""
    cur.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = ?", f'LISTEN "{channel}"'
    )
    assert cur.fetchall(), "the listening connection was not found"
    time.sleep(0.3)
    with connect(url, q.names.queue, schema=SCHEMA) as pusher:
        pusher.push_many([b"a", b"b"])
    started = time.monotonic()
    got = [q.pop(timeout=5), q.pop(timeout=5)]
    assert [getattr(m, "body", None) for m in got] == [b"a", b"b"]
    assert time.monotonic() - started < 5
    assert q.pop(timeout=0.5) is None  # and it listens again (it waits past its first 0.1 s of polling)
    assert q._notifications is not None and q._notifications._thread is not None
    assert q._notifications._thread.is_alive()
