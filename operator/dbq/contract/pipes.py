"""The pipes design's data-plane contract: every CQL statement a client runs on a queue, and the
schema version. Provisioning (`dbq.backends.cassandra.cql`) creates the tables they run on.

Identifiers come from `QueueNames` (validated) and are double-quoted; every value is a bind
marker of a prepared statement. The tables are described in `dbq.backends.cassandra.cql`.
"""

from __future__ import annotations

import uuid

from dbq.names import QueueNames
from dbq.names import pg_quote as quote

# 2: dead letters (the dead table, meta.max_attempts), delayed delivery, archive (meta.archive_ttl_s)
# 3: dead letters kept by another queue (spec.deadLetter.queue: meta.dead_letter_queue, dead.source)
# 4: message headers (a headers column in the waiting, pending, delayed, dead and archive tables;
#    their limits in meta.header_bytes and meta.max_headers)
# 5: the largest body (spec.messages.maxBytes) in meta.max_body_bytes
# 6: bodies past INLINE_BODY_BYTES in chunks in the content table (the message row's body unset)
PIPES_SCHEMA_VERSION = 6
# What versions 2 to 5 added to the metadata table, with their types.
META_COLUMNS = {
    "max_attempts": "int",
    "archive_ttl_s": "int",
    "dead_letter_queue": "text",
    "header_bytes": "int",
    "max_headers": "int",
    "max_body_bytes": "int",
}
BUCKET = 0  # the pipes table's single partition
# A body up to this size is stored in its message's row; a larger one in chunks of CHUNK_BYTES in
# the content table, keyed by the message id, written before the row: a row whose body is unset
# (null) points there. An empty body is an empty blob, not a null.
INLINE_BODY_BYTES = 32 << 10
CHUNK_BYTES = 256 << 10
# The lease of a pending row that is no lease: it marks content on its way in (a push between its
# chunks and its row) or out (a message popped, expired or acked whose chunks are being deleted).
# Should its client die meanwhile, the row comes due at its deadline and repair deletes the
# content, then the row.
ENDING = uuid.UUID(int=0)


