"""The ring client's semantics tests, run against a real SQL Server when DBQ_MSSQL_DSN is set
(`mssql://user:password@host:1433/database?driver=ODBC Driver 18 for SQL Server&TrustServerCertificate=yes`).

SQL Server cannot run on this machine (no registry we may use ships it), so without the variable
these tests are skipped and say why; the T-SQL is still checked by tests/test_sql_dialects.py.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.client import Queue, connect
from dbq.connection import from_url
from dbq.contract.ring import RingTarget
from dbq.names import QueueNames
from tests.test_ring_client import (  # noqa: F401  (collected again here, on SQL Server)
    test_a_slot_held_by_a_lease_moves_aside_when_the_ring_laps,
    test_ack_many_reports_exactly_the_expired_leases,
    test_acquire_ack_nack_and_lease_expiry,
    test_full_ring_accepts_a_push_as_soon_as_a_slot_frees,
    test_full_ring_waits_for_the_push_timeout_then_raises_and_stores_nothing,
    test_push_pop_in_order_with_ids,
    test_ttl_expires_messages_in_ring_and_spill,
    test_wrap_around_of_a_16_slot_ring_over_10000_messages,
)

DSN = os.environ.get("DBQ_MSSQL_DSN", "")
pytestmark = pytest.mark.skipif(
    not DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run on this machine"
)


@pytest.fixture
def make_queue() -> Iterator[object]:
    opened: list[tuple[Queue, OdbcRing]] = []

    def make(size: int = 1000, message_bytes: int = 100, **options) -> Queue:
        name = f"q_{secrets.token_hex(4)}"
        backend = OdbcRing(from_url(DSN), RingTarget(QueueNames("dbq_live", name), size, message_bytes))
        backend.apply()
        options.setdefault("pop_timeout", 0.1)
        q = connect(DSN, name, schema="dbq_live", **options)
        opened.append((q, backend))
        return q

    yield make
    for q, backend in opened:
        q.close()
        backend.teardown()
        backend.close()
