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
    """Base of every error dbq raises.

    `fix` says what a user does about it; the docs' reference of reasons is generated from the
    docstrings and `fix` of the classes below.
    """

    reason = "Error"
    retry = True
    fix = ""


# The name applications catch: `from dbq.client import QueueError`.
QueueError = DbqError


# --- configuration: the spec, the Secret, names -----------------------------------------------
class InvalidSpec(DbqError):
    """The spec asks for something dbq cannot do (a combination admission cannot check, such as a
    dead-letter queue on another database)."""

    reason = "InvalidSpec"
    retry = False
    fix = "Change the field the message names; the Queue heals on the next generation."


class ConflictingObjects(DbqError):
    """The database holds objects by our names that do not match the spec (e.g. another ring size)."""

    reason = "ConflictingObjects"
    retry = False
    fix = (
        "Use another spec.queueName or spec.connection.schema, or drop the objects the message lists"
        " if nothing uses them."
    )


class BrokerNotUnique(DbqError):
    """SQL Server: the database's broker GUID is another database's too (a restored copy), so
    Service Broker cannot be enabled until a DBA (or dbq, when the spec opts in) runs NEW_BROKER."""

    reason = "BrokerNotUnique"
    retry = False
    fix = (
        "Run the ALTER DATABASE ... SET NEW_BROKER the message gives, or set"
        " spec.serviceBroker.newBroker: true to let dbq run it."
    )


class ActivationProcedureMissing(DbqError):
    """spec.serviceBroker.activation names a procedure that does not exist in the queue's schema:
    SQL Server refuses a queue whose activation names a missing procedure, so nothing is made."""

    reason = "ActivationProcedureMissing"
    fix = "Create the procedure in the queue's schema (dbq retries), or fix its name in spec.serviceBroker.activation."


class DeadLetterQueueNotFound(DbqError):
    """spec.deadLetter.queue names a Queue that does not exist (yet: retried) or is invalid."""

    reason = "DeadLetterQueueNotFound"
    fix = "Create the Queue spec.deadLetter.queue names (same namespace, backend, design and Secret), or fix the name."


class SecretNotFound(DbqError):
    """The Secret spec.connection.secretRef names does not exist in the Queue's namespace."""

    reason = "SecretNotFound"
    fix = (
        "Create the Secret (key `url`, or host/port/database/username/password); it is read on the next tick."
    )


class InvalidSecret(DbqError):
    """The Secret exists but lacks a key dbq needs or holds one it cannot read."""

    reason = "InvalidSecret"
    fix = "Set the key the message names in the Secret."


class InvalidConnection(DbqError, ValueError):
    """A connection URL or Secret is incomplete or malformed; the message names the key to fix."""

    reason = "InvalidSecret"
    retry = False
    fix = "Correct the URL or Secret key the message names."


class UnsafeName(DbqError, ValueError):
    """A name that is not a safe identifier: it never reaches SQL or CQL text."""

    reason = "InvalidSpec"
    retry = False
    fix = "Use the name the message suggests: lower-case letters, digits and '_', starting with a letter."


class KubernetesUnavailable(DbqError):
    """The Kubernetes API refused or failed a request (other than a 404)."""

    reason = "KubernetesUnavailable"
    fix = "Check the API server and the operator's RBAC (the message gives the status code)."


# --- topics and subscriptions -----------------------------------------------------------------
class TopicNotFound(DbqError):
    """A Subscription names a Topic that does not exist in its namespace (yet: it binds once the
    Topic is made)."""

    reason = "TopicNotFound"
    fix = "Create the Topic spec.topic names, in the Subscription's namespace, or fix the name."


class QueueNotReady(DbqError):
    """A Queue a Topic routes to (a Subscription's, or spec.unroutedQueue) is not provisioned or not
    Ready: messages are not routed to it until it is."""

    reason = "QueueNotReady"
    fix = "Look at the Queue's own conditions (`kubectl describe queue NAME`); the Topic follows by itself."


class TopicInUse(DbqError):
    """A Topic with Subscriptions is being deleted: dropping its routine would end their copies."""

    reason = "TopicInUse"
    retry = False
    fix = "Delete its Subscriptions first, or annotate the Topic dbq.dev/force-delete=true."


# --- the database --------------------------------------------------------------------------
class DatabaseError(DbqError):
    """The database failed a request; the message has no credentials."""

    reason = "DatabaseError"
    fix = "Read the message (the database's own error); dbq retries."


# The name applications catch for any database failure.
QueueUnavailable = DatabaseError


class DatabaseUnreachable(DatabaseError):
    """No connection to the database: down, wrong host or port, or a network policy in the way."""

    reason = "DatabaseUnreachable"
    fix = (
        "Check the host and port in the Secret and that the database listens there; Ready returns by itself."
    )


class AuthenticationFailed(DatabaseError):
    """The database refused the Secret's credentials."""

    reason = "AuthenticationFailed"
    fix = "Put the right user and password in the Secret; a rotated password is read on the next tick."


