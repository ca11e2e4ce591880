"""Client of Cassandra "pipes" queues: the same operations as the ring, on a design without locks.

How it works (see `backends/cassandra/cql.py` for the tables), one module per part:
- `writing`: each pushing thread appends to a pipe of its own, one single-partition batch per
  push or batch, no read, no lock; a full or old pipe is finished and a new one opened.
- `leasing`: a popping thread leases one pipe at a time with a lightweight transaction (5 s,
  renewed while used), the oldest pipe with messages first: messages come out in push order per
  pipe, and pipes are served oldest first, so nothing starves ("mostly FIFO").
- `taking`: a take reads the leased pipe from its cursor and deletes what it read as one range
  behind the cursor, moving the counters (and, for acquire, copying the rows to `pending`) in
  one single-partition batch, so reads at the head never meet tombstones.
- `settling`: ack, nack, deferral, dead-lettering and the rollback of overdue pending messages.
- `repairing`: the operator's cleanup (vanished pushers, expired leases, due delayed messages,
  retiring drained pipes); `measuring`: statistics and history; `archive` and `dead_letters`.
- `queue`: `PipesQueue`, the public client over them; `session`: statements and batches.
- `publishing`: `PipesTopic`, a topic's publisher: each message's copies in one logged batch.

Semantics: pop is at-most-once; acquire/ack is at-least-once. Both rely on leases timed with
wall clocks: keep clocks within `SKEW_S` of each other (NTP), as Cassandra itself requires.
"""

from dbq.client.pipes.model import PipeMessage, PipesRepair, PipesStats, PipeStat
from dbq.client.pipes.publishing import PipesTopic
from dbq.client.pipes.queue import PipesQueue
from dbq.client.pipes.tuning import SKEW_S, now_ms, uuid_ms

__all__ = [
    "SKEW_S",
    "PipeMessage",
    "PipeStat",
    "PipesQueue",
    "PipesRepair",
    "PipesStats",
    "PipesTopic",
    "now_ms",
    "uuid_ms",
]
