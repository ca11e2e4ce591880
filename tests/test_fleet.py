"""The upkeep scheduler's choices, without a cluster or a database: which Queues have upkeep
due, how they are grouped (PostgreSQL rings of one schema together), and when a Queue is at
rest so its cleanup waits for the heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dbq.client import QueueStats
from dbq.controller import conditions as cond
from dbq.controller import fleet, upkeep

NOW = 1_000.0
WALL = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PROVISIONED = [{"type": cond.PROVISIONED, "status": "True"}, {"type": cond.READY, "status": "True"}]


def body(
    name: str, schema: str = "s1", backend: str = "postgres", design: str = "ring", **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "generation": 1, **meta},
        "spec": {
            "backend": backend,
            "design": design,
            "connection": {"secretRef": {"name": "db"}, "schema": schema},
        },
        "status": {"conditions": PROVISIONED},
    }


def keys(groups: list[fleet.Group]) -> dict[tuple[str, ...], list[str]]:
    return {g.key: sorted(q.name for q in g.queues) for g in groups}


def test_rings_of_one_schema_are_kept_up_together_and_the_rest_each_on_its_own():
    queues = fleet.Fleet()
    for b in (body("a"), body("b"), body("c", schema="s2"), body("p", backend="cassandra", design="pipes")):
        queues.saw(b)
    groups = queues.due(NOW, WALL)
    assert keys(groups) == {
        ("ns", "db", "s1"): ["a", "b"],
        ("ns", "db", "s2"): ["c"],
        ("ns", "db", "s1", "p"): ["p"],
    }
    assert {g.key: g.batched for g in groups}[("ns", "db", "s1", "p")] is False
    assert keys(queues.due(NOW, WALL, busy=frozenset({("ns", "db", "s1")}))).keys() == {
        ("ns", "db", "s2"), ("ns", "db", "s1", "p")
    }  # fmt: skip


def test_queues_not_provisioned_paused_or_being_deleted_are_left_alone():
    queues = fleet.Fleet()
    fresh = body("fresh")
    fresh["status"] = {}
    queues.saw(fresh)
    queues.saw(body("paused", annotations={"dbq.dev/paused": "True"}))
    queues.saw(body("going", deletionTimestamp="2026-11-29T11:00:00Z"))
    queues.saw(body("kept"))
    # Just paused: a check of its own says so in its status (kopf sees no change of a dbq.dev/
    # annotation), then it is left alone.
    assert keys(queues.due(NOW, WALL)) == {("ns", "db", "s1"): ["kept"], ("ns", "paused"): ["paused"]}
    queues.wrote("ns", "paused", {"conditions": [*PROVISIONED, {"type": cond.PAUSED, "status": "True"}]})
    assert keys(queues.due(NOW, WALL)) == {("ns", "db", "s1"): ["kept"]}
    queues.forget("ns", "kept")
    queues.saw(body("paused"))  # resumed: its check drops the condition
    resumed = queues.tracked("ns", "paused")
    queues.wrote("ns", "paused", {"conditions": [*PROVISIONED, {"type": cond.PAUSED, "status": "True"}]})
    assert keys(queues.due(NOW, WALL)) == {("ns", "paused"): ["paused"]} and resumed.memory.drift_at == 0.0
    queues.forget("ns", "paused")
    assert queues.due(NOW, WALL) == []


def test_a_queue_with_nothing_due_is_not_handed_out_and_a_spec_that_does_not_parse_is():
    queues = fleet.Fleet()
    queues.saw(body("idle"))
    broken = body("broken")
    broken["spec"]["backend"] = "oracle"
    queues.saw(broken)
    idle = queues.tracked("ns", "idle")
    spec = idle.spec()
    window = upkeep.stamp(upkeep.next_window(spec.reindex.schedule, WALL))
    queues.wrote("ns", "idle", {"maintenance": {"nextRun": window, "cron": spec.reindex.schedule}})
    idle.memory.stats_at = idle.memory.cleanup_at = idle.memory.database.checked_at = NOW
    assert keys(queues.due(NOW + 1, WALL)) == {("ns", "broken"): ["broken"]}  # its upkeep reports it
    assert queues.tracked("ns", "idle").memory is idle.memory  # the watch's next copy keeps the memory
    queues.saw(body("idle"))
    assert queues.tracked("ns", "idle").memory is idle.memory


def stats(**figures: int) -> QueueStats:
    return QueueStats(**{"depth": 0, "in_flight": 0, "pushed": 5, "popped": 5, "acquired": 0, "expired": 0,
                         "oldest_age_seconds": 0.0, **figures})  # fmt: skip


def test_an_empty_queue_rests_after_a_cleanup_finds_nothing_a_grace_after_its_last_move():
    memory, grace = upkeep.Memory(), 300.0
    memory.saw_stats(stats(), NOW)
    memory.found_nothing_at = NOW + 60  # a cleanup found nothing, but too soon after the move:
    assert not memory.at_rest(grace)  # a hole left by the last push may not be old enough yet
    memory.found_nothing_at = NOW + grace
    assert memory.at_rest(grace)
    memory.saw_stats(stats(), NOW + grace + 15)  # nothing moved: still at rest
    assert memory.at_rest(grace)
    memory.saw_stats(stats(pushed=6, popped=6), NOW + grace + 30)  # a message came and went
    assert not memory.at_rest(grace) and memory.found_nothing_at == 0.0


def test_a_queue_never_used_rests_from_its_first_sample_and_stops_resting_once_a_position_is_drawn():
    memory, grace, unused = upkeep.Memory(), 300.0, stats(pushed=0, popped=0)
    memory.measured((0, 0, 0, 0), unused, NOW)
    memory.saw_stats(unused, NOW)
    assert memory.untouched() and memory.at_rest(grace)  # no cleanup found nothing yet: none is needed
    memory.measured((1, 0, 0, 0), unused, NOW + 15)  # a push position drawn, its push not committed: a hole
    assert not memory.untouched() and not memory.at_rest(grace)
    memory.measured((0, 0, 0, 0), unused, NOW + 30)
    memory.saw_stats(stats(pushed=1, popped=1), NOW + 30)  # counters moved
    assert not memory.untouched() and not memory.at_rest(grace)
    unread = upkeep.Memory()  # positions never read (SQL Server): it rests only as any queue does
    unread.saw_stats(unused, NOW)
    assert not unread.untouched() and not unread.at_rest(grace)


def test_a_queue_holding_messages_never_rests():
    for held in ({"depth": 1}, {"in_flight": 1}, {"delayed": 1}, {"archived": 1}):
        memory = upkeep.Memory()
        memory.saw_stats(stats(**held), NOW)
        memory.found_nothing_at = NOW + 10_000
        assert not memory.at_rest(300.0), held


def test_a_resting_queue_is_cleaned_up_on_the_heartbeat_only():
    memory = upkeep.Memory()
    spec = memory.spec(1, body("q")["spec"])
    memory.saw_stats(stats(), NOW)
    memory.cleanup_at = memory.found_nothing_at = NOW + 600
    later = NOW + 600 + 120  # two cleanup intervals (1m) later
    assert not upkeep.what_is_due(spec, {}, memory, later, WALL).cleanup
    assert upkeep.what_is_due(spec, {}, memory, NOW + 600 + upkeep.STATS_HEARTBEAT_S, WALL).cleanup
    memory.found_nothing_at = 0.0  # not at rest: every interval
    assert upkeep.what_is_due(spec, {}, memory, later, WALL).cleanup


def test_a_database_whose_health_check_is_due_gets_it_from_one_of_its_queues_not_from_all():
    queues = fleet.Fleet()
    for name in ("a", "b", "c"):
        queues.saw(body(name, schema=f"s_{name}"))
    entries = [queues.tracked("ns", name) for name in ("a", "b", "c")]
    spec = entries[0].spec()
    window = upkeep.stamp(upkeep.next_window(spec.reindex.schedule, WALL))
    for entry in entries:
        queues.wrote("ns", entry.name, {"maintenance": {"nextRun": window, "cron": spec.reindex.schedule}})
        entry.memory.stats_at = entry.memory.cleanup_at = entry.memory.drift_at = NOW
    database = entries[0].memory.database
    assert all(e.memory.database is database for e in entries)  # one Secret: one database
    database.checked_at = NOW
    assert queues.due(NOW + 1, WALL) == []  # nothing due, the database asked a moment ago
    checks = queues.due(NOW + upkeep.HEALTH_INTERVAL_S, WALL)
    assert sum(len(g.queues) for g in checks) == 1  # one queue asks it for all three
    assert [g.batched for g in checks] == [True]
    entries[1].memory.stats_at = 0.0  # a queue with statistics due asks it anyway: no other one
    assert keys(queues.due(NOW + upkeep.HEALTH_INTERVAL_S, WALL)) == {("ns", "db", "s_b"): ["b"]}
    busy = frozenset({("ns", "db", "s_b")})
    assert sum(len(g.queues) for g in queues.due(NOW + upkeep.HEALTH_INTERVAL_S, WALL, busy=busy)) == 1


class NoChecks:
    """A ring's backend as the upkeep sees it on a tick whose statistics were measured for it."""

    def checks(self) -> list[Any]:
        return []


