"""The statements on a queue's staging table (`<queue>_staged`), where messages wait between the
queue and a Spark job. A row is a block of messages: those with seqs first_seq..seq of a stage,
packed into one value (an Arrow record batch: `dbq.spark.staging.pack`), so storing a batch
costs one row, not one per message. The same text runs on PostgreSQL, SQL Server and Cassandra: only the quoting of the
table differs, and Cassandra filters on first_seq within the stage's partition.
"""

from __future__ import annotations

from dbq.names import QUOTE, QueueNames, pg_quote


class StagingStatements:
    def __init__(self, backend: str, names: QueueNames) -> None:
        quote = QUOTE.get(backend, pg_quote)  # Cassandra quotes as PostgreSQL does
        self.table = t = f"{quote(names.schema)}.{quote(names.staged)}"
        self.insert = f"INSERT INTO {t} (stage, seq, first_seq, packed) VALUES (?, ?, ?, ?)"
        # The blocks holding any seq in (after, upto]. Blocks cover disjoint seq ranges, so in
        # seq order their first seqs are in order too.
        self.blocks = (
            f"SELECT packed FROM {t} WHERE stage = ? AND seq > ? AND first_seq <= ? ORDER BY seq"
            + (" ALLOW FILTERING" if backend == "cassandra" else "")
        )
        self.last = f"SELECT max(seq) FROM {t} WHERE stage = ? AND seq > ?"
        self.delete_upto = f"DELETE FROM {t} WHERE stage = ? AND seq <= ?"
        self.delete_after = f"DELETE FROM {t} WHERE stage = ? AND seq > ?"
        self.delete_stage = f"DELETE FROM {t} WHERE stage = ?"
