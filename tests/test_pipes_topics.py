"""Topics on Cassandra (pipes): a publish evaluates each subscription's filter and writes a copy
into the pipe of every matching queue, all of a message's copies in one logged batch; counts what
it routed and could not route; follows its recorded rules, one set per message."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dbq.api.filters import Filter
from dbq.api.models import QueueSpec
from dbq.backends import open_backend
from dbq.backends.cassandra.topic import CassandraTopic
from dbq.client import PipesQueue, PipesTopic, connect, connect_topic
from dbq.connection import from_url
from dbq.contract.filters import matches
from dbq.contract.pipes import INLINE_BODY_BYTES
from dbq.contract.topics import Route, TopicCounts, TopicNames, TopicTarget
from dbq.errors import InvalidSpec, MessageTooLarge, TopicNotFound
from dbq.names import QueueNames
from tests.test_filters import FILTERS, HEADERS, SUBJECTS
from tests.test_pipes import stored_bodies
from tests.test_topics import (
    ROUTING_FILTERS,
    ROUTING_MESSAGES,
    assert_routed_by_one_rule_set,
    consume,
    flip_rules_while_publishing,
    flt,
    orders,
    publish_and_check_routing,
    run_threads,
)
from tests.topic_publisher import body_of, run_until_killed

KEYSPACE = f"dbq_ptopics_{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def cass_url(cassandra, stack) -> Iterator[str]:
    yield stack.cassandra.url()
    cassandra.execute(f'DROP KEYSPACE IF EXISTS "{KEYSPACE}"', timeout=120)


MakeQueue = Callable[..., PipesQueue]


class Topics:
    """Pipes queues and topics provisioned at `url`, and clients of them; closed afterwards."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.queues: list[PipesQueue] = []
        self.made: list[tuple[PipesTopic, CassandraTopic]] = []

    def queue(self, max_attempts: int = 0, **messages: Any) -> PipesQueue:
        name = f"q_{uuid.uuid4().hex[:8]}"
        raw: dict[str, Any] = {
            "backend": "cassandra", "design": "pipes",
            "connection": {"secretRef": {"name": "s"}, "schema": KEYSPACE}, "messages": messages,
        }  # fmt: skip
        if max_attempts:
            raw["deadLetter"] = {"maxAttempts": max_attempts}
        backend = open_backend(QueueSpec.model_validate(raw), name, from_url(self.url))
        backend.apply()
        backend.close()
        q = connect(self.url, name, schema=KEYSPACE, pop_timeout=0.2)
        assert isinstance(q, PipesQueue)
        self.queues.append(q)
        return q

    def make(
        self, routes: list[Route], unrouted: PipesQueue | None = None
    ) -> tuple[PipesTopic, CassandraTopic]:
        names = TopicNames(KEYSPACE, f"t_{uuid.uuid4().hex[:8]}")
        backend = CassandraTopic(
            from_url(self.url), TopicTarget(names, tuple(routes), unrouted.names if unrouted else None)
        )
        backend.apply()
        topic = connect_topic(
            self.url, names.topic, schema=KEYSPACE, rules_refresh=0
        )  # the rules at each publish
        assert isinstance(topic, PipesTopic)
        self.made.append((topic, backend))
        return topic, backend

    def close(self) -> None:
        for topic, backend in self.made:
            topic.close()
            backend.teardown()
            backend.close()
        for q in self.queues:
            q.close()


@pytest.fixture
def topics(cass_url) -> Iterator[Topics]:
    made = Topics(cass_url)
    yield made
    made.close()


def route(name: str, q: PipesQueue, f: Filter) -> Route:
    return Route(name, q.names, f, label=name.replace("_", "-"))


def drain(q: PipesQueue) -> list[Any]:
    got = []
    # A pipe at a time: wait for the next one's lease. On a loaded machine a pipe stayed out of
    # reach past a 0.3 s wait in CI, so the last, empty, take waits 2 s.
    while batch := q.pop_many(100, timeout=2):
        got += batch
    return got


def counted(backend: CassandraTopic, published: int) -> TopicCounts:
    """The topic's counts once its counters show `published` messages (a publisher adds to them
    every second and when it closes, without waiting)."""
    deadline = time.monotonic() + 10
    while True:
        counts = backend.counts()
        assert counts is not None
        if counts.published >= published or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def test_each_message_reaches_the_queues_whose_filters_match_it_and_is_counted(topics):
    queues = {name: topics.queue() for name in ("eu", "big", "sub", "")}
    routes = [route(n, queues[n], f) for n, f in ROUTING_FILTERS.items()]
    topic, backend = topics.make(routes, unrouted=queues[""])
    expected = publish_and_check_routing(topic, queues, drain)
    topic.close()  # a publisher writes its counts every second, and when it closes
    counts = counted(backend, len(ROUTING_MESSAGES))
    assert (counts.published, counts.unrouted, counts.rules_version) == (
        len(ROUTING_MESSAGES),
        len(expected[""]),
        1,
    )
    assert counts.routed == {n: len(expected[n]) for n in ROUTING_FILTERS}
    assert counts.dropped == dict.fromkeys(ROUTING_FILTERS, 0)


