"""Service Broker planning, checks, cleanup and teardown decisions over observations built by hand
(what the catalog would answer in each situation), since no SQL Server runs here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dbq.api.models import Activation, QueueSpec
from dbq.backends import broker_target
from dbq.backends.base import Depth, Finding
from dbq.backends.broker_plan import (
    DATABASE_ACTIONS,
    BrokerAction,
    BrokerObserved,
    BrokerTarget,
    DatabaseState,
    MonitorState,
    QueueFigures,
    QueueState,
    Transmission,
    broker_checks,
    dba_statement,
    is_new,
    plan_broker,
    plan_queue_maintenance,
)
from dbq.backends.sqlserver.broker import observation
from dbq.backends.sqlserver.broker_sql import BrokerSql
from dbq.backends.sqlserver.server import refuse_below_floor
from dbq.client import BrokerQueue
from dbq.connection import from_url
from dbq.contract.broker import (
    BROKER_COUNTERS,
    BROKER_SCHEMA_VERSION,
    CONVERSATION_SECONDS_MAX,
    stalled_after,
)
from dbq.controller.reconcile import deletion_blocker, health
from dbq.controller.schedule import describe
from dbq.errors import ActivationProcedureMissing, BrokerNotUnique, ConflictingObjects, InvalidSpec
from dbq.names import QueueNames

NAMES = QueueNames(schema="shopq", queue="orders")
TARGET = BrokerTarget(
    NAMES, "shop", activation_procedure="handle_orders", activation_enabled=True, max_readers=4
)


def provisioned(target: BrokerTarget = TARGET, **changes) -> BrokerObserved:
    """What the catalog answers once the target's queue is set up and healthy."""
    n = target.names
    main = QueueState(
        n.queue,
        activation_enabled=target.activation_procedure is not None,
        activation_procedure=f"[shop].[{n.schema}].[{target.activation_procedure}]"
        if target.activation_procedure
        else None,
        max_readers=target.max_readers,
        execute_as=target.execute_as,
        internal_table="queue_messages_1003150619",
    )
    observed = BrokerObserved(
        database=DatabaseState(broker_enabled=True, broker_guid="guid-1", schema_exists=True),
        message_types=frozenset(target.message_types),
        contract_messages=frozenset(target.message_types),
        queues={n.queue: main, n.sender_queue: QueueState(n.sender_queue, poison_handling=False)},
        services={target.service: (n.queue, True), target.sender_service: (n.sender_queue, False)},
        sequences=frozenset(n.counter(c) for c in BROKER_COUNTERS),
        tables=frozenset({n.meta, n.history}),
        recorded_version=BROKER_SCHEMA_VERSION,
        endpoints={"CO": 2, "CD": 40},
        monitor=MonitorState("RECEIVES_OCCURRING", 3, 1),
    )
    return dataclasses.replace(observed, **changes)


def actions(steps) -> list[BrokerAction]:
    return [s.action for s in steps]


def with_queue(observed: BrokerObserved, **changes) -> BrokerObserved:
    queues = dict(observed.queues)
    queues[NAMES.queue] = dataclasses.replace(queues[NAMES.queue], **changes)
    return dataclasses.replace(observed, queues=queues)


# --- planning -----------------------------------------------------------------------------------
def test_a_fresh_database_gets_every_object_in_dependency_order():
    fresh = BrokerObserved(database=DatabaseState(broker_enabled=True, broker_guid="g"))
    assert actions(plan_broker(TARGET, fresh)) == [
        BrokerAction.CREATE_SCHEMA, BrokerAction.CREATE_META, BrokerAction.CREATE_HISTORY,
        BrokerAction.CREATE_SEQUENCES, BrokerAction.CREATE_MESSAGE_TYPES, BrokerAction.CREATE_CONTRACT,
        BrokerAction.CREATE_QUEUE, BrokerAction.CREATE_SENDER_QUEUE, BrokerAction.CREATE_SERVICES,
        BrokerAction.RECORD_VERSION, BrokerAction.SECURE,
    ]  # fmt: skip


def test_setup_run_again_on_what_it_made_changes_nothing():
    assert plan_broker(TARGET, provisioned()) == []


