"""Generates the CRDs from the pydantic models (`dbq crd`, `crds/*.yaml`): Queue, Topic,
Subscription, QueueUser and QueueConsumer.

Pydantic's JSON Schema is turned into a Kubernetes structural schema: references inlined,
optional fields unwrapped, titles dropped, CEL rules (`x-kubernetes-validations`) kept.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from dbq.api.access import (
    QUEUE_USER_KIND,
    QUEUE_USER_PLURAL,
    QUEUE_USER_ROOT_RULES,
    QUEUE_USER_RULES,
    QueueUserSpec,
    QueueUserStatus,
)
from dbq.api.consumers import (
    QUEUE_CONSUMER_KIND,
    QUEUE_CONSUMER_PLURAL,
    QUEUE_CONSUMER_ROOT_RULES,
    QUEUE_CONSUMER_RULES,
    QueueConsumerSpec,
    QueueConsumerStatus,
)
from dbq.api.models import GROUP, KIND, PLURAL, ROOT_RULES, SPEC_RULES, VERSION, QueueSpec
from dbq.api.status import QueueStatus
from dbq.api.topics import (
    SUBSCRIPTION_KIND,
    SUBSCRIPTION_PLURAL,
    SUBSCRIPTION_ROOT_RULES,
    TOPIC_KIND,
    TOPIC_PLURAL,
    TOPIC_ROOT_RULES,
    TOPIC_RULES,
    SubscriptionSpec,
    SubscriptionStatus,
    TopicSpec,
    TopicStatus,
)

_KEEP = {
    "type", "properties", "required", "items", "enum", "default", "description", "pattern",
    "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "additionalProperties",
    "format", "nullable", "anyOf",
}  # fmt: skip


# Settings of one design: not defaulted, or every queue would show the other designs' settings.
DESIGN_SECTIONS = ("ring", "pipes", "serviceBroker")


def _structural(node: Any, defs: dict[str, Any], objects_default: bool = True) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs, objects_default) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs, objects_default)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):  # Optional[X]: X | null -> X
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union {node['anyOf']} in a structural schema")
        merged = {**options[0], **{k: v for k, v in node.items() if k != "anyOf"}}
        return _structural(merged, defs, objects_default)
    if "allOf" in node and len(node["allOf"]) == 1:
        merged = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        return _structural(merged, defs, objects_default)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _structural(v, defs, objects_default) for name, v in value.items()}
        elif key.startswith("x-kubernetes-"):
            out[key] = value
        elif key in _KEEP:
            out[key] = _structural(value, defs, objects_default)
    if out.get("default") is None:
        out.pop("default", None)
    if out.get("additionalProperties") is False:  # structural schemas prune unknown fields instead
        del out["additionalProperties"]
    if out.get("x-kubernetes-preserve-unknown-fields") and out.get("additionalProperties") is True:
        del out["additionalProperties"]  # a free-form object (a Job's spec): kept whole, not pruned
    # An optional object whose fields all have defaults defaults to {}, so the API server fills in
    # (and `kubectl get -o yaml` shows) the effective settings. (Not in status: what is absent
    # there has not happened yet.)
    for name, prop in out.get("properties", {}).items() if objects_default else ():
        if name in DESIGN_SECTIONS:
            continue
        optional = name not in out.get("required", [])
        if prop.get("type") == "object" and "properties" in prop and optional and not prop.get("required"):
            prop.setdefault("default", {})
    if "const" in node:
        out["enum"] = [node["const"]]
    return out


def _schema(model: type[BaseModel], mode: str) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode=mode)  # type: ignore[arg-type]
    defs = raw.pop("$defs", {})
    return dict(_structural(raw, defs, objects_default=mode == "validation"))


def spec_schema(
    model: type[BaseModel] = QueueSpec, rules: list[dict[str, str]] = SPEC_RULES
) -> dict[str, Any]:
    schema = _schema(model, "validation")
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def status_schema(model: type[BaseModel] = QueueStatus) -> dict[str, Any]:
    """What the controller writes. Unknown fields are kept, not pruned: kopf may keep its own
    bookkeeping there."""
    schema = _schema(model, "serialization")
    schema["x-kubernetes-preserve-unknown-fields"] = True
    # A resource the operator has not seen yet reads as generation 0 observed: kstatus (Flux's
    # health check, kpt) then waits for it, instead of taking a resource without status as
    # reconciled. The API server fills the default in whenever the resource is read.
    schema["default"] = {"observedGeneration": 0}
    return schema


READY_COLUMN = {
    "name": "Ready",
    "type": "string",
    "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
}
# The Queues that keep their dead letters in Queue Q's table: a list with the field selector
# `spec.deadLetter.queue=Q`.
DEAD_LETTER_QUEUE_FIELD = ".spec.deadLetter.queue"
# The Queue a Subscription routes to, and the Queue a Topic sends what no Subscription takes to:
# a Queue's deletion asks the API server for the Topics that route to it by these.
SUBSCRIPTION_QUEUE_FIELD = ".spec.queue"
UNROUTED_QUEUE_FIELD = ".spec.unroutedQueue"


def field_selector(field: str, value: str) -> str:
    """A fieldSelector on one of these selectable fields: its objects whose field is `value`."""
    return f"{field.lstrip('.')}={value}"


AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _definition(kind: str, plural: str, short_names: list[str], description: str, spec: dict[str, Any],
                status: dict[str, Any], columns: list[dict[str, str]], root_rules: list[dict[str, str]],
                categories: tuple[str, ...] = ("all",), selectable: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "listKind": f"{kind}List",
                "shortNames": short_names,
                "categories": list(categories),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [*columns, AGE_COLUMN],
                    # Fields a list may select on, answered by the API server from its cache.
                    **({"selectableFields": [{"jsonPath": p} for p in selectable]} if selectable else {}),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                            "x-kubernetes-validations": root_rules,
                        }
                    },
                }
            ],
        },
    }


def crd() -> dict[str, Any]:
    """The Queue CRD."""
    return _definition(
        KIND, PLURAL, ["dbq"], "A database-backed message queue managed by dbq.", spec_schema(), status_schema(),
        [
            {"name": "Backend", "type": "string", "jsonPath": ".spec.backend"},
            {"name": "Design", "type": "string", "jsonPath": ".spec.design"},
            READY_COLUMN,
            {"name": "Depth", "type": "integer", "jsonPath": ".status.stats.depth"},
            {"name": "Push/s", "type": "number", "jsonPath": ".status.stats.pushRate"},
            {"name": "Pop/s", "type": "number", "jsonPath": ".status.stats.popRate"},
        ],
        ROOT_RULES,
        # `kubectl get dbq NAME` names one Queue: the category holds no other kind.
        categories=("all", "dbq"),
        selectable=(DEAD_LETTER_QUEUE_FIELD,),
    )  # fmt: skip


def topic_crd() -> dict[str, Any]:
    return _definition(
        TOPIC_KIND, TOPIC_PLURAL, ["dbqtopic"],
        "A topic: a message published to it goes, in one transaction, to the Queue of every Subscription whose"
        " filter matches it.",
        spec_schema(TopicSpec, TOPIC_RULES), status_schema(TopicStatus),
        [
            {"name": "Backend", "type": "string", "jsonPath": ".spec.backend"},
            READY_COLUMN,
            {"name": "Subscriptions", "type": "integer", "jsonPath": ".status.subscriptions"},
            {"name": "Published", "type": "integer", "jsonPath": ".status.published"},
            {"name": "Unrouted", "type": "integer", "jsonPath": ".status.unrouted"},
        ],
        TOPIC_ROOT_RULES,
        selectable=(UNROUTED_QUEUE_FIELD,),
    )  # fmt: skip


def subscription_crd() -> dict[str, Any]:
    return _definition(
        SUBSCRIPTION_KIND, SUBSCRIPTION_PLURAL, ["dbqsub"],
        "A subscription: binds a Topic to a Queue of the same database, with a filter on subject and headers.",
        spec_schema(SubscriptionSpec, []), status_schema(SubscriptionStatus),
        [
            {"name": "Topic", "type": "string", "jsonPath": ".spec.topic"},
            {"name": "Queue", "type": "string", "jsonPath": ".spec.queue"},
            READY_COLUMN,
            {"name": "Routed", "type": "integer", "jsonPath": ".status.routed"},
            {"name": "Dropped", "type": "integer", "jsonPath": ".status.dropped"},
        ],
        SUBSCRIPTION_ROOT_RULES,
        selectable=(SUBSCRIPTION_QUEUE_FIELD,),
    )  # fmt: skip


def queue_user_crd() -> dict[str, Any]:
    return _definition(
        QUEUE_USER_KIND, QUEUE_USER_PLURAL, ["dbquser"],
        "Who may do what: a database login with a generated password, given rights (send, receive, peek,"
        " monitor, manage, publish) on Queues and Topics of its namespace, and a Secret its applications use.",
        spec_schema(QueueUserSpec, QUEUE_USER_RULES), status_schema(QueueUserStatus),
        [
            {"name": "Login", "type": "string", "jsonPath": ".status.login"},
            READY_COLUMN,
            {"name": "Secret", "type": "string", "jsonPath": ".status.secretName"},
            {"name": "Rotated", "type": "date", "jsonPath": ".status.rotatedAt"},
        ],
        QUEUE_USER_ROOT_RULES,
    )  # fmt: skip


def queue_consumer_crd() -> dict[str, Any]:
    return _definition(
        QUEUE_CONSUMER_KIND, QUEUE_CONSUMER_PLURAL, ["dbqconsumer"],
        "The consumers of some Queues, scaled with their backlog: the operator writes the KEDA ScaledObject,"
        " its TriggerAuthentication and a monitor-only QueueUser, and reports the scaling in status.",
        spec_schema(QueueConsumerSpec, QUEUE_CONSUMER_RULES), status_schema(QueueConsumerStatus),
        [
            {"name": "Workload", "type": "string", "jsonPath": ".spec.workload.name"},
            READY_COLUMN,
            {"name": "Active", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Active")].status'},
            {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
            {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
        ],
        QUEUE_CONSUMER_ROOT_RULES,
    )  # fmt: skip


# The file under crds/ of each CRD, and what makes it.
CRDS = {"queue": crd, "topic": topic_crd, "subscription": subscription_crd, "queueuser": queue_user_crd,
        "queueconsumer": queue_consumer_crd}  # fmt: skip


def crd_yaml(kind: str = "queue") -> str:
    header = "# Generated by `dbq crd` from dbq.api; do not edit. A test fails when it is stale.\n"
    return header + yaml.safe_dump(CRDS[kind](), sort_keys=False, width=120)