def test_publish_many_routes_each_message_as_publish_does(topics):
    eu, big = topics.queue(), topics.queue()
    filters = {"eu": flt({"key": "region", "eq": "eu"}), "big": flt({"key": "amount", "gte": 100})}
    topic, backend = topics.make([route("eu", eu, filters["eu"]), route("big", big, filters["big"])])
    headers = [{"region": "eu", "amount": 100}, None, {"amount": 5}, {"region": "eu"}, {"amount": 1e3}]
    subjects = ["a", None, "b", None, "c"]
    bodies = [f"m{i}".encode() for i in range(len(headers))]
    routed = topic.publish_many(bodies, headers=headers, subjects=subjects)
    for h, s, r in zip(headers, subjects, routed, strict=True):
        assert set(r) == {n for n, f in filters.items() if matches(f, s, h)}
    for name, q in (("eu", eu), ("big", big)):
        got = drain(q)
        assert [m.body for m in got] == [b for b, r in zip(bodies, routed, strict=True) if name in r]
        assert [m.id for m in got] == [r[name] for r in routed if name in r]
    assert topic.publish_many([]) == []
    topic.close()
    assert counted(backend, 5).unrouted == sum(1 for r in routed if not r) == 2
    with pytest.raises(ValueError, match="subjects has 1 values for 2 messages"):
        topic.publish_many([b"x", b"y"], subjects=["one"])


def test_large_bodies_and_many_copies_round_trip_byte_for_byte(topics):
    queues = [topics.queue(maxBytes=2 << 20) for _ in range(8)]
    topic, _ = topics.make([route(f"s{i}", q, flt()) for i, q in enumerate(queues)])
    rng = random.Random(5)
    # In the rows; past a row (each copy in its queue's content); small, but too many copies for
    # one batch in rows (so in content too); 1 MiB; and a batch of them all.
    sizes = [300, INLINE_BODY_BYTES + 1, 8 << 10, 1 << 20]
    bodies = [rng.randbytes(n) for n in sizes]
    for body in bodies:
        assert len(topic.publish(body)) == 8
    assert len(topic.publish_many(bodies)) == 4
    for q in queues:
        assert [m.body for m in drain(q)] == bodies + bodies


def test_a_message_too_large_or_with_headers_too_large_for_one_queue_is_refused_with_nothing_written(topics):
    roomy, tight = topics.queue(), topics.queue(maxBytes=1000, headerBytes=64)
    topic, _ = topics.make([route("roomy", roomy, flt()), route("tight", tight, flt())])
    with pytest.raises(MessageTooLarge, match=r"larger than spec\.messages\.maxBytes"):
        topic.publish(b"x" * 1001)
    with pytest.raises(ValueError, match="subscription tight, queue q_"):
        topic.publish(b"ok", headers={"note": "y" * 100})
    assert topic.publish(b"fits").keys() == {"roomy", "tight"}
    assert [m.body for m in drain(roomy)] == [b"fits"] == [m.body for m in drain(tight)]


