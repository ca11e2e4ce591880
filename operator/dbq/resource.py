"""A Queue resource's spec and Secret, turned into what a backend or client needs.

No Kubernetes client here: callers pass a Secret reader (the operator reads through the API,
`dbq apply` from a file, the data plane client through the user's kubeconfig), so every path
reports a bad spec or a missing Secret with the same message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from dbq.api.models import QueueSpec
from dbq.connection import ConnectionSettings, from_secret_data
from dbq.errors import InvalidConnection, InvalidSecret, InvalidSpec, SecretNotFound

# (namespace, name) -> the Secret's base64 `data`, or None when it does not exist.
SecretReader = Callable[[str, str], dict[str, Any] | None]


def validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = "spec." + ".".join(str(p) for p in err["loc"]) if err["loc"] else "spec"
        parts.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_spec(raw: dict[str, Any]) -> QueueSpec:
    try:
        return QueueSpec.model_validate(raw)
    except ValidationError as e:
        raise InvalidSpec(validation_message(e)) from None


def settings_for(spec: QueueSpec, namespace: str, read_secret: SecretReader) -> ConnectionSettings:
    ref = spec.connection.secret_ref.name
    secret = read_secret(namespace, ref)
    if secret is None:
        raise SecretNotFound(f"Secret {namespace}/{ref} not found: create it with a `url` key (see examples)")
    try:
        return from_secret_data(secret, str(spec.backend))
    except InvalidConnection as e:
        raise InvalidSecret(f"Secret {namespace}/{ref}: {e}") from None