def test_a_queue_is_new_only_when_neither_its_queues_nor_its_sequences_nor_its_metadata_row_exist():
    """A new queue is first cleaned up one interval later (ApplyResult.created)."""
    fresh = BrokerObserved(database=DatabaseState(broker_enabled=True, broker_guid="g"))
    other = QueueNames(schema="shopq", queue="invoices")  # another queue of the same schema
    shared = provisioned(dataclasses.replace(TARGET, names=other), recorded_version=None)
    assert is_new(TARGET, fresh) and is_new(TARGET, shared)
    assert not is_new(TARGET, provisioned())
    assert not is_new(TARGET, provisioned(recorded_version=None))  # its queues and sequences
    assert not is_new(
        TARGET, dataclasses.replace(fresh, queues={NAMES.sender_queue: QueueState(NAMES.sender_queue)})
    )
    assert not is_new(
        TARGET, dataclasses.replace(fresh, sequences=frozenset({NAMES.counter(BROKER_COUNTERS[0])}))
    )
    assert not is_new(TARGET, dataclasses.replace(fresh, recorded_version=BROKER_SCHEMA_VERSION))


def test_a_disabled_broker_is_enabled_first_as_a_database_step():
    steps = plan_broker(TARGET, provisioned(database=DatabaseState(broker_enabled=False, schema_exists=True)))
    assert actions(steps) == [BrokerAction.ENABLE_BROKER]
    assert steps[0].action in DATABASE_ACTIONS
    # When it cannot get exclusive access, the error tells a DBA what to run instead.
    assert (
        dba_statement(BrokerAction.ENABLE_BROKER, "shop")
        == "ALTER DATABASE [shop] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE"
    )


def test_a_restored_copy_with_a_shared_broker_guid_is_reported_with_the_statement_to_run():
    copy = provisioned(database=DatabaseState(broker_enabled=False, broker_guid="guid-1", guid_shared=True,
                                              schema_exists=True))  # fmt: skip
    with pytest.raises(BrokerNotUnique) as refused:
        plan_broker(TARGET, copy)
    assert "ALTER DATABASE [shop] SET NEW_BROKER WITH ROLLBACK IMMEDIATE" in str(refused.value)
    assert "spec.serviceBroker.newBroker" in str(refused.value)
    assert refused.value.retry is False  # Stalled: it needs a person (or the opt-in)
    opted_in = dataclasses.replace(TARGET, new_broker=True)
    assert actions(plan_broker(opted_in, copy)) == [BrokerAction.NEW_BROKER]  # no ENABLE_BROKER beside it


def test_partly_present_objects_get_only_what_is_missing():
    partial = provisioned(
        contract_messages=None,
        queues={NAMES.queue: provisioned().queues[NAMES.queue]},
        services={},
        sequences=frozenset({NAMES.counter("pushed")}),
        recorded_version=None,
    )
    steps = plan_broker(TARGET, partial)
    assert actions(steps) == [
        BrokerAction.CREATE_SEQUENCES, BrokerAction.CREATE_CONTRACT, BrokerAction.CREATE_SENDER_QUEUE,
        BrokerAction.CREATE_SERVICES, BrokerAction.RECORD_VERSION, BrokerAction.SECURE,
    ]  # fmt: skip
    assert "orders_n_popped" in steps[0].why and "orders_n_pushed" not in steps[0].why


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"max_readers": 1}, "max readers 1 (want 4)"),
        ({"activation_procedure": "[shop].[shopq].[old_handler]"}, "activation procedure"),
        ({"activation_enabled": False}, "activation off"),
        ({"execute_as": "app_user"}, "execute as app_user (want OWNER)"),
        ({"poison_handling": False}, "poison-message handling off"),
    ],
)
def test_changed_activation_or_poison_handling_is_altered_not_dropped(changes, words):
    steps = plan_broker(TARGET, with_queue(provisioned(), **changes))
    assert actions(steps) == [BrokerAction.ALTER_QUEUE]
    assert words in steps[0].why


def test_activation_the_spec_no_longer_asks_for_is_dropped_from_the_queue():
    plain = dataclasses.replace(TARGET, activation_procedure=None)
    steps = plan_broker(plain, provisioned())
    assert actions(steps) == [BrokerAction.ALTER_QUEUE]
    assert "the spec does not ask for" in steps[0].why


def test_trustworthy_is_set_only_when_the_spec_opts_in():
    assert plan_broker(TARGET, provisioned()) == []
    steps = plan_broker(dataclasses.replace(TARGET, trustworthy=True), provisioned())
    assert actions(steps) == [BrokerAction.SET_TRUSTWORTHY]
    trusted = provisioned(database=dataclasses.replace(provisioned().database, trustworthy=True))
    assert plan_broker(dataclasses.replace(TARGET, trustworthy=True), trusted) == []


