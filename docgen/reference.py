"""Reference tables rendered from the code, so the docs cannot drift from it.

Each function returns Markdown; `docgen.hooks` puts it where a page says
`<!-- dbq:reference NAME -->`. Tests call these functions with changed inputs and check the
output follows.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from stack.render_manifests import CHART, values_table


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(value: Any) -> str:
    text = value if isinstance(value, str) and value else json.dumps(value, separators=(", ", ": "))
    return f"`{_cell(text)}`"


def _kind(node: dict[str, Any]) -> str:
    kind = node.get("type", "object")
    if kind == "array":
        return f"list of {_kind(node.get('items', {}))}"
    if kind == "string" and node.get("x-kubernetes-int-or-string"):
        return "duration"
    return str(kind)


def _limits(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(_code(v) for v in node["enum"]))
    if "minimum" in node or "maximum" in node:
        parts.append(f"{node.get('minimum', '')}..{node.get('maximum', '')}")
    if "minLength" in node or "maxLength" in node:
        parts.append(f"length {node.get('minLength', 0)}..{node.get('maxLength', '')}")
    if "maxItems" in node:
        parts.append(f"at most {node['maxItems']} items")
    rules = [r for r in node.get("x-kubernetes-validations", []) if "oldSelf" not in r["rule"]]
    if "pattern" in node or rules:
        parts.append("checked at admission")
    return "; ".join(parts)


def _immutable(node: dict[str, Any]) -> bool:
    return any(r.get("rule") == "self == oldSelf" for r in node.get("x-kubernetes-validations", []))


def _fields(node: dict[str, Any], path: str) -> Iterable[tuple[str, dict[str, Any]]]:
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        yield child_path, child
        target = child.get("items", {}) if child.get("type") == "array" else child
        yield from _fields(target, child_path + ("[]" if child.get("type") == "array" else ""))


def _row(field: str, node: dict[str, Any], with_mutability: bool) -> str:
    default = _code(node["default"]) if "default" in node and node["default"] != {} else ""
    notes = [_cell(node.get("description", ""))]
    if _limits(node):
        notes.append(f"Allowed: {_cell(_limits(node))}.")
    if with_mutability and _immutable(node):
        notes.append("**Immutable.**")
    return f"| `{field}` | {_kind(node)} | {default} | {' '.join(n for n in notes if n)} |"


def schema_table(schema: dict[str, Any], path: str, *, with_mutability: bool = True) -> str:
    """The fields of an OpenAPI v3 schema (the CRD's spec or status): one table of the plain
    top-level fields, then a section per object field with a row per field below it."""
    header = ["| Field | Type | Default | Description |", "|---|---|---|---|"]
    plain, sections = [], []
    for name, top in schema.get("properties", {}).items():
        field = f"{path}.{name}"
        inner = top.get("items", {}) if top.get("type") == "array" else top
        if "properties" not in inner:
            plain.append(_row(field, top, with_mutability))
            continue
        rows = [
            _row(child, node, with_mutability)
            for child, node in _fields(inner, field + ("[]" if inner is not top else ""))
        ]
        notes = " ".join(
            n
            for n in (
                _cell(top.get("description", "")),
                "**Immutable.**" if with_mutability and _immutable(top) else "",
            )
            if n
        )
        sections += [f"### `{field}`", "", notes, "", *header, *rows, ""]
    return "\n".join([f"### `{path}`", "", *header, *plain, "", *sections])


def admission_rules(rules: list[dict[str, Any]]) -> str:
    """The CEL rules that span fields, as the API server's messages."""
    lines = []
    for rule in rules:
        message = rule.get("message") or rule.get("messageExpression", "")
        lines.append(f"- {_cell(message)}")
    return "\n".join(lines) + "\n"


def queue_spec() -> str:
    from dbq.api import crd
    from dbq.api.models import ROOT_RULES, SPEC_RULES

    return (
        schema_table(crd.spec_schema(), "spec")
        + "\nRules across fields, checked by the API server at admission (the message it returns):\n\n"
        + admission_rules(SPEC_RULES + ROOT_RULES)
    )


def queue_status() -> str:
    from dbq.api import crd

    return schema_table(crd.status_schema(), "status", with_mutability=False)


def topic_spec() -> str:
    from dbq.api import crd
    from dbq.api.topics import TOPIC_ROOT_RULES, TOPIC_RULES, TopicSpec

    return (
        schema_table(crd.spec_schema(TopicSpec, TOPIC_RULES), "spec")
        + "\nRules across fields, checked by the API server at admission (the message it returns):\n\n"
        + admission_rules(TOPIC_RULES + TOPIC_ROOT_RULES)
    )


def subscription_spec() -> str:
    from dbq.api import crd
    from dbq.api.topics import SUBSCRIPTION_ROOT_RULES, SubscriptionSpec

    return (
        schema_table(crd.spec_schema(SubscriptionSpec, []), "spec")
        + "\nChecked by the API server at admission (the message it returns):\n\n"
        + admission_rules(SUBSCRIPTION_ROOT_RULES)
    )


def topic_status() -> str:
    from dbq.api import crd
    from dbq.api.topics import TopicStatus

    return schema_table(crd.status_schema(TopicStatus), "status", with_mutability=False)


def subscription_status() -> str:
    from dbq.api import crd
    from dbq.api.topics import SubscriptionStatus

    return schema_table(crd.status_schema(SubscriptionStatus), "status", with_mutability=False)


def queue_user_spec() -> str:
    from dbq.api import crd
    from dbq.api.access import QUEUE_USER_ROOT_RULES, QUEUE_USER_RULES, QueueUserSpec

    return (
        schema_table(crd.spec_schema(QueueUserSpec, QUEUE_USER_RULES), "spec")
        + "\nRules across fields, checked by the API server at admission (the message it returns):\n\n"
        + admission_rules(QUEUE_USER_RULES + QUEUE_USER_ROOT_RULES)
    )


def queue_user_status() -> str:
    from dbq.api import crd
    from dbq.api.access import QueueUserStatus

    return schema_table(crd.status_schema(QueueUserStatus), "status", with_mutability=False)


def queue_consumer_spec() -> str:
    from dbq.api import crd
    from dbq.api.consumers import QUEUE_CONSUMER_ROOT_RULES, QUEUE_CONSUMER_RULES, QueueConsumerSpec

    return (
        schema_table(crd.spec_schema(QueueConsumerSpec, QUEUE_CONSUMER_RULES), "spec")
        + "\nRules across fields, checked by the API server at admission (the message it returns):\n\n"
        + admission_rules(QUEUE_CONSUMER_RULES + QUEUE_CONSUMER_ROOT_RULES)
    )


def queue_consumer_status() -> str:
    from dbq.api import crd
    from dbq.api.consumers import QueueConsumerStatus

    return schema_table(crd.status_schema(QueueConsumerStatus), "status", with_mutability=False)


def rights() -> str:
    """Each right, the routines its group role may call (PostgreSQL) and the client calls they serve."""
    from dbq.contract.access import EVERY_RIGHT, RING_RIGHTS, TOPIC_ROUTINES

    rows = ["| Right | Routines (`<queue>_<verb>`) | Client calls |", "|---|---|---|"]
    calls = {
        "send": "push, push_many, defer (push with a delay); in SQL send, send_batch",
        "receive": "pop, pop_many, acquire, acquire_many, ack, ack_many, nack, extend, consume; waiting by"
        " LISTEN; in SQL read, and delete, archive, set_vt by id",
        "peek": "peek",
        "monitor": "stats, history; `dbq-stats`, the fleet-health job",
        "manage": "dead_letters, redrive, purge_dead_letters, archived, scavenge_archive, repair; `dbq-archive`",
    }
    for right, verbs in RING_RIGHTS.items():
        routines = ", ".join(f"`{v}`" for v in (*verbs, *EVERY_RIGHT))
        rows.append(f"| `{right}` | {routines} | {calls[str(right)]} |")
    topic = ", ".join(f"`<topic>_{v}`" for v in TOPIC_ROUTINES)
    rows.append(f"| `publish` | {topic} | Topic.publish, publish_many, publish_in |")
    return "\n".join(rows) + "\n"


def pipes_rights() -> str:
    """Each right on a pipes queue: the tables its Cassandra group role reads and writes, and the
    calls of other rights those whole-table grants allow too."""
    from dbq.contract.access import PIPES_ALSO, PIPES_TABLES
    from dbq.names import QueueNames

    names = QueueNames("ks", "queue")

    def table(name: str) -> str:
        if name in ("dead", "own_dead"):  # the keeper's (spec.deadLetter.queue), and the queue's own
            return "`<keeper>_dead`" if name == "dead" else "`<queue>_dead`"
        actual: str = getattr(names, name)
        return f"`{actual.replace('queue_', '<queue>_', 1)}`"

    def tables(listed: tuple[str, ...]) -> str:
        return ", ".join(table(t) for t in listed) or "none"

    rows = ["| Right | SELECT on | MODIFY on | Also allows |", "|---|---|---|---|"]
    for right, (reads, writes) in PIPES_TABLES.items():
        also = ", ".join(PIPES_ALSO[right]) or "nothing"
        rows.append(f"| `{right}` | {tables(reads)} | {tables(writes)} | {also} |")
    return "\n".join(rows) + "\n"


def _doc(cls: type) -> str:
    text = inspect.getdoc(cls) or ""
    own = cls.__dict__.get("__doc__")
    return _cell(text.split("\n\n")[0]) if own else ""


def error_reasons(module: ModuleType | None = None) -> str:
    """Every reason of the error family: what it means, what to do, and how Ready reports it."""
    from dbq import errors

    family: Any = module or errors
    classes: list[Any] = [
        c
        for c in vars(family).values()
        if isinstance(c, type) and issubclass(c, family.DbqError) and c.__module__ == family.__name__
    ]
    by_reason: dict[str, list[Any]] = {}
    for cls in dict.fromkeys(classes):  # definition order, aliases once
        by_reason.setdefault(cls.reason, []).append(cls)
    rows = [
        "| Reason | Raised as | Condition | Meaning | Fix |",
        "|---|---|---|---|---|",
    ]
    for reason, group in by_reason.items():
        names = ", ".join(f"`{c.__name__}`" for c in group)
        condition = "Reconciling (retried)" if all(c.retry for c in group) else "Stalled (needs a change)"
        meaning = " ".join(d for d in (_doc(c) for c in group) if d)
        fix = " ".join(_cell(c.__dict__["fix"]) for c in group if "fix" in c.__dict__)
        rows.append(f"| `{reason}` | {names} | {condition} | {meaning} | {fix} |")
    return "\n".join(rows) + "\n"


def metrics(collectors: Iterable[Any] | None = None) -> str:
    """Every Prometheus metric the operator serves, with its type and labels."""
    if collectors is None:
        from dbq.controller import metrics as module

        collectors = [
            v for v in vars(module).values() if hasattr(v, "describe") and hasattr(v, "_labelnames")
        ]
        collectors += [v for group in (module.STATS.values(), module.RATES) for v in group]
    rows = ["| Metric | Type | Labels | Meaning |", "|---|---|---|---|"]
    seen = set()
    for collector in collectors:
        for metric in collector.describe():
            name = metric.name + ("_total" if metric.type == "counter" else "")
            if name in seen:
                continue
            seen.add(name)
            labels = ", ".join(f"`{label}`" for label in collector._labelnames)
            rows.append(f"| `{name}` | {metric.type} | {labels} | {_cell(metric.documentation)} |")
    return "\n".join(rows) + "\n"


def helm_values(values_yaml: Path | None = None) -> str:
    return values_table((values_yaml or CHART / "values.yaml").read_text())


GENERATORS: dict[str, Callable[[], str]] = {
    "queue-spec": queue_spec,
    "queue-status": queue_status,
    "topic-spec": topic_spec,
    "topic-status": topic_status,
    "subscription-spec": subscription_spec,
    "subscription-status": subscription_status,
    "queueuser-spec": queue_user_spec,
    "queueuser-status": queue_user_status,
    "queueconsumer-spec": queue_consumer_spec,
    "queueconsumer-status": queue_consumer_status,
    "rights": rights,
    "pipes-rights": pipes_rights,
    "reasons": error_reasons,
    "metrics": metrics,
    "helm-values": helm_values,
}
