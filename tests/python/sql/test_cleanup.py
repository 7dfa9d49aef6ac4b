"""
CALL idem_cleanup(): deletes every expired row in committed batches, keeps live ones,
works for the least-privileged app role, and refuses to run inside a transaction block.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.python.support.roles import as_admin_role, as_app_role
from tests.python.support.sqlapi import connect, one

SEED = """
INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                              response_code, response_body, created_at, locked_at, expires_at)
SELECT gen_random_uuid()::text, NULL, 'POST /api/trading/orders', 'h', s.status, 201, '{}'::jsonb,
       now() - s.age, now() - s.age, now() - s.age + interval '1 hour'
  FROM (SELECT CASE WHEN i %% 10 = 0 THEN 'in_flight' ELSE 'completed' END AS status,
               CASE WHEN i <= %(expired)s THEN interval '2 hours' ELSE interval '1 minute' END AS age
          FROM generate_series(1, %(total)s) AS i) s
"""


def seed(url: str, total: int, expired: int) -> None:
    with connect(url) as admin:
        admin.execute(SEED, {"total": total, "expired": expired})


def test_cleanup_deletes_expired_rows_in_batches_and_keeps_live_ones(fresh_admin_url: str) -> None:
    seed(fresh_admin_url, total=2500, expired=2000)
    with connect(as_app_role(fresh_admin_url)) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the request path's role may not
            app.execute("CALL idem_cleanup(p_batch_size => 300)")
    with connect(as_admin_role(fresh_admin_url)) as conn:
        row = conn.execute("CALL idem_cleanup(p_batch_size => 300)").fetchone()
    assert row == {"p_deleted": 2000}
    with connect(fresh_admin_url) as admin:
        left = admin.execute(
            "SELECT count(*) AS n, count(*) FILTER (WHERE expires_at <= now()) AS expired FROM idempotency_keys"
        ).fetchone()
        assert left == {"n": 500, "expired": 0}
        again = admin.execute("CALL idem_cleanup()").fetchone()
        assert again == {"p_deleted": 0}


def test_cleanup_commits_per_batch(fresh_admin_url: str) -> None:
    seed(fresh_admin_url, total=1000, expired=1000)
    with connect(fresh_admin_url) as admin:
        before = one(admin, "SELECT pg_current_xact_id()::text::bigint AS x")["x"]
        admin.execute("CALL idem_cleanup(p_batch_size => 100)")
        after = one(admin, "SELECT pg_current_xact_id()::text::bigint AS x")["x"]
    # 10 full batches and the final empty one each commit their own transaction.
    assert after - before >= 10


def test_cleanup_inside_a_transaction_block_is_refused(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url) as conn:  # not autocommit: psycopg opens a transaction
        with pytest.raises(
            psycopg.errors.InvalidTransactionTermination, match="idem_cleanup: CALL it outside a transaction block"
        ):
            conn.execute("CALL idem_cleanup()")
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:  # psql's BEGIN; CALL ...; ROLLBACK;
        conn.execute("BEGIN")
        with pytest.raises(
            psycopg.errors.InvalidTransactionTermination, match="idem_cleanup: CALL it outside a transaction block"
        ):
            conn.execute("CALL idem_cleanup(p_batch_size => 10)")
        conn.execute("ROLLBACK")
        # and outside one it runs, also over the extended protocol (psycopg with parameters)
        assert conn.execute("CALL idem_cleanup(p_batch_size => %s)", (10,)).fetchone() == (0,)


def test_cleanup_rejects_a_bad_batch_size(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn, pytest.raises(psycopg.Error, match="p_batch_size") as err:
        conn.execute("CALL idem_cleanup(p_batch_size => 0)")
    assert err.value.sqlstate == "IDM00"  # a bad argument


def test_cleanup_pauses_between_batches_and_not_after_the_last(fresh_admin_url: str) -> None:
    seed(fresh_admin_url, total=300, expired=300)
    with connect(fresh_admin_url) as admin:
        started = time.monotonic()
        row = admin.execute("CALL idem_cleanup(p_batch_size => 100, p_pause_ms => 200)").fetchone()
        paused = time.monotonic() - started
        seed(fresh_admin_url, total=300, expired=300)
        started = time.monotonic()
        admin.execute("CALL idem_cleanup(p_batch_size => 100, p_pause_ms => 0)")
        unpaused = time.monotonic() - started
    assert row == {"p_deleted": 300}
    # Three full batches, then an empty one that ends the loop: three pauses of 200 ms.
    assert 0.6 <= paused < 0.6 + 1.0
    assert unpaused < 0.5


def test_cleanup_rejects_a_bad_pause(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn, pytest.raises(psycopg.Error, match="p_pause_ms") as err:
        conn.execute("CALL idem_cleanup(p_pause_ms => -1)")
    assert err.value.sqlstate == "IDM00"


def test_cleanup_keeps_its_pace_and_unpaced_does_not_wait(fresh_admin_url: str) -> None:
    seed(fresh_admin_url, total=3000, expired=3000)
    with connect(fresh_admin_url) as admin:
        started = time.monotonic()
        row = admin.execute("CALL idem_cleanup(p_batch_size => 500, p_max_rows_per_second => 2000)").fetchone()
        paced = time.monotonic() - started
        seed(fresh_admin_url, total=3000, expired=3000)
        started = time.monotonic()
        admin.execute("CALL idem_cleanup(p_batch_size => 500, p_max_rows_per_second => NULL)")
        unpaced = time.monotonic() - started
    assert row == {"p_deleted": 3000}
    # Six full batches of 500 at 2000 rows/s: a quarter of a second each, the empty last one free.
    assert 1.4 <= paced < 1.5 + 1.0, paced
    assert unpaced < 0.6, unpaced


@pytest.mark.parametrize("pace", [0, -1])
def test_cleanup_rejects_a_pace_that_is_not_positive(fresh_admin_url: str, pace: int) -> None:
    with connect(fresh_admin_url) as conn, pytest.raises(psycopg.Error) as err:
        conn.execute("CALL idem_cleanup(p_max_rows_per_second => %s::integer)", (pace,))
    assert err.value.sqlstate == "IDM00"
    assert (
        err.value.diag.message_primary
        == f"idem_cleanup: p_max_rows_per_second must be positive (got {pace}); NULL runs unpaced"
    )


def test_a_pace_too_slow_for_the_daily_run_says_so_and_still_runs(fresh_admin_url: str) -> None:
    seed(fresh_admin_url, total=90_000, expired=90_000)
    notices: list[str] = []
    with connect(as_admin_role(fresh_admin_url)) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        # One batch holds every row, so the 1-row-a-second pace never has to sleep here.
        row = conn.execute("CALL idem_cleanup(p_batch_size => 100000, p_max_rows_per_second => 1)").fetchone()
    assert row == {"p_deleted": 90_000}
    assert notices == [
        "idem_cleanup: at p_max_rows_per_second => 1 the 90000 expired rows take 25:00:00, "
        "longer than the 1 day to the next daily run"
    ], notices
    with connect(fresh_admin_url) as admin:
        notices.clear()
        admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        seed(fresh_admin_url, total=10, expired=10)
        admin.execute("CALL idem_cleanup()")
    assert notices == [], "the default pace fits: no NOTICE"


def test_a_paced_cleanup_yields_at_least_four_times_each_batchs_own_time(fresh_admin_url: str) -> None:
    # A pace no server reaches leaves only the yield: each batch is followed by a sleep of four
    # times its own duration, so the run takes about five times the unpaced one.
    seed(fresh_admin_url, total=20_000, expired=20_000)
    with connect(fresh_admin_url) as admin:
        started = time.monotonic()
        admin.execute("CALL idem_cleanup(p_batch_size => 1000, p_max_rows_per_second => 1000000000)")
        yielding = time.monotonic() - started
        seed(fresh_admin_url, total=20_000, expired=20_000)
        started = time.monotonic()
        admin.execute("CALL idem_cleanup(p_batch_size => 1000, p_max_rows_per_second => NULL)")
        unpaced = time.monotonic() - started
    assert yielding > 2.5 * unpaced, (yielding, unpaced)