def test_a_tick_that_only_samples_statistics_kept_unmeasured_opens_nothing_and_writes_nothing():
    memory = upkeep.Memory()
    spec = memory.spec(1, body("q")["spec"])
    window = upkeep.stamp(upkeep.next_window(spec.reindex.schedule, WALL))
    status: dict[str, Any] = {"maintenance": {"nextRun": window, "cron": spec.reindex.schedule}}
    memory.created(NOW)
    memory.drift_at, memory.database.checked_at = NOW, NOW + 10**6  # no drift check, no health check
    kept = stats()

    def tick(at: float, measured: QueueStats, backend: Any) -> upkeep.Upkeep:
        memory.cleanup_at = at  # no cleanup due either
        done = upkeep.run_upkeep(
            "ns", "q", spec, status, backend, memory, now=at, wall=WALL, measured=measured
        )
        status.update(done.status)
        return done

    def never() -> Any:
        raise AssertionError("the backend was opened on a tick that only samples")

    assert "stats" in tick(NOW, kept, NoChecks).status  # the first figures are published
    tick(NOW + 15, kept, NoChecks)  # the rates (none yet) become zero: published
    quiet = tick(NOW + 30, kept, never)
    assert quiet.status == {} and quiet.events == [] and memory.stats_at == NOW + 30
    assert [at for at, _, _ in memory.samples][-1] == NOW + 30  # the sample is remembered
    assert (
        tick(NOW + 45, stats(), NoChecks).status == {}
    )  # measured (a new object): the full tick, same figures
    again = memory.last_stats
    assert again is not None and tick(NOW + 60, again, never).status == {}
    assert (
        "stats" in tick(NOW + 15 + upkeep.STATS_HEARTBEAT_S, again, NoChecks).status
    )  # the heartbeat writes
