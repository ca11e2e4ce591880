"""All PostgreSQL text of a topic: its tables and counters, and its publish routines generated
from its subscriptions (`dbq.contract.topics`). Identifiers come from `TopicNames` and
`QueueNames` (validated) and are quoted by `pg_quote`; filter values become literals in
`dbq.backends.filter_sql`; the rules version is an integer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from dbq.backends.filter_sql import PgHeaderVariables, pg_predicate, pg_text
from dbq.backends.ring_sql import load_template, render_template
from dbq.contract.access import Right
from dbq.contract.topics import SUBSCRIPTIONS_TABLE, TOPIC_SCHEMA_VERSION, TOPICS_TABLE, Route, TopicTarget
from dbq.names import QueueNames, group_role, owner_role
from dbq.names import pg_quote as quote

TABLES = load_template("dbq.backends.postgres", "topic_tables.sql")
ROUTINES = load_template("dbq.backends.postgres", "topic_routines.sql")


def template_blocks(template: str) -> dict[str, str]:
    """The `-- block: name` parts of a template, by name (each up to the next block)."""
    parts = re.split(r"^-- block: ([a-z_]+)\n", template, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


BLOCKS = template_blocks(load_template("dbq.backends.postgres", "topic_routes.sql"))
# Routes are tested in groups this large: a publish that matches none of a group skips it with
# one test (partitioned routing over 64 subscriptions tests 8 groups, not 64 routes).
GROUP = 8


# The test of a group: publish's, whether a filter of it matched the message; publish_many's,
# whether one matched any message of the batch.
def single_guard(first: int, last: int) -> str:
    return f"true = ANY (v_m[{first}:{last}])"


def many_guard(first: int, last: int) -> str:
    return f"v_hits && '{{{','.join(str(i) for i in range(first, last + 1))}}}'::int[]"


# The first statements of both publish routines: the rules they were made from still hold.
IN_FORCE = """\
  PERFORM pg_advisory_xact_lock_shared(hashtext({lock}));
  IF (SELECT rules_version FROM {topics} WHERE topic = {topic}) IS DISTINCT FROM {version} THEN
    RAISE EXCEPTION 'dbq: the subscriptions of topic {name} changed while publishing: publish again'
      USING ERRCODE = '40001';
  END IF;"""


class TopicSql:
    """What a topic's SQL in either dialect starts from: its target, and its schema's names quoted
    by the dialect's `quote`."""

    def __init__(self, target: TopicTarget, quote: Callable[[str], str]) -> None:
        self.target = target
        self.names = target.names
        self.quote = quote
        self.schema = quote(self.names.schema)
        self.topics = f"{self.schema}.{quote(TOPICS_TABLE)}"
        self.subscriptions = f"{self.schema}.{quote(SUBSCRIPTIONS_TABLE)}"

    def _q(self, name: str) -> str:
        """An object of the topic's schema."""
        return f"{self.schema}.{self.quote(name)}"

    def rule_rows(self, filter_param: str) -> list[tuple[str, list[object]]]:
        """The statements (with their parameters) that record the target's subscriptions in place of
        the topic's recorded ones; `filter_param` is how the dialect takes a filter's JSON text."""
        topic = self.names.topic
        out: list[tuple[str, list[object]]] = [(f"DELETE FROM {self.subscriptions} WHERE topic = ?", [topic])]
        for r in self.target.routes:
            out.append((
                f"INSERT INTO {self.subscriptions} (topic, subscription, ordinal, queue, filter, on_full, label)"
                f" VALUES (?, ?, ?, ?, {filter_param}, ?, ?)",
                [topic, r.subscription, r.ordinal, r.queue.qualified, json.dumps(r.filter.wire()), r.on_full,
                 r.label or None],
            ))  # fmt: skip
        return out


