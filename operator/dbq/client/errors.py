"""Errors of the data plane client. Each message names what to change."""

from __future__ import annotations

from typing import Any


class QueueError(Exception):
    """Base class of every error the client raises."""


class QueueNotFound(QueueError):
    """The queue's objects are not in the database (not provisioned, or another schema)."""


class QueueFull(QueueError):
    """The ring stayed full for the whole push timeout.

    `ids` is aligned with the bodies given: the id of each stored message, None where not stored.
    """

    def __init__(self, message: str, ids: list[int | None] | None = None) -> None:
        super().__init__(message)
        self.ids = ids or []


class MessageTooLarge(QueueError):
    """A body is larger than the ring's slots (spec.ring.messageBytes); nothing was stored."""


class LeaseLost(QueueError):
    """ack/nack came after the lease expired: the message is (or will be) delivered again.

    `messages` are the ones whose lease was lost (for ack_many, the others were acknowledged).
    """

    def __init__(self, message: str, messages: list[Any] | None = None) -> None:
        super().__init__(message)
        self.messages = messages or []


class QueueUnavailable(QueueError):
    """The database could not be reached or refused the client; the message has no credentials."""
