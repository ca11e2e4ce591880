"""Topics on PostgreSQL: a publish puts a copy in the queue of every subscription whose filter
matches, in one transaction (all or none when a Reject queue is full), counts what it routed,
dropped and could not route, and follows a change of subscriptions made while publishers run
without mixing old and new rules in one message."""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dbq.api.filters import Filter
from dbq.backends.odbc_topic import OdbcTopic
from dbq.client import QueueFull
from dbq.client.ring import Queue
from dbq.client.topic import Topic
from dbq.connection import from_url
from dbq.contract.filters import matches
from dbq.contract.topics import Route, TopicNames, TopicTarget
from dbq.errors import InvalidSpec
from dbq.names import QueueNames
from tests.test_ring_client import SCHEMA, queues
from tests.topic_publisher import run_until_killed


def flt(*headers: dict[str, Any], subject: list[dict[str, Any]] | None = None) -> Filter:
    return Filter.model_validate({"headers": list(headers), "subject": subject or []})


class Topics:
    """Topics provisioned at `url` and clients of them; dropped afterwards."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[tuple[Topic, OdbcTopic]] = []

    def make(self, routes: list[Route], unrouted: Queue | None = None) -> tuple[Topic, OdbcTopic]:
        names = TopicNames(SCHEMA, f"t_{secrets.token_hex(4)}")
        target = TopicTarget(names, tuple(routes), unrouted.names if unrouted else None)
        backend = OdbcTopic(from_url(self.url), target)
        backend.apply()
        topic = Topic(from_url(self.url), names)
        self.made.append((topic, backend))
        return topic, backend

    def close(self) -> None:
        for topic, backend in self.made:
            topic.close()
            backend.teardown()
            backend.close()


@pytest.fixture
def topics(postgres) -> Iterator[tuple[Topics, Any]]:
    with queues(postgres.url) as make_queue:
        made = Topics(postgres.url)
        yield made, make_queue
        made.close()


def route(name: str, q: Queue, f: Filter, on_full: str = "Reject") -> Route:
    return Route(name, q.names, f, on_full)


def drain(q: Queue) -> list[Any]:
    got = []
    while batch := q.pop_many(100, timeout=0):
        got += batch
    return got


def sql(q: Queue, statement: str) -> Any:
    with q._cursor() as cur:
        return cur.execute(statement).fetchval()


# The routing test of every backend: three subscriptions (and the unrouted queue) and messages
# that match none, one or several of them.
ROUTING_FILTERS = {
    "eu": flt({"key": "region", "in": ["eu", "uk"]}),
    "big": flt({"key": "amount", "gte": 100}),
    "sub": flt(subject=[{"prefix": "orders.eu."}]),
}
ROUTING_MESSAGES: list[tuple[dict[str, Any], str | None]] = [
    ({"region": "eu", "amount": 250}, "orders.eu.de"),
    ({"region": "us", "amount": 99.5}, "orders.us"),
    ({"region": "uk"}, None),
    ({"amount": "100"}, "orders.eu."),  # a string is not a number
    ({}, None),
    ({"region": "EU", "amount": 100}, "orders.eu.fr"),
    ({"it's": "'; DROP TABLE x; --", "n": 2**62}, None),
]


def publish_and_check_routing(topic: Any, queues: dict[str, Any], drain: Any) -> dict[str, list[bytes]]:
    """Publish ROUTING_MESSAGES through `topic`, whose subscriptions are ROUTING_FILTERS into
    `queues` (by name; '' the unrouted queue): each must reach exactly the queues whose filters
    match it, under the id its publish answered, with its headers and subject. The bodies each
    queue got, by name."""
    expected: dict[str, list[bytes]] = {name: [] for name in queues}
    ids: dict[str, list[Any]] = {name: [] for name in queues}
    for i, (headers, subject) in enumerate(ROUTING_MESSAGES):
        body = f"m{i}".encode()
        routed = topic.publish(body, headers=headers, subject=subject)
        wanted = {n for n, f in ROUTING_FILTERS.items() if matches(f, subject, headers)} or {""}
        assert set(routed) == wanted, (headers, subject)
        for name in wanted:
            expected[name].append(body)
            ids[name].append(routed[name])
    for name, q in queues.items():
        got = drain(q)
        assert [m.body for m in got] == expected[name]
        assert [m.id for m in got] == ids[name]
        for m in got:
            headers, subject = ROUTING_MESSAGES[int(m.body[1:])]
            assert m.headers == {**headers, **({"dbq-subject": subject} if subject else {})}
    return expected


def test_each_message_reaches_the_queues_whose_filters_match_it(topics):
    made, make_queue = topics
    queues = {name: make_queue() for name in ("eu", "big", "sub", "")}
    routes = [route(n, queues[n], f) for n, f in ROUTING_FILTERS.items()]
    topic, _ = made.make(routes, unrouted=queues[""])
    expected = publish_and_check_routing(topic, queues, drain)
    names = topic.names
    assert sql(queues["eu"], f"SELECT last_value FROM {SCHEMA}.{names.published}") == len(ROUTING_MESSAGES)
    assert sql(queues["eu"], f"SELECT last_value FROM {SCHEMA}.{names.unrouted}") == len(expected[""])


def test_routes_past_one_group_of_eight_are_each_taken_when_they_match(topics):
    made, make_queue = topics
    queues = [make_queue() for _ in range(20)]
    # 20 partitions (3 groups of routes), and one route in the last group that takes every message
    routes = [route(f"p{i}", q, flt({"key": "p", "eq": i})) for i, q in enumerate(queues[:19])]
    topic, _ = made.make([*routes, route("every", queues[19], flt())])
    for p in (0, 7, 8, 15, 16, 18, 19):
        assert set(topic.publish(b"%d" % p, headers={"p": p})) == ({f"p{p}"} if p < 19 else set()) | {"every"}
    answers = topic.publish_many([b"m%d" % p for p in range(20)], headers=[{"p": p} for p in range(20)])
    assert [set(a) - {"every"} for a in answers] == [{f"p{p}"} for p in range(19)] + [set()]
    assert [len(drain(q)) for q in queues] == [2 if p in (0, 7, 8, 15, 16, 18) else 1 for p in range(19)] + [
        27
    ]


def test_publish_in_the_caller_s_transaction_commits_and_rolls_back_with_its_writes(topics, postgres):
    made, make_queue = topics
    q = make_queue()
    topic, _ = made.make([route("all", q, flt())])
    table = f"{SCHEMA}.orders_{secrets.token_hex(3)}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int)")
        try:
            for commit in (False, True):
                with conn.transaction():
                    conn.execute(f"INSERT INTO {table} VALUES (%s)", (int(commit),))
                    assert set(topic.publish_in(conn, b"order %d" % commit, subject="order.created")) == {
                        "all"
                    }
                    if not commit:
                        raise psycopg.Rollback()  # the row and the copy go together
            assert conn.execute(f"SELECT array_agg(id) FROM {table}").fetchone()[0] == [1]
        finally:
            conn.execute(f"DROP TABLE {table}")
    assert [(m.body, m.headers) for m in drain(q)] == [(b"order 1", {"dbq-subject": "order.created"})]


def test_publish_many_routes_each_message_as_publish_does_in_one_transaction(topics):
    made, make_queue = topics
    eu, big, rest = (make_queue() for _ in range(3))
    filters = {"eu": flt({"key": "region", "eq": "eu"}), "big": flt({"key": "amount", "gte": 100})}
    topic, _ = made.make([route("eu", eu, filters["eu"]), route("big", big, filters["big"])], unrouted=rest)
    headers = [{"region": "eu", "amount": 100}, None, {"amount": 5}, {"region": "eu"}, {"amount": 1e3}]
    subjects = ["a", None, "b", None, "c"]
    bodies = [f"m{i}".encode() for i in range(len(headers))]
    routed = topic.publish_many(bodies, headers=headers, subjects=subjects)
    for h, s, r in zip(headers, subjects, routed, strict=True):
        wanted = {n for n, f in filters.items() if matches(f, s, h)} or {""}
        assert set(r) == wanted
    for name, q in (("eu", eu), ("big", big), ("", rest)):
        got = drain(q)
        assert [m.body for m in got] == [b for b, r in zip(bodies, routed, strict=True) if name in r]
        assert [m.id for m in got] == [r[name] for r in routed if name in r]
    assert topic.publish_many([]) == []
    last = max(r["eu"] for r in routed if "eu" in r)
    assert topic.publish_many([b"x", b"y"], headers={"region": "eu"}, subjects="s") == [
        {"eu": last + 1},
        {"eu": last + 2},
    ]
    with pytest.raises(ValueError, match="subjects has 1 values for 2 messages"):
        topic.publish_many([b"x", b"y"], subjects=["one"])


def test_concurrent_publishes_share_round_trips_and_each_caller_gets_its_own_answer(topics):
    made, make_queue = topics
    small, other = make_queue(size=50), make_queue(size=1000)
    topic, _ = made.make([route("small", small, flt()), route("other", other, flt())])
    answers: list[Any] = []

    def publisher(who: int) -> None:
        for i in range(25):
            try:
                answers.append((f"{who}-{i}".encode(), topic.publish(f"{who}-{i}".encode())))
            except QueueFull as e:
                answers.append((f"{who}-{i}".encode(), e))

    threads = [threading.Thread(target=publisher, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    published = {b for b, a in answers if isinstance(a, dict)}
    # The small queue holds 50: the check for room before any push leaves no hole behind a
    # refused publish, but one that lost the race to a slot still may (repair voids it).
    assert len(answers) == 200 and 45 <= len(published) <= 50
    assert all(isinstance(a, QueueFull) for b, a in answers if b not in published)
    assert {m.body for m in drain(small)} == published == {m.body for m in drain(other)}


def test_a_full_reject_queue_fails_the_publish_whole_and_a_drop_queue_is_skipped_and_counted(topics):
    made, make_queue = topics
    small, other = make_queue(size=2), make_queue()
    everything = flt()
    topic, backend = made.make([route("small", small, everything), route("other", other, everything)])
    topic.publish(b"1")
    topic.publish(b"2")
    with pytest.raises(QueueFull, match=r"subscription small is full: nothing was published"):
        topic.publish(b"3")
    assert [m.body for m in drain(other)] == [b"1", b"2"]  # nothing of the failed publish
    assert sql(other, f"SELECT last_value FROM {SCHEMA}.{topic.names.published}") == 2
    # The same subscription with onFull: Drop: the others get their copy, the drop is counted.
    backend.target = TopicTarget(
        topic.names, (route("small", small, everything, "Drop"), route("other", other, everything))
    )
    backend.apply()
    assert set(topic.publish(b"4")) == {"other"}
    assert [m.body for m in drain(other)] == [b"4"]
    dropped = topic.names.dropped(2)  # ordinals follow the names: other 1, small 2
    assert sql(other, f"SELECT last_value FROM {SCHEMA}.{dropped}") == 1
    assert [m.body for m in drain(small)] == [b"1", b"2"]
    # A batch the Drop queue has room for in part: its first messages get their copy there.
    small.push(b"waiting")
    answers = topic.publish_many([b"5", b"6", b"7"])
    assert [set(a) for a in answers] == [{"small", "other"}, {"other"}, {"other"}]
    assert [m.body for m in drain(small)] == [b"waiting", b"5"]
    assert [m.body for m in drain(other)] == [b"5", b"6", b"7"]
    assert sql(other, f"SELECT last_value FROM {SCHEMA}.{dropped}") == 3
    assert sql(other, f"SELECT last_value FROM {SCHEMA}.{topic.names.routed(2)}") == 3  # 1, 2 and 5


def test_subscriptions_changed_while_publishers_run_route_each_message_by_one_set_of_rules(topics):
    made, make_queue = topics
    qa, qb = make_queue(size=10_000), make_queue(size=10_000)
    everything, nothing = flt(), flt({"key": "absent", "exists": True})
    rules = [
        (route("a", qa, everything), route("b", qb, nothing)),
        (route("a", qa, nothing), route("b", qb, everything)),
    ]
    topic, backend = made.make(list(rules[0]))
    routed = flip_rules_while_publishing(topic, backend, rules, changes=20, pause=0.05)
    assert len(routed) > 100
    assert_routed_by_one_rule_set(routed, drain(qa), drain(qb))


def flip_rules_while_publishing(
    topic: Any, backend: Any, rules: list[tuple[Route, Route]], changes: int, pause: float
) -> list[tuple[bytes, set[str]]]:
    """3 threads publish through `topic` while `backend` applies the two rule sets in turn,
    `changes` times, `pause` seconds apart: each body and the subscriptions it was routed to. The
    versions the applies answered must count up by one a change."""
    stop, routed, errors = threading.Event(), [], []

    def publisher(who: int) -> None:
        try:
            i = 0
            while not stop.is_set():
                routed.append((f"{who}-{i}".encode(), set(topic.publish(f"{who}-{i}".encode()))))
                i += 1
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=publisher, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    versions = [backend.apply()]
    for change in range(changes):
        backend.target = TopicTarget(topic.names, rules[(change + 1) % 2])
        versions.append(backend.apply())
        time.sleep(pause)  # publishers get through between changes too
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert versions == list(range(versions[0], versions[0] + changes + 1))
    return routed


def assert_routed_by_one_rule_set(
    routed: list[tuple[bytes, set[str]]], in_a: list[Any], in_b: list[Any]
) -> None:
    """Each publish went to a alone or b alone (one rule set each: never both, never none), and
    the queues hold exactly what the answers said."""
    assert all(r in ({"a"}, {"b"}) for _, r in routed)
    bodies_a, bodies_b = {m.body for m in in_a}, {m.body for m in in_b}
    assert bodies_a == {b for b, r in routed if r == {"a"}}
    assert bodies_b == {b for b, r in routed if r == {"b"}}
    assert bodies_a and bodies_b and not bodies_a & bodies_b


def test_a_publish_that_waited_on_a_change_of_subscriptions_is_routed_by_the_new_rules(topics, postgres):
    made, make_queue = topics
    qa, qb = make_queue(), make_queue()
    everything, nothing = flt(), flt({"key": "absent", "exists": True})
    topic, backend = made.make([route("a", qa, everything), route("b", qb, nothing)])
    # Another session holds the topic's row: the change below takes the topic's lock, replaces
    # the routine, then waits on that row before it can commit.
    holder = psycopg.connect(postgres.url)
    holder.execute(f"SELECT 1 FROM {SCHEMA}.dbq_topics WHERE topic = %s FOR UPDATE", (topic.names.topic,))
    backend.target = TopicTarget(topic.names, (route("a", qa, nothing), route("b", qb, everything)))
    change = threading.Thread(target=backend.apply)
    change.start()
    time.sleep(0.5)
    result: dict[str, Any] = {}
    publisher = threading.Thread(target=lambda: result.update(routed=topic.publish(b"during")))
    started = time.monotonic()
    publisher.start()
    time.sleep(0.5)
    assert publisher.is_alive()  # it waits for the change to commit
    holder.rollback()
    change.join(10)
    publisher.join(10)
    holder.close()
    assert time.monotonic() - started >= 0.5
    assert result["routed"].keys() == {"b"}  # committed after the change: the new rules
    assert [m.body for m in drain(qb)] == [b"during"] and drain(qa) == []


def test_a_subscription_to_a_queue_that_is_not_there_is_refused_naming_it(topics):
    made, make_queue = topics
    q = make_queue()
    ghost = Route("ghost", QueueNames(SCHEMA, "no_such_queue"), flt())
    with pytest.raises(
        InvalidSpec, match=r"subscription ghost: queue ringq.no_such_queue is not a ring queue"
    ):
        made.make([route("real", q, flt()), ghost])


def test_a_refused_publish_leaves_no_hole_in_the_other_queues(topics):
    made, make_queue = topics
    full, other = make_queue(size=2), make_queue()
    topic, _ = made.make([route("a_other", other, flt()), route("b_full", full, flt())])  # other goes first
    topic.publish_many([b"1", b"2"])
    for _ in range(3):
        with pytest.raises(QueueFull):
            topic.publish(b"refused")
        with pytest.raises(QueueFull):
            topic.publish_many([b"r1", b"r2"])
    started = time.monotonic()
    assert [m.body for m in drain(other)] == [b"1", b"2"]
    assert time.monotonic() - started < 1.0  # no position drawn and left: nothing to wait on
    assert sql(other, f"SELECT last_value FROM {SCHEMA}.{other.names.push_seq}") == 2


def test_applying_the_same_subscriptions_again_keeps_the_rules_version(topics):
    made, make_queue = topics
    q, rest = make_queue(), make_queue()
    topic, backend = made.make([route("only", q, flt({"key": "n", "gt": 1.5}))], unrouted=rest)
    assert backend.apply() == 1 and backend.apply() == 1  # nothing changed: nothing done
    backend.target = TopicTarget(topic.names, (route("only", q, flt({"key": "n", "gt": 2})),), rest.names)
    assert backend.apply() == 2
    backend.target = TopicTarget(topic.names, backend.target.routes, None)  # no unrouted queue now
    assert backend.apply() == 3 and backend.apply() == 3
    assert topic.publish(b"x", headers={"n": 2}) == {}


def test_filter_values_that_look_like_sql_are_only_values_and_teardown_removes_the_topic(topics):
    made, make_queue = topics
    q = make_queue()
    tricky = "$fn$'; DROP TABLE x; --"
    topic, backend = made.make([route("odd", q, flt({"key": "it's", "eq": tricky}))])
    assert topic.publish(b"yes", headers={"it's": tricky}) == {"odd": 1}
    assert topic.publish(b"no", headers={"it's": tricky + " "}) == {}
    assert [m.body for m in drain(q)] == [b"yes"]
    backend.teardown()
    assert sql(q, f"SELECT to_regproc('{SCHEMA}.{topic.names.publish}') IS NULL") is True
    assert sql(q, f"SELECT count(*) FROM {SCHEMA}.dbq_subscriptions WHERE topic = '{topic.names.topic}'") == 0


@pytest.mark.parametrize("mode", ["pop", "acquire"])
def test_conservation_per_subscription_with_four_publishers_and_four_consumers_each(topics, mode):
    """For every subscription: delivered + dead-lettered + dropped + depth = the published messages
    its filter matches, none twice; unrouted = the messages no filter matched."""
    made, make_queue = topics
    rules = {  # name: filter, onFull, ring size
        "eu": (flt({"key": "region", "eq": "eu"}), "Reject", 4000),
        "big": (flt({"key": "amount", "gte": 500}), "Drop", 8),  # small: copies are dropped
        "orders": (flt(subject=[{"prefix": "order."}]), "Reject", 4000),
    }
    queues = {name: make_queue(size=size, max_attempts=2) for name, (_, _, size) in rules.items()}
    rest = make_queue(size=4000)
    topic, _ = made.make([route(n, queues[n], f, full) for n, (f, full, _) in rules.items()], unrouted=rest)
    per_publisher = 250
    messages = orders(per_publisher)
    answers: dict[bytes, set[str]] = {}
    published = threading.Event()
    started_big = threading.Event()  # the Drop queue's consumers start late: it fills and drops

    def publisher(p: int) -> None:
        with Topic(from_url(made.url), topic.names) as own:
            for i in range(per_publisher):
                body = f"{p}-{i}".encode()
                headers, subject = messages[body]
                answers[body] = set(own.publish(body, headers=headers, subject=subject))
                if len(answers) > 200:
                    started_big.set()

    delivered: dict[str, list[bytes]] = {name: [] for name in [*rules, ""]}

    def consumer(name: str, q: Queue) -> None:
        if name == "big":
            started_big.wait(60)
        consume(q, name, mode, delivered[name], published)

    def all_published() -> None:
        published.set()
        started_big.set()

    errors = run_threads(publisher, consumer, [*queues.items(), ("", rest)], all_published)
    assert errors == [] and len(answers) == len(messages)
    dead_letters = 0
    for name, (f, _, _) in rules.items():
        q = queues[name]
        matched = {b for b, (h, s) in messages.items() if matches(f, s, h)}
        dropped = {b for b in matched if name not in answers[b]}
        dead = {d.body for d in q.dead_letters(limit=10_000)}
        got = delivered[name]
        assert len(got) == len(set(got)), f"{name}: a message delivered twice"
        assert not set(got) & dead
        assert set(got) | dead | dropped == matched and q.stats().depth == 0, name
        assert len(got) + len(dead) + len(dropped) == len(matched), name
        ordinal = sorted(rules).index(name) + 1  # ordinals follow the names
        counted = sql(q, f"SELECT last_value FROM {SCHEMA}.{topic.names.dropped(ordinal)}")
        assert len(dropped) == (counted if dropped else 0), name
        assert not dropped or rules[name][1] == "Drop"
        assert mode == "acquire" or not dead, name
        dead_letters += len(dead)
    assert (mode == "acquire") == (dead_letters > 0)
    assert dropped_somewhere(answers, messages, rules), "the Drop queue never filled: the test proves less"
    unmatched = {
        b for b, (h, s) in messages.items() if not any(matches(f, s, h) for f, _, _ in rules.values())
    }
    assert set(delivered[""]) == unmatched and len(delivered[""]) == len(unmatched)
    assert sql(rest, f"SELECT last_value FROM {SCHEMA}.{topic.names.unrouted}") == len(unmatched)


def orders(per_publisher: int, publishers: int = 4) -> dict[bytes, tuple[dict[str, Any], str | None]]:
    """Bodies `p-i` of each publisher p, with random headers (region, amount: a number, or the
    text "900") and subject."""
    rng = random.Random(44)
    return {
        f"{p}-{i}".encode(): (
            {"region": rng.choice(["eu", "us", "asia"]), "amount": rng.choice([rng.randint(0, 999), "900"])},
            rng.choice(["order.created", "invoice.sent", None]),
        )
        for p in range(publishers)
        for i in range(per_publisher)
    }


def consume(q: Any, name: str, mode: str, delivered: list[bytes], published: threading.Event) -> None:
    """Take from `q` (subscription `name`; '' the unrouted queue) into `delivered` until every
    message is published and the queue is empty. In acquire mode every thirteenth body of a
    subscription is nacked, twice: dead-lettered (max attempts 2)."""
    while True:
        if mode == "pop":
            got = q.pop_many(10, timeout=0.2)
        else:
            got = [m for m in [q.acquire(timeout=0.2, visibility=30)] if m is not None]
        for m in got:
            if mode == "acquire" and name and int(m.body.rsplit(b"-", 1)[1]) % 13 == 0:
                m.nack(error="refused")
                continue
            if mode == "acquire":
                m.ack()
            delivered.append(m.body)
        if not got and published.is_set():
            stats = q.stats()
            if stats.depth == 0 and stats.in_flight == 0:
                return


def run_threads(
    publisher: Any, consumer: Any, queues: list[tuple[str, Any]], published: Any
) -> list[Exception]:
    """4 threads of `publisher(p)` and 4 of `consumer(name, q)` for each queue; `published()` once
    the publishers are done. The errors the threads raised."""
    errors: list[Exception] = []

    def guarded(target: Any, *args: Any) -> None:
        try:
            target(*args)
        except Exception as e:  # the caller asserts there are none
            errors.append(e)

    consumers = [
        threading.Thread(target=guarded, args=(consumer, name, q)) for name, q in queues for _ in range(4)
    ]
    publishers = [threading.Thread(target=guarded, args=(publisher, p)) for p in range(4)]
    for t in consumers + publishers:
        t.start()
    for t in publishers:
        t.join(180)
    published()
    for t in consumers:
        t.join(180)
    return errors


def dropped_somewhere(
    answers: dict[bytes, set[str]], messages: dict[bytes, Any], rules: dict[str, Any]
) -> bool:
    big = rules["big"][0]
    return any("big" not in answers[b] for b, (h, s) in messages.items() if matches(big, s, h))


@pytest.mark.parametrize("batch", [1, 8])
def test_publishers_killed_mid_publish_leave_each_message_in_every_matching_queue_or_in_none(
    topics, postgres, tmp_path, batch
):
    made, make_queue = topics
    queues = [make_queue(size=100_000) for _ in range(3)]
    first = flt({"key": "n", "lt": 50})  # a partial match as well
    topic, _ = made.make([route(f"s{i}", q, flt() if i < 2 else first) for i, q in enumerate(queues)])
    logs, rng = [], random.Random(7)
    for run in range(12):
        log = tmp_path / f"publisher-{run}.log"
        logs.append(log)
        where = (postgres.url, SCHEMA, topic.names.topic)
        run_until_killed(where, log, ["--prefix", f"r{run}", "--batch", str(batch)], rng, most_s=0.9)
    logged = [line.split(" ", 1)[1] for log in logs if log.exists() for line in log.read_text().splitlines()]
    assert len(logged) > 50
    got = [[m.body.decode() for m in drain(q)] for q in queues]
    for bodies in got:
        assert len(bodies) == len(set(bodies))  # none twice
    assert set(got[0]) == set(got[1])  # both take every message: all or none of each
    assert set(logged) <= set(got[0])  # every publish that returned is there
    assert set(got[2]) == {b for b in got[0] if int(b.rsplit("-", 1)[1]) < 50}
