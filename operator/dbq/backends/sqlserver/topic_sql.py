"""All T-SQL of a topic on SQL Server: its tables and counters, and its publish procedure generated
from its subscriptions, with the contract of PostgreSQL's (`dbq.backends.topic_sql`).

No SQL Server runs where dbq is built: this text is pinned by a golden file and parsed by a T-SQL
grammar (`tests/test_sql_dialects.py`); the operator does not provision topics on SQL Server yet
(a Topic says backend: postgres, at admission). Identifiers come from `TopicNames` and
`QueueNames` (validated) and are quoted by `ms_quote`; filter values become literals in
`dbq.backends.filter_sql`; the rules version is an integer.
"""

from __future__ import annotations

from dbq.backends.filter_sql import ms_predicate, ms_text
from dbq.backends.ring_sql import load_template, render_template
from dbq.backends.topic_sql import TopicSql, template_blocks
from dbq.contract.broker import SEQUENCE_DRAWN
from dbq.contract.topics import TOPIC_SCHEMA_VERSION, Route, TopicTarget
from dbq.names import QueueNames
from dbq.names import ms_quote as quote

_TEMPLATE = load_template("dbq.backends.sqlserver", "topic_procedures.sql")
PROCEDURES = _TEMPLATE.split("\n-- block:", 1)[0]
BLOCKS = template_blocks(_TEMPLATE)
# The T-SQL of the publish's errors: a full queue (onFull: Reject), rules that changed under it.
FULL_ERROR, CHANGED_ERROR = 51400, 51213


class MsTopic(TopicSql):
    def __init__(self, target: TopicTarget) -> None:
        super().__init__(target, quote)

    def statements(self, rules_version: int) -> list[str]:
        """The tables, the topic's counters and each subscription's, and the publish procedure
        made for `rules_version`."""
        routes, unrouted = self.target.routes, self.target.unrouted
        checked = [(i, r) for i, r in enumerate(routes, 1) if r.on_full == "Reject" and r.ring_size > 0]
        matches = "\n  UNION ALL\n".join(self._block("match", i, r) for i, r in enumerate(routes, 1))
        values: dict[str, object] = {
            "topics": self.topics,
            "subscriptions": self.subscriptions,
            "n_published": self._q(self.names.published),
            "n_unrouted": self._q(self.names.unrouted),
            "fn_publish": self._q(self.names.publish),
            "lock": ms_text(self.names.lock),
            "topic": ms_text(self.names.topic),
            "topic_name": self.names.topic,
            "rules_version": int(rules_version),
            "matches": matches or "  SELECT 0, 0",
            "rooms": "\n".join(self._block("room", i, r) for i, r in checked),
            "routes": "\n".join(self._block("publish", i, r) for i, r in enumerate(routes, 1)),
        }
        if unrouted is not None:
            values |= {"unrouted_push": self._routine(unrouted), "unrouted_queue": unrouted.qualified}
        made = render_template(PROCEDURES, values, {"unrouted": unrouted is not None})
        counters = [
            f"IF OBJECT_ID(N'{self._q(seq)}', N'SO') IS NULL CREATE SEQUENCE {self._q(seq)} AS bigint START WITH 1"
            for seq in self.names.route_counters(r.ordinal for r in routes)
        ]
        return made[:-1] + counters + made[-1:]

    @staticmethod
    def _routine(queue: QueueNames) -> str:
        return f"{quote(queue.schema)}.{quote(queue.routine('push'))}"

    @staticmethod
    def _free(route: Route) -> str:
        """The free slots of the route's ring, from its push and pop sequences."""
        push, pop = (
            f"{quote(route.queue.schema)}.{quote(seq)}" for seq in (route.queue.push_seq, route.queue.pop_seq)
        )
        drawn = (
            f"(SELECT SUM(CASE WHEN object_id = OBJECT_ID(N'{push}') THEN 1 ELSE -1 END * {SEQUENCE_DRAWN})"
            f" FROM sys.sequences WHERE object_id IN (OBJECT_ID(N'{push}'), OBJECT_ID(N'{pop}')))"
        )
        return f"({int(route.ring_size)} - {drawn})"

    def _block(self, name: str, index: int, route: Route) -> str:
        values = {
            "index": index,
            "predicate": ms_predicate(route.filter, "@headers", "@subject"),
            "subscription": route.shown,
            "subscription_text": ms_text(route.shown + "="),
            "queue": route.queue.qualified,
            "push": self._routine(route.queue),
            "n_routed": self._q(self.names.routed(route.ordinal)),
            "n_dropped": self._q(self.names.dropped(route.ordinal)),
            "free": self._free(route),
        }
        return "  " + "\n".join(render_template(BLOCKS[name], values, {"reject": route.on_full == "Reject"}))

    def rows(self, rules_version: int) -> list[tuple[str, list[object]]]:
        """The statements (with their parameters) that record the topic and its rules."""
        unrouted = self.target.unrouted.qualified if self.target.unrouted else None
        topic_row = (
            f"MERGE {self.topics} WITH (HOLDLOCK) AS t USING (SELECT ? AS topic) AS s ON t.topic = s.topic"
            f" WHEN MATCHED THEN UPDATE SET rules_version = ?, unrouted = ?"
            f" WHEN NOT MATCHED THEN INSERT (topic, schema_version, rules_version, unrouted)"
            f" VALUES (s.topic, {TOPIC_SCHEMA_VERSION}, ?, ?);"
        )
        params: list[object] = [self.names.topic, rules_version, unrouted, rules_version, unrouted]
        return [(topic_row, params), *self.rule_rows("?")]

    def drop(self, ordinals: list[int]) -> list[str]:
        """The statements that drop the procedure, the counters (those of the subscriptions
        numbered `ordinals` too) and the topic's rows."""
        topic = ms_text(self.names.topic)
        return [
            f"DROP PROCEDURE IF EXISTS {self._q(self.names.publish)}",
            *(f"DROP SEQUENCE IF EXISTS {self._q(s)}" for s in self.names.counters(ordinals)),
            f"IF OBJECT_ID(N'{self.subscriptions}', N'U') IS NOT NULL DELETE FROM {self.subscriptions} WHERE topic = {topic}",
            f"IF OBJECT_ID(N'{self.topics}', N'U') IS NOT NULL DELETE FROM {self.topics} WHERE topic = {topic}",
        ]
