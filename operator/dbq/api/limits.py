"""The largest body of a message on each design (spec.messages.maxBytes): the API's admission
rules, the planners and the clients read them from here."""

from __future__ import annotations

# A ring: the default and the most; past ring.messageBytes a body waits beside the ring, in the
# content table.
DEFAULT_MAX_BODY_BYTES = 1 << 20
MAX_RING_BODY_BYTES = 64 << 20
# Pipes: the most a body holds, and a body and its headers together: a nack, a rollback, a dead
# letter or a redrive moves a message between partitions in one logged batch, which Cassandra
# refuses past batch_size_fail_threshold (50 KiB by default).
MAX_PIPES_BODY_BYTES = 32 << 10
MAX_PIPES_MESSAGE_BYTES = 48 << 10
