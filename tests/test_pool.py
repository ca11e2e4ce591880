"""The operator's connection pool (dbq.connection.pool) on the real PostgreSQL: a bound per
database, reuse, and no broken connection handed out; and calls the database rolled back made
again (dbq.connection.odbc.retried)."""

from __future__ import annotations

import time
import zlib

import pyodbc
import pytest

from dbq.backends.odbc_ring import OdbcRing
from dbq.connection import from_url, pool
from dbq.connection.odbc import RETRIES, connect, retried, rolled_back
from dbq.contract.ring import RingTarget
from dbq.errors import QueueUnavailable
from dbq.names import QueueNames


def backend_pid(conn) -> int:
    return int(conn.cursor().execute("SELECT pg_backend_pid()").fetchval())


def test_a_database_gets_at_most_limit_connections_and_idle_ones_are_reused(postgres):
    settings = from_url(postgres.url)
    lender = pool.OdbcPool(limit=2, wait_s=0.3)
    first, second = lender.take(settings), lender.take(settings)
    with pytest.raises(
        QueueUnavailable, match=r"2 connections to this database stayed busy.*DBQ_DB_CONNECTIONS"
    ):
        lender.take(settings)
    pid = backend_pid(first)
    lender.give(settings, first)
    again = lender.take(settings)
    assert backend_pid(again) == pid  # the idle one, not a new one
    lender.give(settings, again)
    lender.give(settings, second, broken=True)  # closed, and its slot is free again
    assert lender.idle(settings) == 1
    third, fourth = lender.take(settings), lender.take(settings)
    for conn in (third, fourth):
        lender.give(settings, conn)


def test_a_connection_that_broke_while_idle_is_replaced(postgres):
    settings = from_url(postgres.url)
    lender = pool.OdbcPool(limit=1, wait_s=0.3)
    conn = lender.take(settings)
    pid = backend_pid(conn)
    lender.give(settings, conn)
    killer = connect(settings)
    killer.cursor().execute("SELECT pg_terminate_backend(?)", pid).fetchall()
    killer.close()
    fresh = lender.take(settings)
    assert backend_pid(fresh) != pid
    lender.give(settings, fresh)


def test_the_operator_backends_share_one_connection_per_tick(postgres):
    """With the pool on, a ring backend's stats and repair go over its one lent connection."""
    settings = from_url(postgres.url)
    pool.enable(3)
    try:
        lender = pool.shared()
        assert lender is not None
        backend = OdbcRing(settings, RingTarget(QueueNames("pooled", "q"), 64, 64))
        backend.apply()
        stats = backend.measure()
        backend.cleanup(10.0)
        backend.record_sample(stats, 3600)
        assert lender.idle(settings) == 0  # one borrowed: the backend's
        backend.close()
        assert lender.idle(settings) == 1  # given back, open, for the next tick
        backend = OdbcRing(settings, RingTarget(QueueNames("pooled", "q"), 64, 64))
        assert backend.measure().depth == 0 and lender.idle(settings) == 0
        backend.teardown()
        backend.close()
    finally:
        pool.disable()


def test_a_connection_past_its_age_is_closed_on_return(postgres):
    settings = from_url(postgres.url)
    lender = pool.OdbcPool(limit=1, wait_s=0.3, max_age_s=0.0)
    conn = lender.take(settings)
    pid = backend_pid(conn)
    lender.give(settings, conn)
    assert lender.idle(settings) == 0  # closed, not kept
    fresh = lender.take(settings)
    assert backend_pid(fresh) != pid
    lender.give(settings, fresh)


def test_after_drop_all_no_earlier_session_is_handed_out_again(postgres):
    """A failure (a revoked password, say) drops every pooled session: idle ones at once, lent
    ones when they come back, so the next tick authenticates anew."""
    settings = from_url(postgres.url)
    lender = pool.OdbcPool(limit=2, wait_s=0.3)
    idle, lent = lender.take(settings), lender.take(settings)
    pids = {backend_pid(idle), backend_pid(lent)}
    lender.give(settings, idle)
    lender.drop_all()
    assert lender.idle(settings) == 0
    lender.give(settings, lent)
    assert lender.idle(settings) == 0  # closed on its return
    fresh = lender.take(settings)
    assert backend_pid(fresh) not in pids
    lender.give(settings, fresh)


def test_a_queue_gets_its_own_seat_back_while_it_is_free(postgres):
    """With an affinity (the operator passes the queue), the same server session serves a queue
    each time it is idle: each session then caches the plans of a share of the queues only."""
    settings = from_url(postgres.url)
    lender = pool.OdbcPool(limit=3, wait_s=0.3)
    names = (f"s.q{i}" for i in range(100))
    one = next(names)
    other = next(n for n in names if zlib.crc32(n.encode()) % 3 != zlib.crc32(one.encode()) % 3)
    conn = lender.take(settings, affinity=one)
    own = backend_pid(conn)
    lender.give(settings, conn)
    conn = lender.take(settings, affinity=other)
    assert backend_pid(conn) != own  # its own seat is opened, not the idle one of `one`
    lender.give(settings, conn)
    for _ in range(3):
        conn = lender.take(settings, affinity=one)
        assert backend_pid(conn) == own
        lender.give(settings, conn)
    held = lender.take(settings, affinity=one)
    spare = lender.take(settings, affinity=one)  # its seat is lent: another one, at once
    assert backend_pid(held) == own and backend_pid(spare) != own
    third = lender.take(settings)
    with pytest.raises(QueueUnavailable):  # still at most `limit` open
        lender.take(settings, affinity=other)
    for conn in (held, spare, third):
        lender.give(settings, conn)
    assert lender.idle(settings) == 3


def test_a_call_the_database_rolled_back_is_made_again_at_most_retries_times(postgres):
    conn = connect(from_url(postgres.url))
    cur = conn.cursor()
    cur.execute("CREATE TEMP SEQUENCE tries")
    cur.execute(
        "CREATE FUNCTION pg_temp.flaky(fail_until bigint, code text) RETURNS bigint LANGUAGE plpgsql AS $$"
        " DECLARE n bigint := nextval('tries'); BEGIN"
        "   IF n <= fail_until THEN RAISE EXCEPTION 'try %', n USING ERRCODE = code; END IF;"
        "   RETURN n; END $$"
    )

    def flaky(fail_until: int, code: str = "40001") -> int:
        return int(conn.cursor().execute("SELECT pg_temp.flaky(?, ?)", fail_until, code).fetchval())

    def tries() -> int:
        return int(conn.cursor().execute("SELECT last_value FROM tries").fetchval())

    assert retried(lambda: flaky(3)) == 4  # three serialization failures, then it went through
    never = tries() + 100  # a bound no try of the two below reaches
    with pytest.raises(pyodbc.Error) as failed:  # rolled back every time: the last error propagates
        retried(lambda: flaky(never, "40P01"))
    assert rolled_back(failed.value) and tries() == 4 + RETRIES + 1
    with pytest.raises(pyodbc.Error) as other:  # any other error at once
        retried(lambda: flaky(never, "22012"))
    assert not rolled_back(other.value) and tries() == 4 + RETRIES + 2
    conn.close()


def test_a_deadline_of_minutes_keeps_sleeping_at_its_ceiling_whatever_the_number_of_tries():
    """A push waiting minutes for room makes thousands of tries: the doubling stops at the
    ceiling instead of overflowing a float."""
    from dbq.client.waiting import MAX_SLEEP_S, Deadline

    deadline = Deadline(600.0, tries=5_000)
    started = time.monotonic()
    assert deadline.wait() is True
    assert time.monotonic() - started < MAX_SLEEP_S + 0.05