class AccessHelperMissing(DatabaseError):
    """PostgreSQL: dbq's role helper (the functions through which the operator makes and drops
    its roles, without CREATEROLE) is not installed in the database, and the operator's login is
    not a superuser that could install it."""

    reason = "AccessHelperMissing"
    retry = True
    fix = "A DBA runs `dbq access install-sql --operator LOGIN | psql -d DATABASE` as a superuser, once per database."


# --- who may do what ---------------------------------------------------------------------------
class PermissionDenied(DbqError):
    """The login lacks the right a call needs on the queue or topic (a QueueUser's spec does not
    give it); the call changed nothing. `queue` and `right` name them."""

    reason = "PermissionDenied"
    retry = False
    fix = "Give the QueueUser the right the message names on that queue (spec.queues[].rights), or use one that has it."

    def __init__(self, message: str, queue: str = "", right: str = "") -> None:
        super().__init__(message)
        self.queue = queue
        self.right = right

    @classmethod
    def lacking(
        cls, endpoint: str, username: str, queue: str, right: str, said: str = ""
    ) -> PermissionDenied:
        """The refusal of a call that needs `right` ('' when any right would do) on `queue`;
        `said`: the database's own words, when they add what was refused."""
        needs = f"the {right} right" if right else "any right"
        return cls(
            f"{endpoint}: user {username!r} lacks {needs} on {queue}: give it to its QueueUser"
            " (spec.queues[].rights, or spec.topics[].rights), or connect as one that has it"
            + (f" ({said})" if said else ""),
            queue,
            right,
        )


class InvalidQueueUser(DbqError):
    """A QueueUser names something it cannot have: a Queue or Topic that is not in its namespace,
    a design without rights (Service Broker, for now), queues on two databases, or a Cassandra
    cluster without authorization."""

    reason = "InvalidQueueUser"
    retry = False
    fix = "Change the field the message names; the QueueUser heals on the next generation."


# --- autoscaling: QueueConsumers and KEDA ------------------------------------------------------
class InvalidQueueConsumer(DbqError):
    """A QueueConsumer asks for scaling dbq cannot give: queues on two databases, a queue KEDA's
    postgresql scaler cannot read (SQL Server, Cassandra, Service Broker), or a name another
    object of the namespace already holds."""

    reason = "InvalidQueueConsumer"
    retry = False
    fix = "Change the field the message names; the QueueConsumer heals on the next generation."


class KedaNotInstalled(DbqError):
    """The cluster serves no `scaledobjects.keda.sh`: KEDA is not installed, so nothing is scaled."""

    reason = "KedaNotInstalled"
    fix = "Install KEDA (the suite runs 2.21); the operator writes the ScaledObject once KEDA is served."


class WorkloadNotFound(DbqError):
    """spec.workload names a Deployment or StatefulSet that does not exist (yet: retried); nothing is scaled."""

    reason = "WorkloadNotFound"
    fix = "Create the workload, or fix spec.workload."


class WorkloadTaken(DbqError):
    """Another ScaledObject, one the operator did not write, already scales spec.workload: KEDA
    allows one a workload."""

    reason = "WorkloadTaken"
    fix = (
        "Delete the ScaledObject the message names (the QueueConsumer replaces it), or name another workload."
    )


class NoQueueReady(DbqError):
    """None of the Queues spec.queues names exists and is Ready: the operator removed the
    ScaledObject, and the workload keeps the replicas it has."""

    reason = "NoQueueReady"
    fix = "Create the Queues (or wait for them to be Ready), or fix spec.queues."


# --- queue semantics -------------------------------------------------------------------------
class QueueNotFound(DbqError):
    """The queue's objects are not in the database (not provisioned, or another schema)."""

    reason = "QueueNotFound"
    fix = "Check the queue name and schema (or keyspace), and that its Queue is Ready."


class ResizeWaiting(DbqError):
    """A resize's switch could not take the fence pushes hold while they draw a position: a
    push stayed inside its transaction (a client that pushes and then works before it commits).
    Nothing changed; the switch is tried again."""

    reason = "ResizeWaiting"
    fix = "Nothing to do: it is retried. Clients that push inside a long transaction delay it: commit sooner."


class QueueFull(DbqError):
    """The queue stayed full for the whole push timeout.

    `ids` is aligned with the bodies given: the id of each stored message, None where not stored.
    """

    reason = "QueueFull"
    fix = "Add consumers, raise spec.ring.size (a resize online, on PostgreSQL), or push with a longer wait."

    def __init__(self, message: str, ids: list[Any] | None = None) -> None:
        super().__init__(message)
        self.ids = ids or []


class MessageTooLarge(DbqError):
    """A body is larger than the queue accepts (spec.messages.maxBytes); nothing was stored."""

    reason = "MessageTooLarge"
    retry = False
    fix = "Send a smaller body, or raise the Queue's spec.messages.maxBytes."


class LeaseLost(DbqError):
    """ack/nack found no lease: it expired (its visibility timeout passed, whether or not a
    repair has run since), so the message is or will be delivered again; or the message was
    acknowledged already. Either way the call changed nothing.

    `messages` are the ones whose lease was lost (for ack_many, the others were acknowledged).
    """

    reason = "LeaseLost"
    fix = "Raise the visibility (spec.timeouts.visibility or the call's own), or extend() long work."

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
