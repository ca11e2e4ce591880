"""Manifests shared by the API unit tests and the admission tests on the real API server."""

from __future__ import annotations

import copy
from typing import Any


def queue(name: str = "orders", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "backend": "postgres",
        "design": "ring",
        "connection": {"secretRef": {"name": "orders-db"}, "schema": "shopq"},
        "ring": {"size": 64},
    }
    for key, value in spec.items():
        base[key] = value
    return {"apiVersion": "dbq.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": base}


def pipes_queue(name: str, keyspace: str, secret: str = "events-db", **spec: Any) -> dict[str, Any]:
    """A pipes Queue on Cassandra in `keyspace`, reached with the Secret `secret`."""
    doc = queue(name, backend="cassandra", design="pipes",
                connection={"secretRef": {"name": secret}, "schema": keyspace}, **spec)  # fmt: skip
    del doc["spec"]["ring"]
    return doc


def service_broker_queue() -> dict[str, Any]:
    doc = with_path(with_path(queue(), "spec.backend", "sqlserver"), "spec.design", "servicebroker")
    del doc["spec"]["ring"]
    return doc


def with_path(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return doc


# (id, manifest, words the refusal must contain). Each is refused at admission by the API server
# and by the pydantic models that `dbq apply` uses.
REFUSED_AT_ADMISSION: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-backend", with_path(queue(), "spec.backend", "mysql"), "spec.backend"),
    ("pipes-on-postgres", with_path(queue(), "spec.design", "pipes"), "does not exist on backend postgres"),
    (
        "broker-on-postgres",
        with_path(queue(), "spec.design", "servicebroker"),
        "does not exist on backend postgres",
    ),
    (
        "ring-on-cassandra",
        with_path(queue(), "spec.backend", "cassandra"),
        "does not exist on backend cassandra",
    ),
    ("size-zero", with_path(queue(), "spec.ring.size", 0), "spec.ring.size"),
    ("size-negative", with_path(queue(), "spec.ring.size", -5), "spec.ring.size"),
    ("size-huge", with_path(queue(), "spec.ring.size", 10**12), "spec.ring.size"),
    ("size-wrong-type", with_path(queue(), "spec.ring.size", "big"), "spec.ring.size"),
    ("message-bytes-huge", with_path(queue(), "spec.ring.messageBytes", 100_000), "spec.ring.messageBytes"),
    (
        "auto-grow-below-size",
        with_path(queue(), "spec.ring.autoGrow", {"maxSize": 32}),
        "spec.ring.autoGrow.maxSize",
    ),
    (
        "auto-grow-threshold-100",
        with_path(queue(), "spec.ring.autoGrow", {"maxSize": 128, "whenFullAbove": 100}),
        "whenFullAbove",
    ),
    (
        "max-bytes-huge",
        with_path(queue(), "spec.messages.maxBytes", (64 << 20) + 1),
        "spec.messages.maxBytes",
    ),
    (
        "pipes-max-bytes-past-a-mutation",
        with_path(pipes_queue("events", "events"), "spec.messages.maxBytes", (8 << 20) + 1),
        "a pipes message holds a body of at most 8388608 bytes",
    ),
    (
        "pipes-headers-past-a-logged-batch",
        with_path(pipes_queue("events", "events"), "spec.messages.headerBytes", 20_000),
        "and at most 16384 bytes of headers",
    ),
    (
        "compression-on-pipes",
        with_path(pipes_queue("events", "events"), "spec.messages.compression", "lz4"),
        "spec.messages.compression chooses PostgreSQL's compression of stored bodies",
    ),
    (
        "compression-unknown",
        with_path(queue(), "spec.messages.compression", "zstd"),
        "spec.messages.compression",
    ),
    (
        "visibility-not-duration",
        with_path(queue(), "spec.timeouts.visibility", "forever"),
        "spec.timeouts.visibility",
    ),
    ("visibility-too-long", with_path(queue(), "spec.timeouts.visibility", "13h"), "1s to 12h"),
    ("cleanup-too-often", with_path(queue(), "spec.cleanup.interval", "1s"), "5s to 24h"),
    (
        "archive-on-servicebroker",
        with_path(service_broker_queue(), "spec.archive.enabled", True),
        "has no archive",
    ),
    (
        "dead-letters-on-servicebroker",
        with_path(service_broker_queue(), "spec.deadLetter", {"maxAttempts": 3}),
        "keeps no dead letters",
    ),
    ("archive-retention-too-short", with_path(queue(), "spec.archive.retention", "10s"), "1m to 8760h"),
    (
        "sql-injection-queue-name",
        with_path(queue(), "spec.queueName", 'x"; DROP TABLE t; --'),
        "spec.queueName",
    ),
    (
        "sql-injection-schema",
        with_path(queue(), "spec.connection.schema", "q'); DROP SCHEMA public; --"),
        "schema",
    ),
    ("upper-case-schema", with_path(queue(), "spec.connection.schema", "Queues"), "schema"),
    (
        "broker-settings-on-a-ring",
        with_path(queue(), "spec.serviceBroker", {"trustworthy": True}),
        "spec.serviceBroker holds the settings of servicebroker queues",
    ),
    (
        "pipes-settings-on-a-ring",
        with_path(queue(), "spec.pipes", {"maxPushesPerPipe": 10}),
        "spec.pipes holds the settings of pipes queues",
    ),
    (
        "ring-settings-on-pipes",
        with_path(pipes_queue("events", "ks"), "spec.ring", {"size": 64}),
        "spec.ring holds the settings of ring queues",
    ),
    ("dotted-name-without-queue-name", queue(name="orders.v2"), "set spec.queueName"),
    ("cron-garbage", with_path(queue(), "spec.reindex.schedule", "every night"), "write five fields"),
    (
        "cron-minute-61",
        with_path(queue(), "spec.reindex.schedule", "61 3 * * *"),
        "the minute field must be 0-59",
    ),
    (
        "cron-hour-25",
        with_path(queue(), "spec.reindex.schedule", "0 25 * * *"),
        "the hour field must be 0-23",
    ),
    ("cron-day-32", with_path(queue(), "spec.reindex.schedule", "0 3 32 * *"), "the day-of-month field"),
    ("cron-month-13", with_path(queue(), "spec.reindex.schedule", "0 3 * 13 *"), "the month field"),
    ("cron-weekday-9", with_path(queue(), "spec.reindex.schedule", "0 3 * * 9"), "the day-of-week field"),
    ("cron-unknown-macro", with_path(queue(), "spec.reindex.schedule", "@often"), "a macro is one of"),
    ("missing-connection", {**queue(), "spec": {"backend": "postgres", "design": "ring"}}, "connection"),
    (
        "secret-name-injection",
        with_path(queue(), "spec.connection.secretRef.name", "db;rm -rf"),
        "secretRef.name",
    ),
    ("bad-deletion-policy", with_path(queue(), "spec.deletionPolicy", "Sometimes"), "spec.deletionPolicy"),
    (
        "pgmq-topic-two-wildcards",
        with_path(queue(), "spec.pgmq", {"name": "jobs", "topics": ["logs.**"]}),
        "no two wildcards side by side",
    ),
]
