"""What the two SQL dialects of the ring share: qualified names, the routine templates, the
mapping from planning steps to SQL, history and teardown.

Each dialect (`postgres/sql.py`, `sqlserver/sql.py`) subclasses `RingSqlBase` with its quoting,
its DDL (one method per `RingAction`) and its routine template, a `.sql` file beside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from importlib import resources

from dbq.backends.ring_plan import RingAction, RingStep
from dbq.contract.access import QUEUE_RIGHTS
from dbq.contract.ring import CONTENT_BUCKETS, HOLE_GRACE_S, RingTarget, notify_channel
from dbq.errors import InvalidSpec
from dbq.names import COUNTERS, QueueNames, group_role, owner_role, qualified_literal

# Redeliveries (nacked messages, expired leases, rescued orphans) wait in the spill table. One
# pop in SPILL_SHARE looks there before the ring while the ring has messages, and every pop when
# it has none: so most pops skip that look, and a redelivery still waits only a few pops.
SPILL_SHARE = 8
# stats() finds the oldest ready message among this many positions past the pop position (and
# as many redeliveries): a bounded look, whatever the ring's size.
HEAD_LOOK = 64
# A placeholder in a template: {name}, or {name:argument} for a value that is a function of the
# argument (an SQL expression, such as a position whose slot is looked up). Nothing else in a
# template is touched.
PLACEHOLDER = re.compile(r"\{([a-z_]+)(?::([^{}]+))?\}")


def load_template(package: str, name: str) -> str:
    """A `.sql` file shipped beside a dialect's module."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


# A conditional block of a template: lines between `-- if <flag>` and `-- end if` (with an
# optional `-- else`), kept or dropped whole by the flag's value. Blocks do not nest.
CONDITION = re.compile(r"^\s*-- (if [a-z_]+|else|end if)\s*$")


def render_template(
    template: str, values: dict[str, object], flags: dict[str, bool] | None = None
) -> list[str]:
    """The statements of a template (separated by `--;;` lines), conditional blocks kept or
    dropped by `flags`, placeholders filled in; a placeholder without a value, or a flag without
    one, is an error, never left in the SQL."""
    template = _choose_blocks(template, flags or {})

    def fill(match: re.Match[str]) -> str:
        key, argument = match.group(1), match.group(2)
        if key not in values:
            raise KeyError(f"template placeholder {{{key}}} has no value")
        value = values[key]
        if callable(value) != (argument is not None):
            raise KeyError(
                f"template placeholder {{{key}}} takes {'an' if callable(value) else 'no'} argument"
            )
        return str(value(argument) if callable(value) else value)

    parts = [part.strip() for part in template.split("\n--;;\n")]
    return [PLACEHOLDER.sub(fill, part) for part in parts if part and not _only_comments(part)]


def _choose_blocks(template: str, flags: dict[str, bool]) -> str:
    kept: list[str] = []
    keep: bool | None = None  # None: outside a block
    for line in template.splitlines():
        marker = CONDITION.match(line)
        if marker is None:
            if keep is not False:
                kept.append(line)
            continue
        word = marker.group(1)
        if word.startswith("if "):
            flag = word[3:]
            if keep is not None or flag not in flags:
                raise KeyError(f"template condition {word!r} is nested or has no flag value")
            keep = flags[flag]
        elif keep is None:
            raise KeyError(f"template has {word!r} outside a block")
        else:
            keep = None if word == "end if" else not keep
    if keep is not None:
        raise KeyError("template has a block without its '-- end if'")
    return "\n".join(kept)


def _only_comments(part: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("--") for line in part.splitlines())


