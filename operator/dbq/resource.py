"""A Queue resource's spec and Secret, turned into what a backend or client needs.

No Kubernetes client here: callers pass a Secret reader (the operator reads through the API,
`dbq apply` from a file, the data plane client through the user's kubeconfig), so every path
reports a bad spec or a missing Secret with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from dbq.api.access import secret_name
from dbq.api.models import QueueSpec, queue_name
from dbq.api.topics import TopicSpec
from dbq.connection import ConnectionSettings, from_secret_data
from dbq.errors import DeadLetterQueueNotFound, InvalidConnection, InvalidSecret, InvalidSpec, SecretNotFound
from dbq.names import QueueNames

# (namespace, name) -> the Secret's base64 `data`, or None when it does not exist.
SecretReader = Callable[[str, str], dict[str, Any] | None]
# (namespace, name) -> the Queue resource (a dict with its `spec`), or None when it does not exist.
QueueReader = Callable[[str, str], Mapping[str, Any] | None]


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


def settings_for(
    spec: QueueSpec | TopicSpec, namespace: str, read_secret: SecretReader, user: str | None = None
) -> ConnectionSettings:
    """The connection a Queue's (or Topic's) spec names, from its Secret; with `user`, the
    connection of that QueueUser's login instead, from the Secret the operator wrote for it."""
    ref = secret_name(user) if user else spec.connection.secret_ref.name
    secret = read_secret(namespace, ref)
    if secret is None and user:
        raise SecretNotFound(
            f"Secret {namespace}/{ref} of QueueUser {user} not found: is the QueueUser there and Ready"
            " (`kubectl get queueusers`)?"
        )
    if secret is None:
        raise SecretNotFound(f"Secret {namespace}/{ref} not found: create it with a `url` key (see examples)")
    try:
        return from_secret_data(secret, str(spec.backend))
    except InvalidConnection as e:
        raise InvalidSecret(f"Secret {namespace}/{ref}: {e}") from None


def dead_letter_keeper(
    name: str, namespace: str, spec: QueueSpec, read_queue: QueueReader
) -> QueueNames | None:
    """The names of the queue whose dead-letter table keeps this queue's dead letters, when
    spec.deadLetter.queue names another Queue; None for the queue's own table. That Queue must
    have the same backend, design and Secret: a message moves there in the transaction (ring) or
    logged batch (pipes) that takes it off this queue."""
    keeper = spec.dead_letter.queue if spec.dead_letter else None
    if keeper is None:
        return None
    field, secret = "spec.deadLetter.queue", spec.connection.secret_ref.name
    if keeper == name:
        raise InvalidSpec(
            f"{field} names this Queue itself: remove it to keep dead letters in the queue's own table"
        )
    found = read_queue(namespace, keeper)
    if found is None:
        raise DeadLetterQueueNotFound(
            f"{field}: there is no Queue {namespace}/{keeper}: create it ({spec.design} on {spec.backend},"
            f" Secret {secret}) or remove the field"
        )
    try:
        other = parse_spec(found.get("spec") or {})
        other_queue = queue_name(keeper, other)
    except (InvalidSpec, ValueError) as e:
        raise DeadLetterQueueNotFound(
            f"{field}: Queue {namespace}/{keeper} has an invalid spec: {e}"
        ) from None
    differs = [
        f"{what} {theirs} (this queue: {ours})"
        for what, ours, theirs in (
            ("backend", spec.backend, other.backend),
            ("design", spec.design, other.design),
            ("Secret", secret, other.connection.secret_ref.name),
        )
        if ours != theirs
    ]
    if differs:
        raise InvalidSpec(
            f"{field}: Queue {keeper} has {', '.join(differs)}; a dead-letter queue must have this queue's"
            " backend, design and Secret (one database), so a message moves in one transaction: name such a"
            " Queue, or remove the field to use the queue's own table"
        )
    onward = other.dead_letter.queue if other.dead_letter else None
    if onward:
        raise InvalidSpec(
            f"{field}: Queue {keeper} sends its own dead letters on to Queue {onward} (its spec.deadLetter.queue):"
            f" a Queue that keeps dead letters must keep its own, so no chain or cycle forms ({name} -> {keeper}"
            f" -> {onward}): name another Queue here, or remove spec.deadLetter.queue from {keeper}"
        )
    return QueueNames(schema=other.connection.schema_, queue=other_queue)