class PgTopic(TopicSql):
    def __init__(self, target: TopicTarget, database: str = "") -> None:
        """`database`: where the topic lives; its roles' names are derived from it."""
        super().__init__(target, quote)
        self.database = database

    def statements(self, rules_version: int) -> list[str]:
        """The topic's counters and each subscription's, and the publish routines made for
        `rules_version`."""
        routes = self.target.routes
        unrouted = self.target.unrouted
        each = {name: "\n".join(self._block(name, i, r) for i, r in enumerate(routes, 1)) for name in BLOCKS}
        each["publish"] = self._grouped("publish", "  ", single_guard)
        each["pick"] = self._grouped("pick", "    ", single_guard)
        for name in ("publish_many", "count_many"):
            each[name] = self._grouped(name, "  ", many_guard)
        # A Reject route whose ring size is known refuses a message before any push draws.
        checked = [(i, r) for i, r in enumerate(routes, 1) if r.on_full == "Reject" and r.ring_size > 0]
        rooms = "\n".join(self._block("room", i, r) for i, r in checked)
        each["room"] = f"  IF v_copies > 1 THEN\n{rooms}\n  END IF;" if rooms else ""
        each["room_many"] = self._grouped("room_many", "  ", many_guard, dict(checked))
        reads = PgHeaderVariables("v_h")
        predicates = ",\n    ".join(pg_predicate(r.filter, reads, "v_s") for r in routes)
        each["matches"] = f"ARRAY[\n    {predicates}]" if routes else "'{}'::boolean[]"
        values: dict[str, object] = {
            "topics": self.topics,
            "n_published": self._q(self.names.published),
            "n_unrouted": self._q(self.names.unrouted),
            "fn_publish": self._q(self.names.publish),
            "fn_publish_many": self._q(self.names.publish_many),
            "in_force": IN_FORCE.format(
                lock=pg_text(self.names.lock),
                topics=self.topics,
                topic=pg_text(self.names.topic),
                version=int(rules_version),
                name=self.names.topic,
            ),
            "topic_name": self.names.topic,
            "definer": f"SECURITY DEFINER SET search_path = pg_catalog, {self.schema}, pg_temp",
            "matches": each["matches"],
            "declare_reads": reads.declarations(),
            "reads": reads.assignments("  "),
            "reads_many": reads.assignments("    "),
            "rooms": each["room"],
            "routes": each["publish"],
            "declare_many": each["declare_many"],
            "picks": each["pick"],
            "rooms_many": each["room_many"],
            "routes_many": each["publish_many"],
            "counts_many": each["count_many"],
        }
        if unrouted is not None:
            values |= {
                "unrouted_push": self._routine(unrouted, "push"),
                "unrouted_push_many": self._routine(unrouted, "push_many"),
                "unrouted_queue": unrouted.qualified,
            }
        values["tag"] = free_tag("".join(each.values()))
        made = render_template(ROUTINES, values, {"unrouted": unrouted is not None})
        counters = [
            f"CREATE SEQUENCE IF NOT EXISTS {self._q(seq)}"
            for seq in self.names.route_counters(r.ordinal for r in routes)
        ]
        return made[:2] + counters + made[2:]

    def secure(self, ordinals: list[int]) -> list[str]:
        """The topic's objects to the schema's owner role, nothing to PUBLIC, and its publish
        routines to its publish group role (roles from the role helper, as a queue's)."""
        owner_name = owner_role(self.database, self.names.schema)
        group_name = self.publish_group
        owner, group = quote(owner_name), quote(group_name)
        routines = f"{self._q(self.names.publish)}, {self._q(self.names.publish_many)}"
        sequences = ", ".join(self._q(s) for s in self.names.counters(ordinals))
        return [
            f"SELECT dbq_access.ensure_owner({pg_text(owner_name)})",
            f"SELECT dbq_access.ensure_group({pg_text(group_name)})",
            f"ALTER SCHEMA {self.schema} OWNER TO {owner}",
            f"ALTER TABLE {self.topics} OWNER TO {owner}",
            f"ALTER TABLE {self.subscriptions} OWNER TO {owner}",
            *(f"ALTER SEQUENCE {self._q(s)} OWNER TO {owner}" for s in self.names.counters(ordinals)),
            f"ALTER ROUTINE {self._q(self.names.publish)} OWNER TO {owner}",
            f"ALTER ROUTINE {self._q(self.names.publish_many)} OWNER TO {owner}",
            f"REVOKE ALL ON SCHEMA {self.schema} FROM PUBLIC",
            f"REVOKE ALL ON TABLE {self.topics}, {self.subscriptions} FROM PUBLIC",
            f"REVOKE ALL ON SEQUENCE {sequences} FROM PUBLIC",
            f"REVOKE ALL ON ROUTINE {routines} FROM PUBLIC",
            f"GRANT USAGE ON SCHEMA {self.schema} TO {group}",
            f"GRANT EXECUTE ON ROUTINE {routines} TO {group}",
        ]

    @property
    def publish_group(self) -> str:
        return group_role(self.database, self.names.schema, f"topic:{self.names.topic}", Right.PUBLISH)

    def drop_group(self) -> str:
        """After drop(): the topic's publish group role (its grants on the routines went with them)."""
        schema, group = pg_text(self.names.schema), pg_text(self.publish_group)
        return f"""DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {group}) THEN
    IF to_regnamespace({schema}) IS NOT NULL THEN
      EXECUTE format('REVOKE ALL ON SCHEMA %I FROM %I', {schema}, {group});
    END IF;
    PERFORM dbq_access.drop_group({group});
  END IF;
END $$"""

    def _grouped(self, name: str, indent: str, guard: Callable[[int, int], str],
                 only: dict[int, Route] | None = None) -> str:  # fmt: skip
        """Block `name` of every route (of `only`, when given), in groups of GROUP routes, each
        group run only when `guard` (given the group's first and last route) says a route of it
        matched."""
        routes = list(enumerate(self.target.routes, 1))
        groups = []
        for start in range(0, len(routes), GROUP):
            part = routes[start : start + GROUP]
            body = "\n".join(self._block(name, i, r) for i, r in part if only is None or i in only)
            if body:
                test = guard(part[0][0], part[-1][0])
                groups.append(f"{indent}IF {test} THEN\n{body}\n{indent}END IF;")
        return "\n".join(groups)

    def _routine(self, queue: QueueNames, verb: str) -> str:
        return f"{quote(queue.schema)}.{quote(queue.routine(verb))}"

    @staticmethod
    def _free(route: Route) -> str:
        """The free slots of the route's ring: its newest generation's size (it may be resized
        online) less what its push and pop sequences say is in it."""
        push, pop, gens = (
            f"{quote(route.queue.schema)}.{quote(name)}"
            for name in (route.queue.push_seq, route.queue.pop_seq, route.queue.generations)
        )
        drawn = "CASE WHEN {0}.is_called THEN {0}.last_value ELSE 0 END"
        return (
            f"(SELECT g.size - ({drawn.format('u')} - greatest({drawn.format('o')}, g.first_pos - 1))"
            f" FROM {push} u, {pop} o, (SELECT first_pos, size FROM {gens} ORDER BY first_pos DESC LIMIT 1) g)"
        )

    def _block(self, name: str, index: int, route: Route) -> str:
        """The block `name` of topic_routes.sql for the route at `index` (from 1), filled in."""
        values = {
            "index": index,
            "subscription": route.shown,
            "subscription_text": pg_text(route.shown + "="),
            "queue": route.queue.qualified,
            "ordinal": int(route.ordinal),
            "push": self._routine(route.queue, "push"),
            "push_many": self._routine(route.queue, "push_many"),
            "n_routed": self._q(self.names.routed(route.ordinal)),
            "n_dropped": self._q(self.names.dropped(route.ordinal)),
            "free": self._free(route),
        }
        return "\n".join(render_template(BLOCKS[name], values, {"reject": route.on_full == "Reject"}))

    def tables(self) -> list[str]:
        """The schema's topic tables, made if missing (before the rules version is read)."""
        return render_template(TABLES, {"topics": self.topics, "subscriptions": self.subscriptions})

    def rows(self, rules_version: int) -> list[tuple[str, list[object]]]:
        """The statements (with their parameters) that record the topic and its rules."""
        unrouted = self.target.unrouted.qualified if self.target.unrouted else None
        topic_row = (
            f"INSERT INTO {self.topics} (topic, schema_version, rules_version, unrouted)"
            f" VALUES (?, {TOPIC_SCHEMA_VERSION}, ?, ?)"
            " ON CONFLICT (topic) DO UPDATE SET rules_version = EXCLUDED.rules_version, unrouted = EXCLUDED.unrouted"
        )
        return [(topic_row, [self.names.topic, rules_version, unrouted]), *self.rule_rows("CAST(? AS jsonb)")]

    def recorded_rules(self) -> str:
        """(subscription, ordinal, queue, filter as JSON text, on_full, label or '') of the topic's
        recorded rules (parameter: the topic)."""
        return (
            f"SELECT subscription, ordinal, queue, filter::text, on_full, coalesce(label, '') FROM {self.subscriptions}"
            " WHERE topic = ? ORDER BY ordinal"
        )

    def recorded_topic(self) -> str:
        """(rules_version, unrouted queue, whether the routine exists as `secure` leaves it: run as
        its owner, not granted to PUBLIC) (parameter: the topic)."""
        routine = pg_text(f"{self.schema}.{quote(self.names.publish)}(bytea, text, text, bigint)")
        return (
            f"SELECT rules_version, unrouted, CASE WHEN p.oid IS NULL THEN 0"
            " WHEN NOT p.prosecdef OR has_function_privilege('public', p.oid, 'EXECUTE') THEN 0 ELSE 1 END"
            f" FROM {self.topics} LEFT JOIN pg_proc p ON p.oid = to_regprocedure({routine})"
            " WHERE topic = ?"
        )

    @staticmethod
    def has_meta(queue: QueueNames) -> str:
        """1 when the queue's schema has the queues' metadata table, else 0."""
        table = pg_text(f"{quote(queue.schema)}.{quote(queue.meta)}")
        return f"SELECT CASE WHEN to_regclass({table}) IS NULL THEN 0 ELSE 1 END"

    @staticmethod
    def ring_size(queue: QueueNames) -> str:
        """The queue's ring size, from its metadata row (parameter: the queue)."""
        return f"SELECT ring_size FROM {quote(queue.schema)}.{quote(queue.meta)} WHERE queue = ? AND design = 'ring'"

    def counters(self, ordinals: list[int]) -> str:
        """One row: published, unrouted, then routed and dropped of each subscription numbered in
        `ordinals` (in that order). A sequence never drawn from counts 0."""
        drawn = "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {})"
        return "SELECT " + ", ".join(drawn.format(self._q(s)) for s in self.names.counters(ordinals))

    def rules_version(self) -> str:
        return f"SELECT rules_version FROM {self.topics} WHERE topic = ?"

    def has_tables(self) -> str:
        """1 when the schema (parameter) has the topic tables, else 0 (psqlODBC answers a boolean
        as the text '0' or '1')."""
        return f"SELECT CASE WHEN to_regclass(quote_ident(?) || '.{TOPICS_TABLE}') IS NULL THEN 0 ELSE 1 END"

    def has_current_tables(self) -> str:
        """1 when the schema (parameter, twice) has the topic tables as this version makes them
        (the subscriptions' label column came later), else 0."""
        return (
            f"SELECT CASE WHEN to_regclass(quote_ident(?) || '.{TOPICS_TABLE}') IS NULL THEN 0"
            " WHEN EXISTS (SELECT 1 FROM pg_attribute WHERE attname = 'label'"
            f" AND attrelid = to_regclass(quote_ident(?) || '.{SUBSCRIPTIONS_TABLE}')) THEN 1 ELSE 0 END"
        )

    def drop(self, ordinals: list[int]) -> list[tuple[str, list[object]]]:
        """The statements (with their parameters) that drop the routines, the counters (those of
        the subscriptions numbered `ordinals` too) and the topic's rows."""
        topic: list[object] = [self.names.topic]
        return [
            (f"DROP FUNCTION IF EXISTS {self._q(self.names.publish)}(bytea, text, text, bigint)", []),
            (
                f"DROP FUNCTION IF EXISTS {self._q(self.names.publish_many)}(bytea, text, text, text, bigint)",
                [],
            ),
            (f"DROP FUNCTION IF EXISTS {self._q(self.names.in_force)}()", []),
            *((f"DROP SEQUENCE IF EXISTS {self._q(s)}", []) for s in self.names.counters(ordinals)),
            (f"DELETE FROM {self.subscriptions} WHERE topic = ?", topic),
            (f"DELETE FROM {self.topics} WHERE topic = ?", topic),
        ]


def free_tag(body: str) -> str:
    """A dollar-quote tag for a routine's body that the body does not hold (a filter's value
    may be any text, `$fn$` included)."""
    n = 0
    while f"$fn{n or ''}$" in body:
        n += 1
    return f"$fn{n or ''}$"