def test_a_poison_disabled_queue_is_re_enabled_only_when_the_spec_says_so():
    disabled = with_queue(provisioned(), receive_enabled=False)
    assert plan_broker(TARGET, disabled) == []
    [finding] = broker_checks(TARGET, disabled)
    assert finding.check == "QueueDisabled"
    assert "ALTER QUEUE [shopq].[orders] WITH STATUS = ON" in finding.message
    opted_in = dataclasses.replace(TARGET, re_enable_on_poison=True)
    assert actions(plan_broker(opted_in, disabled)) == [BrokerAction.ENABLE_QUEUE]
    assert "dbq re-enables it" in broker_checks(opted_in, disabled)[0].message


def test_objects_by_our_names_that_cannot_be_ours_are_a_conflict():
    other_contract = provisioned(contract_messages=frozenset({"//someone/else"}))
    with pytest.raises(ConflictingObjects, match="cannot be altered"):
        plan_broker(TARGET, other_contract)
    moved = provisioned(
        services={TARGET.service: ("other_queue", True), TARGET.sender_service: (NAMES.sender_queue, False)}
    )
    with pytest.raises(ConflictingObjects, match="exists on queue other_queue"):
        plan_broker(TARGET, moved)


def test_the_spec_maps_onto_the_planners_target():
    spec = QueueSpec.model_validate({
        "backend": "sqlserver", "design": "servicebroker", "connection": {"secretRef": {"name": "db"}},
        "serviceBroker": {"activation": {"procedure": "handle_orders", "maxReaders": 4},
                          "checks": {"notifiedAfter": "30s", "openConversations": 50}},
    })  # fmt: skip
    target = broker_target(spec, NAMES, "shop")
    assert (target.activation_procedure, target.max_readers, target.execute_as) == (
        "handle_orders",
        4,
        "OWNER",
    )
    assert (target.notified_after_s, target.open_conversations) == (30.0, 50)
    assert not target.new_broker and not target.trustworthy and target.poison_message_handling


# --- checks -------------------------------------------------------------------------------------
def test_a_healthy_queue_passes_every_check():
    assert broker_checks(TARGET, provisioned()) == []


@pytest.mark.parametrize(
    ("observed", "check", "words"),
    [
        (provisioned(database=DatabaseState(broker_enabled=False, schema_exists=True)), "BrokerDisabled",
         "ALTER DATABASE [shop] SET ENABLE_BROKER"),
        (with_queue(provisioned(), procedure_exists=False), "ActivationProcedureMissing", "[shopq].[handle_orders]"),
        (with_queue(provisioned(), activation_enabled=False), "ActivationDisabled", "ACTIVATION (STATUS = ON)"),
        (provisioned(monitor=MonitorState("NOTIFIED", 45, 0)), "MonitorStuck", "NOTIFIED for 45 s (over 10 s)"),
        (provisioned(monitor=MonitorState("DROPPED", 0, 0)), "MonitorDropped", "DROPPED"),
        (provisioned(transmission=(Transmission("dbq/shopq/orders", "The target service name could not be found.", 90),),
                     transmission_total=12), "TransmissionErrors", "12 messages wait"),
        (provisioned(endpoints={"CO": 900, "DI": 200, "CD": 5}), "EndpointLeak", "1100 conversation endpoints"),
    ],
)  # fmt: skip
def test_each_failed_check_names_itself_and_the_fix(observed, check, words):
    findings = broker_checks(TARGET, observed)
    assert [f.check for f in findings] == [check]
    assert words in findings[0].message


def test_a_busy_monitor_is_not_stuck():
    assert broker_checks(TARGET, provisioned(monitor=MonitorState("NOTIFIED", 45, 2))) == []  # tasks waiting
    assert broker_checks(TARGET, provisioned(monitor=MonitorState("NOTIFIED", 5, 0))) == []  # not for long
    unactivated = dataclasses.replace(TARGET, activation_procedure=None)
    assert broker_checks(unactivated, provisioned(unactivated, monitor=MonitorState("NOTIFIED", 99, 0))) == []


def test_messages_still_in_transit_are_not_an_error():
    in_transit = provisioned(transmission=(Transmission("dbq/shopq/orders", "", 1),), transmission_total=1)
    assert broker_checks(TARGET, in_transit) == []


