"""dbq's one error family. Every failure dbq reports is a `DbqError` with a `reason`.

The reason becomes a condition's reason and an Event's reason. `retry` says whether waiting can
heal the failure. Each backend translates its driver's errors into this family at its edge
(`dbq.connection.odbc.translate`, `dbq.connection.cassandra.translate`), so the controller, the
CLI and applications catch this one family. Messages name what to fix and never carry
credentials.
"""

from __future__ import annotations

from typing import Any


class DbqError(Exception):
    """Base of every error dbq raises."""

    reason = "Error"
    retry = True


# The name applications catch: `from dbq.client import QueueError`.
QueueError = DbqError


# --- configuration: the spec, the Secret, names -----------------------------------------------
class InvalidSpec(DbqError):
    reason = "InvalidSpec"
    retry = False


class ConflictingObjects(DbqError):
    """The database holds objects by our names that do not match the spec (e.g. another ring size)."""

    reason = "ConflictingObjects"
    retry = False


class BrokerNotUnique(DbqError):
    """SQL Server: the database's broker GUID is another database's too (a restored copy), so
    Service Broker cannot be enabled until a DBA (or dbq, when the spec opts in) runs NEW_BROKER."""

    reason = "BrokerNotUnique"
    retry = False


class DeadLetterQueueNotFound(DbqError):
    """spec.deadLetter.queue names a Queue that does not exist (yet: retried) or is invalid."""

    reason = "DeadLetterQueueNotFound"


class SecretNotFound(DbqError):
    reason = "SecretNotFound"


class InvalidSecret(DbqError):
    reason = "InvalidSecret"


class InvalidConnection(DbqError, ValueError):
    """A connection URL or Secret is incomplete or malformed; the message names the key to fix."""

    reason = "InvalidSecret"
    retry = False


class UnsafeName(DbqError, ValueError):
    """A name that is not a safe identifier: it never reaches SQL or CQL text."""

    reason = "InvalidSpec"
    retry = False


class KubernetesUnavailable(DbqError):
    """The Kubernetes API refused or failed a request (other than a 404)."""

    reason = "KubernetesUnavailable"


# --- the database --------------------------------------------------------------------------
class DatabaseError(DbqError):
    """The database failed a request; the message has no credentials."""

    reason = "DatabaseError"


# The name applications catch for any database failure.
QueueUnavailable = DatabaseError


class DatabaseUnreachable(DatabaseError):
    reason = "DatabaseUnreachable"


class AuthenticationFailed(DatabaseError):
    reason = "AuthenticationFailed"


# --- queue semantics -------------------------------------------------------------------------
class QueueNotFound(DbqError):
    """The queue's objects are not in the database (not provisioned, or another schema)."""

    reason = "QueueNotFound"


class QueueFull(DbqError):
    """The queue stayed full for the whole push timeout.

    `ids` is aligned with the bodies given: the id of each stored message, None where not stored.
    """

    reason = "QueueFull"

    def __init__(self, message: str, ids: list[Any] | None = None) -> None:
        super().__init__(message)
        self.ids = ids or []


class MessageTooLarge(DbqError):
    """A body is larger than the queue accepts (spec.ring.messageBytes); nothing was stored."""

    reason = "MessageTooLarge"
    retry = False


class LeaseLost(DbqError):
    """ack/nack found no lease: it expired (its visibility timeout passed, whether or not a
    repair has run since), so the message is or will be delivered again; or the message was
    acknowledged already. Either way the call changed nothing.

    `messages` are the ones whose lease was lost (for ack_many, the others were acknowledged).
    """

    reason = "LeaseLost"

    def __init__(self, message: str, messages: list[Any] | None = None) -> None:
        super().__init__(message)
        self.messages = messages or []

    @classmethod
    def of_acks(cls, lost: list[Any], total: int) -> LeaseLost:
        return cls(
            f"{len(lost)} of {total} acks found no lease: it expired, and the message is delivered again,"
            " or the message was acknowledged already (raise spec.timeouts.visibility if work takes longer)",
            lost,
        )

    @classmethod
    def of_nack(cls, message: Any) -> LeaseLost:
        return cls(
            f"message {message.id}: nack found no lease: it expired, and the message is delivered again,"
            " or the message was acknowledged already",
            [message],
        )
