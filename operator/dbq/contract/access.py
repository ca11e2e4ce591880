"""Who may do what: the rights a QueueUser is given on a queue or topic, and which routine each
right lets a login call (ring) or which tables it may read and write (pipes, on Cassandra).
Provisioning grants by it (one group role per right, holding EXECUTE on exactly these routines,
or SELECT and MODIFY on exactly these tables); the client names the missing right from it when
the database refuses a call.
"""

from __future__ import annotations

from dbq.api.access import QUEUE_RIGHTS, TOPIC_RIGHTS, Right

__all__ = [
    "EVERY_RIGHT",
    "PIPES_ALSO",
    "PIPES_TABLES",
    "QUEUE_RIGHTS",
    "RING_RIGHTS",
    "TOPIC_RIGHTS",
    "TOPIC_ROUTINES",
    "Right",
    "right_of",
]

# The ring's routines (PostgreSQL; SQL Server's procedures of the same verbs) by the right that
# may call them. `describe` (version, sizes and limits, read when a client connects) goes with
# every right; the routines not named here (place, body_of, oldest_age, the header helpers,
# check_send, push_array, expire_leases) are called only by the others, as their owner, and granted to no one.
RING_RIGHTS: dict[Right, tuple[str, ...]] = {
    Right.SEND: ("push", "push_many", "defer", "send", "send_batch"),
    Right.RECEIVE: (
        "take",
        "pop",
        "pop_many",
        "release",
        "ack",
        "ack_many",
        "nack",
        "extend",
        "wait",
        "read",
        "delete",
        "archive",
        "set_vt",
        "purge",
    ),
    Right.PEEK: ("peek",),
    Right.MONITOR: ("stats", "history"),
    Right.MANAGE: ("redrive", "purge_dead", "dead_letters", "archived", "repair", "void_holes", "scavenge"),
}
EVERY_RIGHT = ("describe",)
# A topic's publish routines.
TOPIC_ROUTINES = ("publish", "publish_many")

# The pipes design's tables each right reads (SELECT) and writes (MODIFY), by `QueueNames`
# property; "dead" is the dead table of the queue that keeps this queue's dead letters
# (spec.deadLetter.queue), "own_dead" the queue's own. Cassandra grants per table: a lightweight
# transaction needs both on its table, so whoever takes a lease writes the pipes' state; "meta"
# and "history" are shared by every queue of the keyspace.
_MESSAGES = ("pipes", "pipe_state", "waiting", "pending", "content")
PIPES_TABLES: dict[Right, tuple[tuple[str, ...], tuple[str, ...]]] = {
    Right.SEND: (("meta",), (*_MESSAGES, "delayed")),
    Right.RECEIVE: (("meta", *_MESSAGES, "staged"), (*_MESSAGES, "staged", "delayed", "archive", "dead")),
    Right.PEEK: (("meta", "pipes", "pipe_state", "waiting", "content"), ()),
    Right.MONITOR: (("meta", "history", "pipes", "pipe_state", "waiting", "pending", "delayed", "dead"), ()),
    Right.MANAGE: (
        ("meta", *_MESSAGES, "delayed", "archive", "dead", "own_dead"),
        ("meta", *_MESSAGES, "delayed", "archive", "dead", "own_dead"),
    ),
}
# The calls of other rights that a right's tables on a pipes queue allow too (PipesQueue methods):
# a receiver puts back what it nacks into a pipe, so it can push, and reads what it takes, so it
# can peek; a monitor counts waiting rows and dead letters, so it can read them; whoever manages
# rolls leases back and redrives dead letters, so it can push and take, and reads every table
# the statistics count. Each still needs its own right on the ring.
_TAKES = ("pop", "pop_many", "acquire", "acquire_many", "ack", "ack_many", "nack")
PIPES_ALSO: dict[Right, tuple[str, ...]] = {
    Right.SEND: (),
    Right.RECEIVE: ("push", "push_many", "peek"),
    Right.PEEK: (),
    Right.MONITOR: ("peek", "dead_letters"),
    Right.MANAGE: ("push", "push_many", *_TAKES, "peek", "stats"),
}

RIGHT_OF_VERB: dict[str, Right] = {verb: right for right, verbs in RING_RIGHTS.items() for verb in verbs}


def right_of(verb: str) -> Right | None:
    """The right that lets a login call routine `verb` (None for describe and internal ones)."""
    if verb in TOPIC_ROUTINES:
        return Right.PUBLISH
    return RIGHT_OF_VERB.get(verb)
