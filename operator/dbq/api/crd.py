"""Generates the Queue CRD from the pydantic models (`dbq crd`, `crds/queue.yaml`).

Pydantic's JSON Schema is turned into a Kubernetes structural schema: references inlined,
optional fields unwrapped, titles dropped, CEL rules (`x-kubernetes-validations`) kept.
"""

from __future__ import annotations

from typing import Any

import yaml

from dbq.api.models import GROUP, KIND, PLURAL, ROOT_RULES, SPEC_RULES, VERSION, QueueSpec
from dbq.api.status import QueueStatus

_KEEP = {
    "type", "properties", "required", "items", "enum", "default", "description", "pattern",
    "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "additionalProperties",
    "format", "nullable",
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
    if "anyOf" in node:  # Optional[X]: X | null -> X (absent means default)
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


def _schema(model: type[QueueSpec] | type[QueueStatus], mode: str) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode=mode)  # type: ignore[arg-type]
    defs = raw.pop("$defs", {})
    return dict(_structural(raw, defs, objects_default=model is QueueSpec))


def spec_schema() -> dict[str, Any]:
    schema = _schema(QueueSpec, "validation")
    schema["x-kubernetes-validations"] = SPEC_RULES
    return schema


def status_schema() -> dict[str, Any]:
    """What the controller writes (`QueueStatus`). Unknown fields are kept, not pruned: kopf may
    keep its own bookkeeping there."""
    schema = _schema(QueueStatus, "serialization")
    schema["x-kubernetes-preserve-unknown-fields"] = True
    # A Queue the operator has not seen yet reads as generation 0 observed: kstatus (Flux's
    # health check, kpt) then waits for it, instead of taking a resource without status as
    # reconciled. The API server fills the default in whenever the Queue is read.
    schema["default"] = {"observedGeneration": 0}
    return schema


def crd() -> dict[str, Any]:
    ready = '.status.conditions[?(@.type=="Ready")].status'
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": KIND.lower(),
                "kind": KIND,
                "listKind": f"{KIND}List",
                "shortNames": ["dbq"],
                "categories": ["all", "dbq"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Backend", "type": "string", "jsonPath": ".spec.backend"},
                        {"name": "Design", "type": "string", "jsonPath": ".spec.design"},
                        {"name": "Ready", "type": "string", "jsonPath": ready},
                        {"name": "Depth", "type": "integer", "jsonPath": ".status.stats.depth"},
                        {"name": "Push/s", "type": "number", "jsonPath": ".status.stats.pushRate"},
                        {"name": "Pop/s", "type": "number", "jsonPath": ".status.stats.popRate"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A database-backed message queue managed by dbq.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                            "x-kubernetes-validations": ROOT_RULES,
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `dbq crd` from dbq.api.models; do not edit. A test fails when it is stale.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)