def test_failed_checks_set_degraded_with_one_event_per_change_and_clear_it():
    findings = [Finding("QueueDisabled", "queue off"), Finding("EndpointLeak", "too many")]
    conditions, events = health([], findings, 3)
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "QueueDisabled")
    assert degraded["message"] == "queue off; too many"
    assert [(e.type, e.reason) for e in events] == [("Warning", "QueueDisabled")]
    again, events = health(conditions, findings, 3)
    assert events == [] and again == conditions  # no new Event, no write while nothing changes
    cleared, events = health(conditions, [], 3)
    assert next(c for c in cleared if c["type"] == "Degraded")["status"] == "False"
    assert [e.reason for e in events] == ["ChecksPassed"]
    assert health(cleared, [], 3) == (cleared, [])


def test_describe_shows_the_checks_and_schedules_in_words():
    spec = QueueSpec.model_validate({
        "backend": "sqlserver", "design": "servicebroker", "connection": {"secretRef": {"name": "db"}},
        "serviceBroker": {"activation": {"procedure": "handle_orders"}},
    })  # fmt: skip
    words = describe(spec, None)
    assert "ALTER QUEUE ... REBUILD past 30% fragmentation or ghost records" in words.maintenance
    assert "ended WITH CLEANUP" in words.cleanup
    assert words.checks and "queue monitor not NOTIFIED over 10s" in words.checks
    assert "reported, not re-enabled" in words.checks


# --- teardown, maintenance ---
def test_teardown_waits_for_messages_and_open_conversations_and_says_how_many():
    assert deletion_blocker("orders", Depth(0, 0, 0)) is None
    blocked = deletion_blocker("orders", Depth(2, 1, 3)) or ""
    assert "2 ready and 1 leased messages and 3 open conversations" in blocked
    assert "dbq.dev/force-delete=true" in blocked
    assert "open conversations" not in (deletion_blocker("orders", Depth(5, 0)) or "")


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (QueueFigures("q", 8, 100, 100, 90.0), []),  # too small to matter
        (QueueFigures("q", 5000, 100, 0, 45.0), ["rebuild"]),
        (QueueFigures("q", 5000, 100, 900, 2.0), ["rebuild"]),  # ghost records the cleanup left behind
        (QueueFigures("q", 5000, 100, 0, 12.0), ["reorganize"]),
        (QueueFigures("q", 5000, 100, 0, 1.0), []),
    ],
)
def test_the_queue_is_rebuilt_or_reorganized_by_its_measured_figures(figures, expected):
    assert [s.action for s in plan_queue_maintenance(figures, 30)] == expected


@pytest.mark.parametrize(
    ("major", "level", "named"),
    [(13, 130, "SQL Server 2016 (major version 13)"), (12, 120, "SQL Server 2014 (major version 12)"),
     (14, 120, "compatibility level is 120"), (16, 110, "SET COMPATIBILITY_LEVEL = 130")],
)  # fmt: skip
def test_a_server_or_database_below_the_floor_is_refused_naming_what_was_found(major, level, named):
    with pytest.raises(InvalidSpec, match=re.escape(named)):
        refuse_below_floor(major, level)
    db = DatabaseState(major_version=major, compatibility_level=level)
    with pytest.raises(InvalidSpec):
        plan_broker(TARGET, BrokerObserved(database=db))


def test_sql_server_2017_at_level_130_is_the_floor():
    refuse_below_floor(14, 130)
    assert plan_broker(
        TARGET, BrokerObserved(database=DatabaseState(major_version=14, compatibility_level=130))
    )


def test_the_observation_is_read_from_the_catalogs_result_sets():
    rows = [
        [(1, "guid-1", 0, 0, 15, 1, 150, 1)],
        [("dbq/shopq/orders/message",), ("dbq/shopq/orders/tracer",)],
        [("dbq/shopq/orders/contract", "dbq/shopq/orders/message"), ("dbq/shopq/orders/contract", "dbq/shopq/orders/tracer")],
        [("orders", 0, 1, 1, "[shop].[shopq].[handle_orders]", 1, 4, "OWNER", 1, "queue_messages_77", 1200)],
        [("dbq/shopq/orders", "orders", 1)],
        [("orders_n_pushed",), ("dbq_queues",)],
        [(1,)],
        [("CO ", 3), ("CD", 9)],
        [("dbq/shopq/orders", "An error occurred", 30, 4)],
        [("NOTIFIED", 20, 0, 1)],
    ]  # fmt: skip
    observed = observation(rows, TARGET)
    assert observed.database.major_version == 15 and observed.database.schema_exists
    assert observed.database.compatibility_level == 150
    assert observed.contract_messages == frozenset(TARGET.message_types)
    assert not observed.queues["orders"].receive_enabled and observed.queues["orders"].rows == 1200
    assert observed.tables == frozenset({"dbq_queues"}) and observed.sequences == frozenset(
        {"orders_n_pushed"}
    )
    assert observed.endpoints == {"CO": 3, "CD": 9} and observed.open_conversations == 3
    assert observed.transmission_total == 4 and observed.monitor == MonitorState("NOTIFIED", 20.0, 0)
    assert observed.recorded_version == 1
    hidden = observation([*rows[:9], [("", 0, 0, 0)]], TARGET)  # no VIEW SERVER STATE
    assert hidden.monitor is None and not hidden.monitor_visible
    assert observation([*rows[:2], [], *rows[3:]], TARGET).contract_messages is None