class RingSqlBase:
    ROUTINES: tuple[str, ...] = ()
    ROUTINE_KIND = "FUNCTION"  # what DROP ... IF EXISTS calls a routine
    NOW = "now()"  # the database's clock: samples are timed by one clock, whatever the operator's
    TEMPLATE_PACKAGE = ""  # where the routine template lives ...
    TEMPLATE_FILE = ""  # ... and its name
    BACKEND = ""  # the dialect's backend name
    SERVER_VERSION: str | None = None  # major version and compatibility level, where a floor is checked
    # The compressions of stored bodies the server offers, where it has a choice.
    COMPRESSIONS: str | None = None
    MAX_LOCKS: str | None = None
    # Objects of the queue not as `secure()` leaves them: a count (None where not looked at).
    OBSERVE_INSECURE: str | None = None
    # Sessions of applications logged in with the operator's login, where the dialect can tell.
    SHARED_LOGIN_SESSIONS: str | None = None
    # The catalog's change counters, as one value: equal, and no catalog row changed between.
    CATALOG_CHANGES: str | None = None
    # Whether the dialect offers PGMQ's API (spec.pgmq): the plan observes the facade.
    PGMQ = False

    def __init__(
        self, target: RingTarget, quote: Callable[[str], str], literal: Callable[[str], str]
    ) -> None:
        self.t = target
        self.quote = quote
        self.literal = literal
        n = target.names
        s = self.schema = quote(n.schema)
        self.schema_name = n.schema
        self.meta = f"{s}.{quote(n.meta)}"
        self.history = f"{s}.{quote(n.history)}"
        self.ring = f"{s}.{quote(n.ring)}"
        self.spill = f"{s}.{quote(n.spill)}"
        self.gap = f"{s}.{quote(n.gap)}"
        self.staged = f"{s}.{quote(n.staged)}"
        self.own_dead = f"{s}.{quote(n.dead)}"  # created and dropped with this queue
        keeper = target.dead_letter_keeper or n  # where this queue's dead letters go
        self.dead = f"{quote(keeper.schema)}.{quote(keeper.dead)}"
        self.waiters = f"{s}.{quote(n.waiters)}"
        self.archive = f"{s}.{quote(n.archive)}"
        self.push_seq = f"{s}.{quote(n.push_seq)}"
        self.pop_seq = f"{s}.{quote(n.pop_seq)}"
        self.count = {c: f"{s}.{quote(n.counter(c))}" for c in COUNTERS}
        self.swept_seq = f"{s}.{quote(n.swept_seq)}"
        self.fn = {verb: f"{s}.{quote(n.routine(verb))}" for verb in self.ROUTINES}
        self.size = int(target.size)
        self.message_bytes = int(target.message_bytes)
        self.header_bytes = int(target.header_bytes)
        self.max_headers = int(target.max_headers)
        self.max_body_bytes = int(target.max_body_bytes)
        self.content = f"{s}.{quote(n.content)}"
        self.gens = f"{s}.{quote(n.generations)}"
        # The role owning every object of the schema, and the group role of each right on the queue.
        self.owner = owner_role(target.database, n.schema)
        self.groups = {right: group_role(target.database, n.schema, n.queue, right) for right in QUEUE_RIGHTS}

    @property
    def sequences(self) -> tuple[str, ...]:
        return (self.push_seq, self.pop_seq, *self.count.values(), self.swept_seq)

    # --- provisioning: one method per planning step -------------------------------------------
    def newest_generation(self) -> str:
        """The first slot and size of the ring's newest generation."""
        return f"SELECT slot_base, size FROM {self.gens} ORDER BY first_pos DESC"

    def slots_present(self, lo: int, hi: int) -> str:
        """How many of the first and last slots of [lo, hi) exist (a fill is written whole)."""
        return f"SELECT count(*) FROM {self.ring} WHERE slot IN ({int(lo)}, {int(hi) - 1})"

    def batches(self, statements: list[str]) -> list[str]:
        """How the statements of a plan are sent: one batch each (T-SQL wants CREATE PROCEDURE
        alone in its batch)."""
        return statements

    def render(self, step: RingStep) -> list[str]:
        """The statements of one planning step."""
        statements: dict[RingAction, Callable[[], list[str]]] = {
            RingAction.CREATE_SCHEMA: self.create_schema,
            RingAction.CREATE_META: self.create_meta,
            RingAction.CREATE_RING: self.create_ring,
            RingAction.FILL_RING: self.fill_ring,
            RingAction.CREATE_SEQUENCES: self.create_sequences,
            RingAction.RESET_POSITIONS: self.reset_positions,
            RingAction.CREATE_SIDE_TABLES: self.create_side_tables,
            RingAction.KEY_DEAD_LETTERS: self.key_dead_letters,
            RingAction.INDEX_SPILL: self.index_spill,
            RingAction.ADD_HEADERS: self.add_headers,
            RingAction.ALLOW_CONTENT: self.allow_content,
            RingAction.SET_COMPRESSION: self.set_compression,
            RingAction.SEED_SETTLED: self.seed_settled,
            RingAction.CREATE_HISTORY: self.create_history,
            RingAction.CREATE_ROUTINES: self.create_routines,
            RingAction.RECORD_VERSION: self.record_version,
            RingAction.SECURE: self.secure,
            RingAction.INSTALL_PGMQ: lambda: self.publish_pgmq(install=True),
            RingAction.PUBLISH_PGMQ: self.publish_pgmq,
            RingAction.UNPUBLISH_PGMQ: self.unpublish_pgmq,
        }
        return statements[step.action]()

    def create_schema(self) -> list[str]:
        raise NotImplementedError

    def create_meta(self) -> list[str]:
        raise NotImplementedError

    def create_ring(self) -> list[str]:
        raise NotImplementedError

    def fill_ring(self) -> list[str]:
        raise NotImplementedError

    def create_sequences(self) -> list[str]:
        raise NotImplementedError

    def reset_positions(self) -> list[str]:
        raise NotImplementedError

    def create_side_tables(self) -> list[str]:
        raise NotImplementedError

    def key_dead_letters(self) -> list[str]:
        raise NotImplementedError

    def index_spill(self) -> list[str]:
        raise NotImplementedError

    def add_headers(self) -> list[str]:
        raise NotImplementedError

    def allow_content(self) -> list[str]:
        raise NotImplementedError

    def _dead_letter_queue(self) -> str:
        """RingTarget.dead_letter_queue as a literal, for the metadata row."""
        keeper = self.t.dead_letter_keeper
        if keeper is not None:
            return qualified_literal(self.BACKEND, keeper)
        return "N''" if self.BACKEND == "sqlserver" else "''"

    def set_compression(self) -> list[str]:
        raise NotImplementedError

    def seed_settled(self) -> list[str]:
        raise NotImplementedError

    def create_history(self) -> list[str]:
        raise NotImplementedError

    def record_version(self) -> list[str]:
        raise NotImplementedError

    def secure(self) -> list[str]:
        raise NotImplementedError

    def drop_roles(self) -> list[str]:
        """After drop(): the queue's roles, where the dialect makes roles of its own."""
        raise NotImplementedError

    def publish_pgmq(self, install: bool = False) -> list[str]:
        raise InvalidSpec("spec.pgmq: PGMQ's API is offered on PostgreSQL ring queues only: remove spec.pgmq")

    def unpublish_pgmq(self) -> list[str]:
        return []

    def create_routines(self) -> list[str]:
        template = load_template(self.TEMPLATE_PACKAGE, self.TEMPLATE_FILE)
        return render_template(template, self.template_values(), {"archive": self.t.archive})

    def template_values(self) -> dict[str, object]:
        return {
            "ring": self.ring,
            "spill": self.spill,
            "gap": self.gap,
            "dead": self.dead,
            "dead_source": qualified_literal(self.BACKEND, self.t.names),
            "waiters": self.waiters,
            "archive": self.archive,
            "max_attempts": int(self.t.max_attempts),
            "push_seq": self.push_seq,
            "pop_seq": self.pop_seq,
            "swept_seq": self.swept_seq,
            "size": self.size,
            "max_bytes": min(self.message_bytes, self.max_body_bytes),  # the largest body a slot holds
            "header_bytes": self.header_bytes,
            "max_body_bytes": self.max_body_bytes,
            "content": self.content,
            "gens": self.gens,
            "buckets": CONTENT_BUCKETS,
            "queue": self.t.names.queue,
            "spill_share": SPILL_SHARE,
            "head_look": HEAD_LOOK,
            "channel": f"'{notify_channel(self.t.names)}'",
            "hole_grace_ms": int(HOLE_GRACE_S * 1000),  # read's wait for a position being written
            **{f"n_{c}": seq for c, seq in self.count.items()},
            **{f"fn_{verb}": name for verb, name in self.fn.items()},
        }

    # --- statistics history (parameters in the order of HISTORY_COLUMNS) ---------------------
    HISTORY_COLUMNS = ("depth", "in_flight", "pushed", "popped", "acquired", "expired", "oldest_age_s")

    def record_sample(self) -> str:
        """Append one sample of this queue (parameters: the HISTORY_COLUMNS values)."""
        return self.record_samples([self.t.names.queue])

    def record_samples(self, queues: Sequence[str]) -> str:
        """Append one sample of each of `queues`, queues of this schema (parameters: the
        HISTORY_COLUMNS values of each in turn): one statement for many queues."""
        columns = ", ".join(self.HISTORY_COLUMNS)
        marks = ", ".join("?" for _ in self.HISTORY_COLUMNS)
        rows = ", ".join(f"({self.literal(queue)}, {self.NOW}, {marks})" for queue in queues)
        return f"INSERT INTO {self.history} (queue, at, {columns}) VALUES {rows}"

    def purge_history(self) -> str:
        """Drop this queue's samples older than the retention (parameter: seconds)."""
        return self.purge_histories([self.t.names.queue])

    def purge_histories(self, queues: Sequence[str]) -> str:
        """Drop the samples of `queues` older than the retention (parameter: seconds)."""
        raise NotImplementedError

    def history_of(self, queues: Sequence[str]) -> str:
        """The condition that selects the samples of `queues`, queues of this schema."""
        if len(queues) == 1:
            return f"queue = {self.literal(queues[0])}"
        return f"queue IN ({', '.join(self.literal(queue) for queue in queues)})"

    def _queue_tables_list(self) -> str:
        """The queue's tables as a list of string literals (for catalog queries)."""
        return ", ".join(self.literal(t) for t in self.t.names.tables)

    def catalog_digests(self) -> str | None:
        """Digests of the schema's catalog rows by queue, where the dialect can read them."""
        return None

    def meta_row(self, names: QueueNames) -> str:
        """Every column of the metadata row of queue `names` (parameter: its name)."""
        return f"SELECT * FROM {self.quote(names.schema)}.{self.quote(names.meta)} WHERE queue = ?"

    def forget_dead_letters(self, keeper: QueueNames) -> str:
        """Delete this queue's dead letters from the dead-letter table of queue `keeper`."""
        table = f"{self.quote(keeper.schema)}.{self.quote(keeper.dead)}"
        return f"DELETE FROM {table} WHERE source = {qualified_literal(self.BACKEND, self.t.names)}"

    # --- online resize (`dbq.backends.ring_resize`) ---------------------------------------------
    # Slots a resize writes or deletes per transaction.
    RESIZE_CHUNK = 20_000

    def last_drawn(self, sequence: str) -> str:
        """The last value `sequence` gave out (0 before the first), as an SQL expression."""
        raise NotImplementedError

    def try_resize_lock(self) -> str:
        """The queue's resize lock, for the session (parameter: its name), answering 1 when taken:
        preparing and switching, and retiring, never run at once, nor twice."""
        raise NotImplementedError

    def resize_unlock(self) -> str:
        """The resize lock released (parameter: its name)."""
        raise NotImplementedError

    def prepare_slots(self, lo: int, hi: int) -> str:
        """Free slots [lo, hi), each with a body of full size (no row grows off its page later)."""
        raise NotImplementedError

    def switch(self, base: int, size: int, wait_ms: int) -> str:
        """The switch, one statement that is its own transaction: the fence taken exclusively
        (waiting at most `wait_ms`: pushes queue behind it), the generation of `size` slots from
        `base` recorded from the next position to draw (replacing a newest one that holds no
        position yet), the size in the metadata. Raises what `fence_busy` tells when the wait
        ran out."""
        raise NotImplementedError

    def fence_busy(self, state: str, text: str) -> bool:
        """Whether an error (SQLSTATE, message) of `switch` is its wait for the fence running out."""
        raise NotImplementedError

    def retire(self, first_pos: int, lo: int, hi: int) -> tuple[str, str]:
        """For the generation from `first_pos` (slots [lo, hi)), every position of it drawn, two
        statements of one transaction: what its slots still hold moves to the spill table (a
        leased message keeps its lease, a ready one is due at once; rows a client holds right
        now are skipped), then the generation goes if nothing is left in it, answering 1 if it
        went (0: the next run looks again)."""
        raise NotImplementedError

    def generations(self) -> str:
        """The ring's generations, oldest first, and the last position a pop drew."""
        return (
            f"SELECT first_pos, slot_base, size, {self.last_drawn(self.pop_seq)}"
            f" FROM {self.gens} ORDER BY first_pos"
        )

    def resize_pending(self) -> str:
        """1 while more than one generation is alive, or the ring has slots outside them all."""
        return f"""SELECT CASE WHEN (SELECT count(*) FROM {self.gens}) > 1
  OR (SELECT min(slot) FROM {self.ring}) < (SELECT min(slot_base) FROM {self.gens})
  OR (SELECT max(slot) FROM {self.ring}) >= (SELECT max(slot_base + size) FROM {self.gens}) THEN 1 ELSE 0 END"""

    def delete_slots(self, lo: int, hi: int) -> str:
        """Slots [lo, hi) that no generation alive holds, free ones only."""
        return f"""DELETE FROM {self.ring} WHERE slot >= {int(lo)} AND slot < {int(hi)} AND state = 0
  AND NOT EXISTS (SELECT 1 FROM {self.gens} g WHERE slot >= g.slot_base AND slot < g.slot_base + g.size)"""

    def slot_bounds(self) -> str:
        """The lowest and highest slot of the ring table."""
        return f"SELECT coalesce(min(slot), 0), coalesce(max(slot), -1) FROM {self.ring}"

    def leased_in(self, lo: int, hi: int) -> str:
        """Leased messages in slots [lo, hi): what a draining generation holds beside its positions."""
        return f"SELECT count(*) FROM {self.ring} WHERE slot >= {int(lo)} AND slot < {int(hi)} AND state = 2"

    def drop(self) -> list[str]:
        stmts = [f"DROP {self.ROUTINE_KIND} IF EXISTS {name}" for name in self.fn.values()]
        stmts += [f"DROP TABLE IF EXISTS {self.schema}.{self.quote(t)}" for t in self.t.names.tables]
        stmts += [f"DROP SEQUENCE IF EXISTS {s}" for s in self.sequences]
        stmts.append(f"DELETE FROM {self.meta} WHERE queue = {self.literal(self.t.names.queue)}")
        stmts.append(f"DELETE FROM {self.history} WHERE queue = {self.literal(self.t.names.queue)}")
        return stmts
