"""The ring planner is a pure function: spec + observation -> steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dbq.backends.ring_plan import ROUTINES, Observed, Recorded, choose_compression, is_new, plan_ring
from dbq.contract.ring import PGMQ_FACADE_VERSION, RING_SCHEMA_VERSION, RingTarget
from dbq.errors import ConflictingObjects, DeadLetterQueueNotFound, InvalidSpec, UnsafeName
from dbq.names import QueueNames

NAMES = QueueNames(schema="shopq", queue="orders")
TARGET = RingTarget(names=NAMES, size=1000, message_bytes=300)


def complete(**changes) -> Observed:
    base = dict(
        schema_exists=True,
        meta_exists=True,
        tables=frozenset({NAMES.meta, NAMES.history, *NAMES.tables}),
        sequences=frozenset(NAMES.sequences),
        routines=frozenset(NAMES.routine(r) for r in ROUTINES),
        ring_rows=1000,
        slots=1000,
        recorded=Recorded(schema_version=RING_SCHEMA_VERSION, ring_size=1000, message_bytes=300),
    )
    base.update(changes)
    return Observed(**base)


def actions(observed: Observed, target: RingTarget = TARGET) -> list[str]:
    return [str(s) for s in plan_ring(target, observed)]


def test_empty_database_gets_everything_in_order():
    assert actions(Observed()) == [
        "create_schema", "create_meta", "create_ring", "fill_ring", "create_sequences",
        "create_side_tables", "create_history", "create_routines", "record_version", "secure",
    ]  # fmt: skip


def test_a_queue_is_new_only_when_none_of_its_tables_or_its_metadata_row_exist():
    shared = Observed(schema_exists=True, meta_exists=True, tables=frozenset({NAMES.meta, NAMES.history}))
    assert is_new(TARGET, Observed()) and is_new(TARGET, shared)  # other queues' schema and tables
    assert not is_new(TARGET, complete())
    assert not is_new(TARGET, complete(tables=frozenset({NAMES.dead}), recorded=None))  # its dead letters
    assert not is_new(TARGET, Observed(recorded=complete().recorded))


def test_matching_database_needs_nothing():
    assert actions(complete()) == []


def test_objects_not_as_dbq_secures_them_are_secured_again():
    """A routine granted to PUBLIC behind dbq's back, or the schema given to another owner: the
    plan says so and secures them again, whatever else matches; objects made are secured last."""
    assert actions(complete(secured=False)) == ["secure"]
    assert [s.why for s in plan_ring(TARGET, complete(secured=False))] == [
        "an object or a grant is not as dbq gives it"
    ]
    assert plan_ring(TARGET, Observed())[-1].why == "create_schema made objects"
    assert actions(complete(ring_rows=400)) == ["fill_ring"]  # nothing made: nothing to secure


def test_dropped_ring_is_recreated_and_positions_reset():
    observed = complete(tables=complete().tables - {NAMES.ring}, ring_rows=0)
    assert actions(observed) == ["create_ring", "fill_ring", "reset_positions", "create_routines", "secure"]


def test_half_filled_ring_is_topped_up():
    assert actions(complete(ring_rows=400)) == ["fill_ring"]


def test_missing_routine_and_new_message_size_rewrite_routines():
    routines = complete().routines - {NAMES.routine("pop")}
    assert actions(complete(routines=routines)) == ["create_routines", "secure"]
    bigger = RingTarget(names=NAMES, size=1000, message_bytes=600)
    assert actions(complete(), bigger) == ["create_routines", "record_version", "secure"]


def test_older_schema_version_is_upgraded():
    def at(version: int) -> Observed:
        return complete(recorded=Recorded(schema_version=version, ring_size=1000, message_bytes=300))

    assert actions(at(17)) == ["allow_content", "create_routines", "record_version", "secure"]
    assert actions(at(16)) == ["allow_content", "create_routines", "record_version", "secure"]
    assert actions(at(15)) == ["add_headers", "allow_content", "create_routines", "record_version", "secure"]
    assert actions(at(13)) == [
        "index_spill",
        "add_headers",
        "allow_content",
        "create_routines",
        "record_version",
        "secure",
    ]
    assert actions(at(9)) == [
        "key_dead_letters",
        "index_spill",
        "add_headers",
        "allow_content",
        "create_routines",
        "record_version",
        "secure",
    ]


def test_a_version_6_queue_gets_the_settled_total_seeded_from_its_leases():
    version_6 = complete(
        sequences=frozenset(NAMES.sequences) - {NAMES.counter("settled")},
        recorded=Recorded(schema_version=6, ring_size=1000, message_bytes=300),
    )
    assert actions(version_6) == [
        "create_sequences", "index_spill", "add_headers", "allow_content", "seed_settled", "create_routines", "record_version",
        "secure",
    ]  # fmt: skip
    # A ring made anew has no leases to count: its totals start from nothing.
    assert "seed_settled" not in actions(complete(tables=frozenset(), sequences=frozenset()))


def test_a_version_7_queue_gets_its_dead_letter_table_and_totals_and_keeps_everything_else():
    version_7 = complete(
        tables=frozenset(NAMES.tables) - {NAMES.dead} | {NAMES.meta, NAMES.history},
        sequences=frozenset(NAMES.sequences) - {NAMES.counter(c) for c in ("dead", "redriven", "purged")},
        recorded=Recorded(schema_version=7, ring_size=1000, message_bytes=300),
    )
    assert actions(version_7) == [
        "create_sequences",
        "create_side_tables",
        "index_spill",
        "add_headers",
        "allow_content",
        "create_routines",
        "record_version",
        "secure",
    ]


def test_a_changed_max_attempts_or_header_limit_rewrites_the_routines_only():
    target = RingTarget(names=NAMES, size=1000, message_bytes=300, max_attempts=5)
    assert [str(s) for s in plan_ring(target, complete())] == ["create_routines", "record_version", "secure"]
    target = RingTarget(names=NAMES, size=1000, message_bytes=300, header_bytes=4096)
    assert [str(s) for s in plan_ring(target, complete())] == ["create_routines", "record_version", "secure"]


def test_compression_is_the_best_offered_unless_asked_and_refused_when_not_offered():
    modern = frozenset({"pglz", "lz4", "none"})
    assert choose_compression("", modern) == "lz4"
    assert choose_compression("", frozenset({"pglz", "none"})) == "pglz"  # built without lz4
    assert choose_compression("", frozenset()) == ""  # no choice (before 14, SQL Server): left alone
    assert choose_compression("none", modern) == "none" and choose_compression("pglz", modern) == "pglz"
    with pytest.raises(
        InvalidSpec,
        match=r"spec.messages.compression: lz4 is not offered by this server \(it offers none, pglz\)",
    ):
        choose_compression("lz4", frozenset({"pglz", "none"}))
    with pytest.raises(InvalidSpec, match="needs PostgreSQL 14 or later"):
        choose_compression("none", frozenset())


def test_a_changed_compression_alters_the_body_columns_and_records_it_only():
    recorded = complete().recorded
    assert recorded is not None
    lz4 = RingTarget(names=NAMES, size=1000, message_bytes=300, compression="lz4")
    # A queue made before the setting existed (nothing recorded), then one with another one.
    assert [str(s) for s in plan_ring(lz4, complete())] == ["set_compression", "record_version"]
    assert plan_ring(lz4, complete(recorded=replace(recorded, compression="lz4"))) == []
    steps = plan_ring(lz4, complete(recorded=replace(recorded, compression="none")))
    assert [str(s) for s in steps] == ["set_compression", "record_version"]
    assert "compressed with none, spec.messages.compression wants lz4" in steps[0].why
    # A new queue gets it after its tables; a server without a choice ('') plans nothing for it.
    assert actions(Observed(), lz4)[-5:] == [
        "set_compression",
        "create_history",
        "create_routines",
        "record_version",
        "secure",
    ]
    assert "set_compression" not in actions(Observed())


def test_another_size_is_refused_with_the_way_out_for_a_ring_the_queue_did_not_provision():
    target = RingTarget(names=NAMES, size=2000, message_bytes=300)
    with pytest.raises(ConflictingObjects, match="resizes online only a ring it provisioned itself"):
        plan_ring(target, complete())
    assert plan_ring(target, complete(), resizable=True) == []  # the resize is not a plan step


@pytest.mark.parametrize("bad", ['x"; DROP TABLE t; --', "Orders", "a-b", "", "1abc", "x" * 41, "q\x00"])
def test_unsafe_names_never_become_identifiers(bad):
    with pytest.raises(UnsafeName, match="not a safe identifier"):
        QueueNames(schema="shopq", queue=bad)
    with pytest.raises(UnsafeName):
        QueueNames(schema=bad, queue="orders")


def test_dead_letters_kept_by_another_queue_wait_for_it_and_rewrite_the_routines():
    """spec.deadLetter.queue: the keeper must be provisioned at this schema version (its dead-letter
    table keyed by source); a change of keeper re-creates the routines and records it."""
    keeper = QueueNames(schema="errors", queue="dlq")
    kept = RingTarget(names=NAMES, size=1000, message_bytes=300, max_attempts=3, dead_letter_keeper=keeper)
    with pytest.raises(
        DeadLetterQueueNotFound, match=r"queue errors\.dlq must be provisioned.*it is not provisioned"
    ):
        plan_ring(kept, complete())
    with pytest.raises(DeadLetterQueueNotFound, match="it has schema version 9"):
        plan_ring(kept, complete(keeper_version=9))
    ready = complete(
        keeper_version=RING_SCHEMA_VERSION,
        recorded=Recorded(
            schema_version=RING_SCHEMA_VERSION, ring_size=1000, message_bytes=300, max_attempts=3
        ),
    )
    assert actions(ready, kept) == ["create_routines", "record_version", "secure"]
    assert actions(Observed(keeper_version=RING_SCHEMA_VERSION), kept) == actions(Observed())  # a new queue
    moved = Recorded(RING_SCHEMA_VERSION, 1000, 300, max_attempts=3, dead_letter_queue="errors.dlq")
    assert actions(complete(keeper_version=RING_SCHEMA_VERSION, recorded=moved), kept) == []


def test_pgmq_topics_that_differ_from_the_spec_are_published_again_and_equal_ones_are_left_alone():
    target = replace(TARGET, pgmq_name="jobs", pgmq_topics=("#.error", "orders.*"))
    published = complete(
        facade_version=PGMQ_FACADE_VERSION, pgmq_name="jobs", pgmq_topics=("#.error", "orders.*")
    )
    assert actions(published, target) == []
    assert actions(replace(published, pgmq_topics=("#.error",)), target) == ["publish_pgmq"]
    assert actions(replace(published, pgmq_topics=()), replace(target, pgmq_topics=())) == []
    assert actions(replace(published, facade_version=1), target) == ["install_pgmq"]