def test_the_example_manifest_is_a_valid_service_broker_queue():
    import yaml

    from dbq.api.models import QueueResource

    doc = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "manifests/examples/queue-servicebroker.yaml").read_text()
    )
    resource = QueueResource.model_validate(doc)
    assert resource.spec.design == "servicebroker" and resource.spec.service_broker.activation is not None


def test_the_client_refuses_bad_arguments_before_it_connects_and_names_an_unreachable_server():
    from dbq.client import BrokerQueue
    from dbq.connection import from_url
    from dbq.errors import DatabaseUnreachable, QueueError

    settings = from_url("mssql://app:not-the-password@127.0.0.1:1/shop")  # a closed port, through FreeTDS
    with pytest.raises(ValueError, match="ttl must be 0 on Service Broker"):
        BrokerQueue(settings, NAMES, ttl=5)
    with pytest.raises(ValueError, match="visibility must be a number of seconds > 0"):
        BrokerQueue(settings, NAMES, visibility=0)
    with pytest.raises(QueueError, match="postgres has no Service Broker queues"):
        BrokerQueue(from_url("postgresql://app:pw@127.0.0.1:1/shop"), NAMES)
    with pytest.raises(DatabaseUnreachable) as unreachable:
        BrokerQueue(settings, NAMES)
    assert "not-the-password" not in str(unreachable.value)
    # Headers are refused before anything is sent (the check needs no connection).
    unconnected = object.__new__(BrokerQueue)
    with pytest.raises(ValueError, match=r"headers: a Service Broker message is a body alone.*ring queue"):
        unconnected.push(b"x", headers={"trace": "t"})


def test_a_missing_activation_procedure_is_found_before_create_or_alter_queue():
    missing = DatabaseState(activation_procedure_exists=False)
    with pytest.raises(ActivationProcedureMissing, match=r"\[shopq\]\.\[handle_orders\] does not exist"):
        plan_broker(TARGET, BrokerObserved(database=missing))
    drifted = provisioned(dataclasses.replace(TARGET, max_readers=1))  # an ALTER QUEUE names the procedure
    with pytest.raises(ActivationProcedureMissing):
        plan_broker(TARGET, dataclasses.replace(drifted, database=missing))
    # A queue already as the spec says: nothing to run; the Degraded check reports the procedure.
    healthy = provisioned()
    gone = dataclasses.replace(healthy.database, activation_procedure_exists=False)
    assert plan_broker(TARGET, dataclasses.replace(healthy, database=gone)) == []


def test_cleanup_never_ends_a_conversation_a_client_may_still_use():
    assert stalled_after(60) == 2 * CONVERSATION_SECONDS_MAX
    assert stalled_after(3600) == 3600
    with pytest.raises(ValueError, match="conversation_seconds must be at most 300"):
        BrokerQueue(from_url("mssql://app:secret@127.0.0.1:1/shop"), NAMES, conversation_seconds=301)


def test_poison_handling_is_on_only_for_an_activation_procedure():
    """dbq's clients nack by rolling their RECEIVE back: with poison handling on, five nacks of one
    message would disable the queue for every consumer."""
    consumed_by_clients = QueueSpec.model_validate(
        {"backend": "sqlserver", "design": "servicebroker", "connection": {"secretRef": {"name": "db"}}}
    )
    target = broker_target(consumed_by_clients, NAMES, "shop")
    assert not target.poison_message_handling
    assert "POISON_MESSAGE_HANDLING (STATUS = OFF)" in BrokerSql(target).create_queue()[0]
    activated = consumed_by_clients.model_copy(deep=True)
    activated.service_broker.activation = Activation(procedure="handle_orders")
    assert broker_target(activated, NAMES, "shop").poison_message_handling
    activated.service_broker.poison_message_handling = False
    assert not broker_target(activated, NAMES, "shop").poison_message_handling
