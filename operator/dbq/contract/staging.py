"""The statements on a queue's staging table (`<queue>_staged`), where messages wait between the
queue and a Spark job. The same text runs on PostgreSQL, SQL Server and Cassandra: only the
quoting of the table differs. Rows are keyed by (stage, seq); see `dbq.client.staging`.
"""

from __future__ import annotations

from dbq.names import QUOTE, QueueNames, pg_quote

COLUMNS = "stage, seq, id, body, attempts"


class StagingStatements:
    def __init__(self, backend: str, names: QueueNames) -> None:
        quote = QUOTE.get(backend, pg_quote)  # Cassandra quotes as PostgreSQL does
        self.table = t = f"{quote(names.schema)}.{quote(names.staged)}"
        self.insert = f"INSERT INTO {t} ({COLUMNS}) VALUES (?, ?, ?, ?, ?)"
        self.rows = (
            f"SELECT seq, id, body, attempts FROM {t} WHERE stage = ? AND seq > ? AND seq <= ? ORDER BY seq"
        )
        self.last = f"SELECT max(seq) FROM {t} WHERE stage = ? AND seq > ?"
        self.delete_upto = f"DELETE FROM {t} WHERE stage = ? AND seq <= ?"
        self.delete_after = f"DELETE FROM {t} WHERE stage = ? AND seq > ?"
        self.delete_stage = f"DELETE FROM {t} WHERE stage = ?"

    def insert_packed(self) -> str:
        """PostgreSQL: many rows in six parameters, which binds far faster than five a row:
        stage, the bodies concatenated, then comma-separated seqs, ids, attempts and body lengths."""
        return (
            f"INSERT INTO {self.table} ({COLUMNS})"
            " SELECT CAST(? AS text), r.seq, coalesce(r.id, ''), substring(b.blob FROM r.off FOR r.len), r.attempts"
            " FROM (SELECT CAST(? AS bytea) AS blob) b,"
            " (SELECT seq, id, attempts, len, CAST(sum(len) OVER (ORDER BY n) - len + 1 AS int) AS off"
            " FROM unnest(CAST(string_to_array(?, ',') AS bigint[]), string_to_array(?, ','),"
            " CAST(string_to_array(?, ',') AS int[]), CAST(string_to_array(?, ',') AS int[]))"
            " WITH ORDINALITY AS u(seq, id, attempts, len, n)) r"
        )

    def insert_many(self, n: int) -> str:
        """SQL: one INSERT of n rows (PostgreSQL and SQL Server; Cassandra inserts row by row)."""
        head = self.insert.removesuffix(" VALUES (?, ?, ?, ?, ?)")
        return head + " VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * n)