def test_concurrent_publishes_share_batches_and_each_caller_gets_its_own_answer(topics):
    a, b = topics.queue(), topics.queue()
    topic, _ = topics.make([route("a", a, flt()), route("b", b, flt({"key": "even", "is": True}))])
    answers: dict[bytes, dict[str, uuid.UUID]] = {}

    def publisher(who: int) -> None:
        for i in range(40):
            body = f"{who}-{i}".encode()
            answers[body] = topic.publish(body, headers={"even": i % 2 == 0})

    threads = [threading.Thread(target=publisher, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 320
    got_a, got_b = {m.id: m.body for m in drain(a)}, {m.id: m.body for m in drain(b)}
    assert {answers[body]["a"]: body for body in answers} == got_a
    assert {answers[body]["b"]: body for body in answers if "b" in answers[body]} == got_b
    assert len(got_b) == 160


def test_subscriptions_changed_while_publishers_run_route_each_message_by_one_set_of_rules(topics):
    qa, qb = topics.queue(), topics.queue()
    everything, nothing = flt(), flt({"key": "absent", "exists": True})
    rules = [
        (route("a", qa, everything), route("b", qb, nothing)),
        (route("a", qa, nothing), route("b", qb, everything)),
    ]
    topic, backend = topics.make(list(rules[0]))
    routed = flip_rules_while_publishing(topic, backend, rules, changes=10, pause=0.1)
    assert len(routed) > 50
    assert_routed_by_one_rule_set(routed, drain(qa), drain(qb))


def test_rules_are_recorded_once_per_change_a_bad_queue_is_refused_and_teardown_removes_the_topic(
    topics, cass_url
):
    q, rest = topics.queue(), topics.queue()
    topic, backend = topics.make([route("only", q, flt({"key": "n", "gt": 1.5}))], unrouted=rest)
    assert backend.apply() == 1  # nothing changed: the same version
    backend.target = TopicTarget(topic.names, (route("only", q, flt({"key": "n", "gt": 2})),), rest.names)
    assert backend.apply() == 2
    assert topic.publish(b"x", headers={"n": 2}).keys() == {""}  # 2 > 1.5, but not > 2: unrouted
    assert topic.publish(b"y", headers={"n": 3}).keys() == {"only"}
    assert [m.body for m in drain(rest)] == [b"x"] and [m.body for m in drain(q)] == [b"y"]
    ghost = Route("ghost", QueueNames(KEYSPACE, "no_such_queue"), flt())
    backend.target = TopicTarget(topic.names, (ghost,))
    with pytest.raises(InvalidSpec, match=rf"queue {KEYSPACE}.no_such_queue is not a pipes queue"):
        backend.apply()
    backend.teardown()
    assert backend.counts() is None
    with pytest.raises(TopicNotFound, match=f"topic {topic.names.topic} is not made in keyspace {KEYSPACE}"):
        topic.publish(b"z")
    with pytest.raises(TopicNotFound):
        connect_topic(cass_url, topic.names.topic, schema=KEYSPACE)


def test_a_publisher_routes_by_the_rules_it_read_for_rules_refresh_seconds(topics, cass_url):
    qa, qb = topics.queue(), topics.queue()
    topic, backend = topics.make([route("a", qa, flt())])
    caching = connect_topic(cass_url, topic.names.topic, schema=KEYSPACE, rules_refresh=0.5)
    try:
        assert caching.publish(b"1").keys() == {"a"}
        backend.target = TopicTarget(topic.names, (route("b", qb, flt()),))
        assert backend.apply() == 2
        assert topic.publish(b"2").keys() == {"b"}  # rules_refresh=0: the rules in force
        assert caching.publish(b"3").keys() == {"a"}  # read less than 0.5 s ago
        time.sleep(0.6)
        assert caching.publish(b"4").keys() == {"b"}
    finally:
        caching.close()
    assert [m.body for m in drain(qa)] == [b"1", b"3"] and [m.body for m in drain(qb)] == [b"2", b"4"]


@pytest.mark.parametrize("mode", ["pop", "acquire"])
def test_conservation_per_subscription_with_four_publishers_and_four_consumers_each(topics, cass_url, mode):
    """For every subscription: delivered + dead-lettered + depth = the published messages its
    filter matches, none twice; unrouted = the messages no filter matched."""
    rules = {"eu": flt({"key": "region", "eq": "eu"}), "big": flt({"key": "amount", "gte": 500}),
             "orders": flt(subject=[{"prefix": "order."}])}  # fmt: skip
    queues = {name: topics.queue(max_attempts=2) for name in rules}
    rest = topics.queue()
    topic, backend = topics.make([route(n, queues[n], f) for n, f in rules.items()], unrouted=rest)
    per_publisher = 150
    messages = orders(per_publisher)
    answers: dict[bytes, set[str]] = {}
    published = threading.Event()

    def publisher(p: int) -> None:
        own = connect_topic(cass_url, topic.names.topic, schema=KEYSPACE)
        try:
            for i in range(per_publisher):
                body = f"{p}-{i}".encode()
                headers, subject = messages[body]
                answers[body] = set(own.publish(body, headers=headers, subject=subject))
        finally:
            own.close()

    delivered: dict[str, list[bytes]] = {name: [] for name in [*rules, ""]}

    def consumer(name: str, q: PipesQueue) -> None:
        consume(q, name, mode, delivered[name], published)

    errors = run_threads(publisher, consumer, [*queues.items(), ("", rest)], published.set)
    assert errors == [] and len(answers) == len(messages)
    dead_letters = 0
    for name, f in rules.items():
        q = queues[name]
        matched = {b for b, (h, s) in messages.items() if matches(f, s, h)}
        assert matched == {b for b in matched if name in answers[b]}
        dead = {d.body for d in q.dead_letters(limit=10_000)}
        got = delivered[name]
        assert len(got) == len(set(got)), f"{name}: a message delivered twice"
        assert not set(got) & dead
        assert set(got) | dead == matched and q.stats().depth == 0, name
        assert len(got) + len(dead) == len(matched), name
        assert mode == "acquire" or not dead, name
        dead_letters += len(dead)
    assert (mode == "acquire") == (dead_letters > 0)
    unmatched = {b for b, (h, s) in messages.items() if not any(matches(f, s, h) for f in rules.values())}
    assert set(delivered[""]) == unmatched and len(delivered[""]) == len(unmatched)
    counts = counted(backend, len(messages))
    assert counts.published == len(messages) and counts.unrouted == len(unmatched)
    assert counts.routed == {n: sum(1 for b in messages if n in answers[b]) for n in rules}


@pytest.mark.parametrize("large", [0, 65536])
def test_publishers_killed_mid_publish_leave_each_message_in_every_matching_queue_or_in_none(
    topics, cass_url, tmp_path, large
):
    """With large bodies too (every fourth of 64 KiB, stored in each queue's content table before
    the batch): what a killed publisher stored for a batch it never sent is removed by repair."""
    ending = 2.0  # the publishers' ENDING_S: repair removes their orphaned chunks this long after
    queues = [topics.queue() for _ in range(3)]
    first = flt({"key": "n", "lt": 50})  # a partial match as well
    topic, _ = topics.make([route(f"s{i}", q, flt() if i < 2 else first) for i, q in enumerate(queues)])
    logs, rng = [], random.Random(7)
    for run in range(8):
        log = tmp_path / f"publisher-{run}.log"
        logs.append(log)
        options = ["--prefix", f"r{run}", "--batch", str(1 + run % 2 * 7), "--large", str(large),
                   "--pipes-ending", str(ending)]  # fmt: skip
        run_until_killed((cass_url, KEYSPACE, topic.names.topic), log, options, rng, most_s=1.5)
    logged = [line.split(" ", 1)[1] for log in logs if log.exists() for line in log.read_text().splitlines()]
    assert len(logged) > (20 if large else 50)
    time.sleep(ending + 1.0)  # past the marks of chunks stored for batches never written
    for q in queues:
        q.repair()
    got = [[m.body for m in drain(q)] for q in queues]
    names = [[b.split(b"|")[0].decode() for b in bodies] for bodies in got]
    for bodies, named in zip(got, names, strict=True):
        assert len(named) == len(set(named))  # none twice
        assert all(b == body_of(n, large) for b, n in zip(bodies, named, strict=True))  # none damaged
    assert set(names[0]) == set(names[1])  # both take every message: all or none of each
    assert set(logged) <= set(names[0])  # every publish that returned is there
    assert set(names[2]) == {b for b in names[0] if int(b.rsplit("-", 1)[1]) < 50}
    assert not large or any(int(n.rsplit("-", 1)[1]) % 4 == 0 for n in names[0])
    for q in queues:
        assert q.repair() is not None and stored_bodies(q) == 0  # no chunk left behind


@pytest.fixture(scope="module")
def routed_by_random_rules(cass_url) -> Iterator[tuple[PipesTopic, CassandraTopic, list[PipesQueue]]]:
    made = Topics(cass_url)
    queues = [made.queue() for _ in range(3)]
    topic, backend = made.make([route(f"s{i}", q, flt()) for i, q in enumerate(queues)])
    yield topic, backend, queues
    made.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filters=st.lists(FILTERS, min_size=3, max_size=3), headers=HEADERS, subject=SUBJECTS)
def test_the_pipes_path_routes_as_the_oracle_says_on_random_filters_and_headers(
    routed_by_random_rules, filters, headers, subject
):
    """What the publisher evaluates is the headers as stored and read back (JSON), and the subject
    it carries: the answer must be the oracle's on the caller's own values."""
    topic, backend, queues = routed_by_random_rules
    backend.target = TopicTarget(
        topic.names, tuple(route(f"s{i}", q, f) for i, (q, f) in enumerate(zip(queues, filters, strict=True)))
    )
    backend.apply()
    try:
        routed = topic.publish(b"m", headers=headers, subject=subject)
    except ValueError:  # a subject or header the client refuses (empty, control characters)
        assume(False)
    assert set(routed) == {f"s{i}" for i, f in enumerate(filters) if matches(f, subject, headers)}