class PipesStatements:
    """The statements of one queue; attributes are CQL text ready to prepare."""

    def __init__(self, names: QueueNames, dead_letter_keeper: QueueNames | None = None) -> None:
        """`dead_letter_keeper`: the queue whose dead table keeps this queue's dead letters
        (spec.deadLetter.queue, in the same cluster); None: its own."""
        self.names = names
        ks = quote(names.schema)
        self.keyspace = ks
        self.meta = f"{ks}.{quote(names.meta)}"
        self.history = f"{ks}.{quote(names.history)}"
        self.pipes = f"{ks}.{quote(names.pipes)}"
        self.state = f"{ks}.{quote(names.pipe_state)}"
        self.waiting = f"{ks}.{quote(names.waiting)}"
        self.pending = f"{ks}.{quote(names.pending)}"
        self.staged = f"{ks}.{quote(names.staged)}"
        keeper = dead_letter_keeper or names
        self.dead = f"{quote(keeper.schema)}.{quote(keeper.dead)}"
        self.own_dead = f"{ks}.{quote(names.dead)}"
        self.delayed = f"{ks}.{quote(names.delayed)}"
        self.archive = f"{ks}.{quote(names.archive)}"
        self.content = f"{ks}.{quote(names.content)}"
        m, p, st, w, d = self.meta, self.pipes, self.state, self.waiting, self.pending
        counters = "pushed, requeued, popped, acquired, expired"

        # --- pusher --------------------------------------------------------------------------
        self.add_pipe = (
            f"INSERT INTO {p} (bucket, pipe, pusher, status, changed) VALUES ({BUCKET}, ?, ?, 'active', ?)"
        )
        # Rows that lightweight transactions change moments later (a pipe's lease, a pending
        # row's, a dead letter's or a delayed message's claim) are written timed a millisecond
        # back (`tuning.before_lwt`): those transactions write with whole-millisecond timestamps.
        self.open_pipe = (
            f"INSERT INTO {st} (pipe, pusher, created, finished, lease_until, {counters})"
            " VALUES (?, ?, ?, false, 0, 0, 0, 0, 0, 0) USING TIMESTAMP ?"
        )
        self.push = (
            f"INSERT INTO {w} (pipe, msg, id, body, attempts, expires, headers) VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self.count_pushes = f"UPDATE {st} SET pushed = ?, requeued = ? WHERE pipe = ?"
        self.finish_pipe = f"UPDATE {st} SET finished = true WHERE pipe = ?"
        self.set_status = f"UPDATE {p} SET status = ?, changed = ? WHERE bucket = {BUCKET} AND pipe = ?"

        # --- popper ----------------------------------------------------------------------------
        self.list_pipes = f"SELECT pipe, status FROM {p} WHERE bucket = {BUCKET} AND pipe > ?"
        self.list_all_pipes = f"SELECT pipe, status FROM {p} WHERE bucket = {BUCKET}"
        self.pipe_state = (
            "SELECT toUnixTimestamp(created), finished, owner, toUnixTimestamp(lease_until), cursor,"
            f" {counters} FROM {st} WHERE pipe = ?"
        )
        self.claim = f"UPDATE {st} SET owner = ?, lease_until = ? WHERE pipe = ? IF lease_until = ?"
        self.renew = f"UPDATE {st} SET lease_until = ? WHERE pipe = ? IF owner = ?"
        self.release = f"UPDATE {st} SET lease_until = 0 WHERE pipe = ? IF owner = ?"
        take_cols = "msg, id, body, attempts, toUnixTimestamp(expires), headers"
        self.read_after = f"SELECT {take_cols} FROM {w} WHERE pipe = ? AND msg > ? LIMIT ?"
        self.read_head = f"SELECT {take_cols} FROM {w} WHERE pipe = ? LIMIT ?"
        self.delete_after = f"DELETE FROM {w} WHERE pipe = ? AND msg > ? AND msg <= ?"
        self.delete_head = f"DELETE FROM {w} WHERE pipe = ? AND msg <= ?"
        self.count_takes = f"UPDATE {st} SET cursor = ?, popped = ?, acquired = ?, expired = ? WHERE pipe = ?"
        self.lease_message = (
            f"INSERT INTO {d} (pipe, msg, id, body, attempts, expires, deadline, lease, headers)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
        )

        # --- ack / nack / rollback ---------------------------------------------------------
        self.leases_of = f"SELECT msg, toUnixTimestamp(deadline), lease FROM {d} WHERE pipe = ? AND msg IN ?"
        self.ack = f"DELETE FROM {d} WHERE pipe = ? AND msg = ?"
        # The lease of a pending row changes hands only through these two lightweight
        # transactions, so an ack and a rollback (or nack) of one message never both succeed.
        self.settle = f"DELETE FROM {d} WHERE pipe = ? AND msg = ? IF lease = ?"
        self.take_over = f"UPDATE {d} SET lease = ?, deadline = ? WHERE pipe = ? AND msg = ? IF lease = ?"
        self.defer = f"UPDATE {d} SET deadline = ?, lease = ? WHERE pipe = ? AND msg = ? IF lease = ?"
        self.pending_of = (
            "SELECT msg, id, body, attempts, toUnixTimestamp(expires), toUnixTimestamp(deadline), lease, headers"
            f" FROM {d} WHERE pipe = ?"
        )
        # The leases of a pipe's pending rows: stats count those held by consumers (not ENDING).
        self.pending_leases = f"SELECT lease FROM {d} WHERE pipe = ?"
        # A pending row marking content on its way in or out (lease ENDING).
        self.mark_ending = (
            f"INSERT INTO {d} (pipe, msg, id, deadline, lease) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?"
        )
        # Content: a message's chunks (by its id; an archived message's by its archive key), and
        # their total size, so a reader knows it has them all.
        c = self.content
        self.put_chunk = f"INSERT INTO {c} (id, chunk, data, size) VALUES (?, ?, ?, ?)"
        self.put_chunk_for = f"INSERT INTO {c} (id, chunk, data, size) VALUES (?, ?, ?, ?) USING TTL ?"
        self.chunks = f"SELECT size, data FROM {c} WHERE id = ?"
        self.drop_content = f"DELETE FROM {c} WHERE id = ?"
        # Delayed messages: one partition, in due-time order; repair moves those due to a pipe.
        dy = self.delayed
        self.delay = (
            f"INSERT INTO {dy} (bucket, due, id, body, expires, moving_until, headers)"
            f" VALUES ({BUCKET}, ?, ?, ?, ?, 0, ?) USING TIMESTAMP ?"
        )
        self.due = (
            "SELECT toUnixTimestamp(due), id, body, toUnixTimestamp(expires), toUnixTimestamp(moving_until),"
            f" headers FROM {dy} WHERE bucket = {BUCKET} AND due <= ? LIMIT ?"
        )
        # A mover claims a due message first (one claim wins), as a rollback takes a lease over.
        self.claim_delayed = f"UPDATE {dy} SET moving_until = ? WHERE bucket = {BUCKET} AND due = ? AND id = ? IF moving_until < ?"
        self.undelay = f"DELETE FROM {dy} WHERE bucket = {BUCKET} AND due = ? AND id = ?"
        self.count_delayed = f"SELECT count(*) FROM {dy} WHERE bucket = {BUCKET}"
        # Archive: one partition per hour of ack, in ack order; each row lives for the retention.
        ar = self.archive
        self.keep = f"INSERT INTO {ar} (hour, acked, id, attempts, body, headers) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
        self.kept_since = f"SELECT acked, id, attempts, body, headers FROM {ar} WHERE hour = ? AND acked >= minTimeuuid(?) LIMIT ?"
        # Dead letters: one partition, in id (push) order; `source` is the queue each came from
        # (schema.queue), as a table may keep other queues' too. Filtering on it reads only the
        # one partition.
        dl = self.dead
        self.bury = (
            f"INSERT INTO {dl} (bucket, id, source, attempts, error, dead_at, body, moving_until, headers)"
            f" VALUES ({BUCKET}, ?, ?, ?, ?, ?, ?, 0, ?) USING TIMESTAMP ?"
        )
        dead_cols = "id, attempts, error, toUnixTimestamp(dead_at), body, toUnixTimestamp(moving_until), source, headers"
        self.dead_letters = (
            f"SELECT {dead_cols} FROM {dl} WHERE bucket = {BUCKET} AND source = ? LIMIT ? ALLOW FILTERING"
        )
        self.dead_letters_by_id = (
            f"SELECT {dead_cols} FROM {dl} WHERE bucket = {BUCKET} AND id IN ? AND source = ? ALLOW FILTERING"
        )
        self.held_dead_letters = f"SELECT {dead_cols} FROM {self.own_dead} WHERE bucket = {BUCKET} LIMIT ?"
        # A redrive claims a dead letter first (one claim wins), as a mover claims a due message.
        self.claim_dead = (
            f"UPDATE {dl} SET moving_until = ? WHERE bucket = {BUCKET} AND id = ? IF moving_until < ?"
        )
        self.unbury = f"DELETE FROM {dl} WHERE bucket = {BUCKET} AND id = ?"
        self.count_dead = f"SELECT count(*) FROM {dl} WHERE bucket = {BUCKET} AND source = ? ALLOW FILTERING"
        self.forget_dead_letters = f"DELETE FROM {dl} WHERE bucket = {BUCKET} AND id IN ?"
        self.head_id = f"SELECT id FROM {w} WHERE pipe = ? AND msg > ? LIMIT 1"
        self.head_id_first = f"SELECT id FROM {w} WHERE pipe = ? LIMIT 1"

        # --- queue row: settings, retirement, maintenance lock -----------------------------
        retired = ", ".join(f"retired_{c}" for c in (*counters.split(", "), "pipes"))
        self.read_meta = (
            f"SELECT design, schema_version, max_pushes_per_pipe, max_push_time_ms, watermark, {retired}"
            f" FROM {m} WHERE queue = ?"
        )
        # Read once the version is known to be this one (an older table lacks the columns).
        self.read_settings = f"SELECT {', '.join(META_COLUMNS)} FROM {m} WHERE queue = ?"
        self.retire = (
            f"UPDATE {m} SET watermark = ?, "
            + ", ".join(f"{c} = ?" for c in retired.split(", "))
            + " WHERE queue = ? IF watermark = ?"
        )
        self.drop_state = f"DELETE FROM {st} WHERE pipe = ?"
        self.drop_waiting = f"DELETE FROM {w} WHERE pipe = ?"
        self.drop_pending = f"DELETE FROM {d} WHERE pipe = ?"
        self.drop_pipe_rows = f"DELETE FROM {p} WHERE bucket = {BUCKET} AND pipe <= ?"
        self.lock_state = f"SELECT maintainer, toUnixTimestamp(maintainer_until) FROM {m} WHERE queue = ?"
        self.lock = (
            f"UPDATE {m} SET maintainer = ?, maintainer_until = ? WHERE queue = ? IF maintainer_until = ?"
        )
        self.unlock = f"UPDATE {m} SET maintainer_until = 0 WHERE queue = ? IF maintainer = ?"

        # --- statistics history: timed by the operator's clock, kept for the retention (TTL) ---
        sample_cols = "depth, in_flight, pushed, popped, acquired, expired, oldest_age_s"
        self.record_sample = f"INSERT INTO {self.history} (queue, at, {sample_cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
        self.sample_since = (
            f"SELECT toUnixTimestamp(at), pushed, popped, acquired FROM {self.history}"
            " WHERE queue = ? AND at >= ? ORDER BY at ASC LIMIT 1"
        )
        self.forget_history = f"DELETE FROM {self.history} WHERE queue = ?"
        self.history_range = (
            f"SELECT toUnixTimestamp(at), {sample_cols} FROM {self.history}"
            " WHERE queue = ? AND at >= ? AND at < ? ORDER BY at ASC"
        )
