"""The largest body of a message on each design (spec.messages.maxBytes), and what a header
name may be: the API's admission rules, the planners and the clients read them from here."""

from __future__ import annotations

import re

# A header name: printable ASCII without spaces, quotes, backslashes or control characters.
MAX_KEY_LENGTH = 128
KEY_PATTERN = re.compile(r"^[!#-\[\]-~]{1,128}$")
KEY_HINT = "printable ASCII without spaces, quotes or backslashes, 1 to 128 characters"
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f]")  # control characters a value may not hold (a tab may)

# A ring: the default and the most; past ring.messageBytes a body waits beside the ring, in the
# content table.
DEFAULT_MAX_BODY_BYTES = 1 << 20
MAX_RING_BODY_BYTES = 64 << 20
# Pipes: a body past INLINE_BODY_BYTES (dbq.contract.pipes) is stored in chunks beside the pipes,
# and the most is 8 MiB: a Spark job stages a pipes queue's messages in blocks, one Cassandra
# mutation each, which Cassandra refuses past 16 MiB (half its commit log segment). Headers stay
# in the message's row, which moves between partitions in logged batches that Cassandra refuses
# past batch_size_fail_threshold (50 KiB by default): a pipes message holds at most 16 KiB of them.
MAX_PIPES_BODY_BYTES = 8 << 20
MAX_PIPES_HEADER_BYTES = 16 << 10
