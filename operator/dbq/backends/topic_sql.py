"""All PostgreSQL text of a topic: its tables and counters, and its publish routine generated
from its subscriptions (`dbq.contract.topics`). Identifiers come from `TopicNames` and
`QueueNames` (validated) and are quoted by `pg_quote`; filter values become literals in
`dbq.backends.filter_sql`; the rules version is an integer."""

from __future__ import annotations

import json

from dbq.backends.filter_sql import pg_predicate, pg_text
from dbq.backends.ring_sql import load_template, render_template
from dbq.contract.topics import SUBSCRIPTIONS_TABLE, TOPIC_SCHEMA_VERSION, TOPICS_TABLE, Route, TopicTarget
from dbq.names import QueueNames
from dbq.names import pg_quote as quote

TABLES = load_template("dbq.backends.postgres", "topic_tables.sql")
ROUTINES = load_template("dbq.backends.postgres", "topic_routines.sql")


class PgTopic:
    def __init__(self, target: TopicTarget) -> None:
        self.target = target
        self.names = target.names
        self.schema = quote(self.names.schema)
        self.topics = f"{self.schema}.{quote(TOPICS_TABLE)}"
        self.subscriptions = f"{self.schema}.{quote(SUBSCRIPTIONS_TABLE)}"

    def _q(self, name: str) -> str:
        return f"{quote(self.names.schema)}.{quote(name)}"

    def statements(self, rules_version: int) -> list[str]:
        """The tables (if missing), the topic's counters and each subscription's, and the
        publish routine made for `rules_version`."""
        routes = self.target.routes
        values = {
            "topics": self.topics,
            "n_published": self._q(self.names.published),
            "n_unrouted": self._q(self.names.unrouted),
            "fn_publish": self._q(self.names.publish),
            "lock": pg_text(self.names.lock),
            "topic": pg_text(self.names.topic),
            "topic_name": self.names.topic,
            "rules_version": int(rules_version),
            "routes": "\n".join(self._route(r) for r in routes),
            "unrouted": self._unrouted(),
            "counts": "\n".join(self._counts(r) for r in routes),
        }
        values["tag"] = free_tag(str(values["routes"]) + str(values["unrouted"]))
        counters = [
            f"CREATE SEQUENCE IF NOT EXISTS {self._q(seq)}"
            for r in routes
            for seq in (self.names.routed(r.ordinal), self.names.dropped(r.ordinal))
        ]
        made = render_template(ROUTINES, values)
        return made[:-1] + counters + made[-1:]

    def tables(self) -> list[str]:
        """The schema's topic tables, made if missing (before the rules version is read)."""
        return render_template(TABLES, {"topics": self.topics, "subscriptions": self.subscriptions})

    def rows(self, rules_version: int) -> list[tuple[str, list[object]]]:
        """The statements (with their parameters) that record the topic and its rules."""
        topic = self.names.topic
        unrouted = self.target.unrouted.qualified if self.target.unrouted else None
        out: list[tuple[str, list[object]]] = [
            (
                f"INSERT INTO {self.topics} (topic, schema_version, rules_version, unrouted)"
                f" VALUES (?, {TOPIC_SCHEMA_VERSION}, ?, ?)"
                " ON CONFLICT (topic) DO UPDATE SET rules_version = EXCLUDED.rules_version,"
                " unrouted = EXCLUDED.unrouted",
                [topic, rules_version, unrouted],
            ),
            (f"DELETE FROM {self.subscriptions} WHERE topic = ?", [topic]),
        ]
        for r in self.target.routes:
            out.append((
                f"INSERT INTO {self.subscriptions} (topic, subscription, ordinal, queue, filter, on_full)"
                " VALUES (?, ?, ?, ?, CAST(? AS jsonb), ?)",
                [topic, r.subscription, r.ordinal, r.queue.qualified, json.dumps(r.filter.wire()), r.on_full],
            ))  # fmt: skip
        return out

    def _push(self, queue: QueueNames) -> str:
        return f"{quote(queue.schema)}.{quote(queue.routine('push'))}(p_body, p_ttl_ms, p_headers)"

    def _route(self, route: Route) -> str:
        if route.on_full == "Reject":
            when_full = (
                f"RAISE EXCEPTION 'dbq: queue {route.queue.qualified} of subscription {route.subscription} is full:"
                f" nothing was published' USING ERRCODE = '53400';"
            )
        else:
            when_full = f"v_dropped := v_dropped || {route.ordinal};"
        return (
            f"  -- subscription {route.subscription} -> {route.queue.qualified}, onFull {route.on_full}\n"
            f"  IF {pg_predicate(route.filter, 'v_h', 'p_subject')} THEN\n"
            f"    v_matched := true;\n"
            f"    v_id := {self._push(route.queue)};\n"
            f"    IF v_id > 0 THEN\n"
            f"      v_ids := v_ids || ({pg_text(route.subscription + '=')} || v_id);\n"
            f"      v_routed := v_routed || {route.ordinal};\n"
            f"    ELSE\n"
            f"      {when_full}\n"
            f"    END IF;\n"
            f"  END IF;"
        )

    def _unrouted(self) -> str:
        count = f"    PERFORM nextval('{self._q(self.names.unrouted)}');"
        if self.target.unrouted is None:
            return count
        return (
            f"{count}\n    v_id := {self._push(self.target.unrouted)};\n"
            f"    IF v_id <= 0 THEN\n"
            f"      RAISE EXCEPTION 'dbq: queue {self.target.unrouted.qualified} (unrouted messages) is full:"
            f" nothing was published' USING ERRCODE = '53400';\n"
            f"    END IF;\n"
            f"    v_ids := v_ids || ('=' || v_id);"
        )

    def _counts(self, route: Route) -> str:
        routed, dropped = (
            self._q(self.names.routed(route.ordinal)),
            self._q(self.names.dropped(route.ordinal)),
        )
        return (
            f"  IF {route.ordinal} = ANY (v_routed) THEN PERFORM nextval('{routed}'); END IF;\n"
            f"  IF {route.ordinal} = ANY (v_dropped) THEN PERFORM nextval('{dropped}'); END IF;"
        )

    def recorded_rules(self) -> str:
        """(subscription, ordinal, queue, filter as JSON text, on_full) of the topic's recorded
        rules (parameter: the topic)."""
        return (
            f"SELECT subscription, ordinal, queue, filter::text, on_full FROM {self.subscriptions}"
            " WHERE topic = ? ORDER BY ordinal"
        )

    def recorded_topic(self) -> str:
        """(rules_version, unrouted queue, whether the routine exists) (parameter: the topic)."""
        routine = pg_text(f"{self.schema}.{quote(self.names.publish)}(bytea, text, text, bigint)")
        return (
            f"SELECT rules_version, unrouted, CASE WHEN to_regprocedure({routine}) IS NULL THEN 0 ELSE 1 END"
            f" FROM {self.topics}"
            " WHERE topic = ?"
        )

    def rules_version(self) -> str:
        return f"SELECT rules_version FROM {self.topics} WHERE topic = ?"

    def has_tables(self) -> str:
        """1 when the schema (parameter) has the topic tables, else 0 (psqlODBC answers a boolean
        as the text '0' or '1')."""
        return f"SELECT CASE WHEN to_regclass(quote_ident(?) || '.{TOPICS_TABLE}') IS NULL THEN 0 ELSE 1 END"

    def drop(self, ordinals: list[int]) -> list[str]:
        """The routine, the counters (those of the subscriptions numbered `ordinals` too) and the
        topic's rows (parameter: the topic, in the statements that take one)."""
        sequences = [self.names.published, self.names.unrouted]
        sequences += [s for o in ordinals for s in (self.names.routed(o), self.names.dropped(o))]
        return [
            f"DROP FUNCTION IF EXISTS {self._q(self.names.publish)}(bytea, text, text, bigint)",
            *(f"DROP SEQUENCE IF EXISTS {self._q(s)}" for s in sequences),
            f"DELETE FROM {self.subscriptions} WHERE topic = ?",
            f"DELETE FROM {self.topics} WHERE topic = ?",
        ]


def free_tag(body: str) -> str:
    """A dollar-quote tag for a routine's body that the body does not hold (a filter's value
    may be any text, `$fn$` included)."""
    n = 0
    while f"$fn{n or ''}$" in body:
        n += 1
    return f"$fn{n or ''}$"
