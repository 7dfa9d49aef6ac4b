"""A failover as the shim meets it, on one server: the node the pool reaches answers read-only.

A standby, or an old primary come back as one, answers every write with 25006. The database's
``default_transaction_read_only`` gives the same answer (and libpq's ``target_session_attrs=
read-write`` refuses such a server, as it refuses a standby), so no replica is needed here; the
real promotion under load is tests/python/e2e/test_failover.py. Checked: Tier 1 answers 503 with
Retry-After and never runs the handler, Tier 2 runs it undeduplicated with its one WARNING, no
500 ever; the connection that answered 25006 is dropped, not given to the next request; a URL
that names no writable server logs one line (the breaker's ``store_down``) and no traceback,
plus a WARNING at start-up; ``idem migrate`` refuses a read-only server in one line and changes nothing.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import testdb
from tests.python.shim.test_store_down import assert_tiers_while_down
from tests.python.support.shim import make_app, post, server_address

ROOT = Path(__file__).resolve().parents[3]


def new_key() -> str:
    return str(uuid.uuid4())


def make_read_only(admin_url: str, role: str | None = "idem_shim_web") -> None:
    """Every new session of ``role`` (of every role: None) in this database is read-only, which
    is what a standby answers to a write; the superuser's fail-open path stays writable."""
    dbname = sql.Identifier(str(conninfo_to_dict(admin_url)["dbname"]))
    who = sql.SQL("ROLE {} IN ").format(sql.Identifier(role)) if role else sql.SQL("")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER {}DATABASE {} SET default_transaction_read_only = on").format(who, dbname))


def multi_host(url: str, copies: int = 2, **params: str) -> str:
    """libpq's multi-host form of ``url``: the same server named ``copies`` times."""
    host, port = server_address(url)
    return make_conninfo(url, host=",".join([host] * copies), port=",".join([str(port)] * copies), **params)


def test_a_read_only_server_is_the_store_unavailable(
    shim_web_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(shim_web_url, business_url=fresh_admin_url)
    try:
        client = app.test_client()
        assert post(client, "/orders", new_key(), {"item": "before"}).status_code == 201
        # The pool now holds a connection to a writable server; the server turns read-only
        # (as the old primary does when it comes back as a standby) and the pool's new
        # connections get 25006 for every write.
        make_read_only(fresh_admin_url)
        pool = app.extensions["idem"].store.pool
        with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND usename = 'idem_shim_web'"
            )
        app.extensions["shim_test_executions"].count = 0
        app.extensions["idem"].metrics.store_errors.clear()
        lost_before = pool.get_stats().get("connections_lost", 0)
        # the server takes connections and refuses writes: a probe connects, the breaker stays
        # closed, and each request is answered by the server's own 25006 (no pool timeout)
        assert_tiers_while_down(app, fresh_admin_url, caplog, unreachable=False)
        stats = pool.get_stats()
        # every connection that answered 25006 was closed and given back, never reused
        assert stats.get("connections_lost", 0) > lost_before, stats
        assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    finally:
        app.extensions["idem"].store.close()


def test_a_url_naming_only_a_read_only_server(
    shim_web_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_read_only(fresh_admin_url)
    url = multi_host(shim_web_url, target_session_attrs="read-write")
    with caplog.at_level(logging.WARNING, logger="idem_shim"):
        app = make_app(url, business_url=fresh_admin_url)
    try:
        starting = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("reaches only a read-only server" in m for m in starting), starting
        caplog.clear()
        client = app.test_client()
        with caplog.at_level(logging.INFO, logger="idem_shim"):
            answers = [post(client, "/orders", new_key(), {"item": "x"}) for _ in range(3)]
        assert [r.status_code for r in answers] == [503, 503, 503]
        assert all(r.headers["Retry-After"] == "1" for r in answers)
        # no server takes writes: a probe finds none, and one line says so, not one per request
        shim_lines = [r.getMessage().split()[1] for r in caplog.records if r.name == "idem_shim"]
        assert shim_lines == ["store_down"], shim_lines
        assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
        caplog.clear()
        app.extensions["idem"].metrics.store_errors.clear()
        assert_tiers_while_down(app, fresh_admin_url, caplog, unreachable=True, known_down=True)
    finally:
        app.extensions["idem"].store.close()


def test_a_url_naming_a_standby_without_target_session_attrs_warns_at_start_up(
    shim_web_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_read_only(fresh_admin_url)
    with caplog.at_level(logging.WARNING, logger="idem_shim"):
        app = make_app(shim_web_url, business_url=fresh_admin_url)
    try:
        assert any("reaches only a read-only server" in r.getMessage() for r in caplog.records)
        assert post(app.test_client(), "/orders", new_key(), {"item": "x"}).status_code == 503
    finally:
        app.extensions["idem"].store.close()


def test_migrate_refuses_a_read_only_server_and_changes_nothing(admin_url: str) -> None:
    name = f"idem_ro_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin_url, name)
    try:
        make_read_only(url, role=None)
        host, port = server_address(url)
        both = f"postgresql://postgres@{host}:{port},{host}:{port}/{name}"  # the URL form idem migrate takes
        idem = Path(sys.executable).with_name("idem")
        out = subprocess.run([str(idem), "migrate", "--database-url", both], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 1
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert "read-only server" in lines[0] and "nothing was changed" in lines[0]
        with psycopg.connect(url) as conn:
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)
    finally:
        testdb.drop(admin_url, name)
