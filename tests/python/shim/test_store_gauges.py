"""The ``idempotency_store_*`` gauges: what the store holds, read from ``idem_health`` at scrape.

The app's role (idem_shim_web, a member of idem_app) is granted idem_health alone where a case
reads it: contract §3a keeps the view from idem_app.

Cases: a store with completed, expired, stale and healed rows shows them per endpoint and status;
a scrape inside the interval reuses the last reading (a new row appears only after it); the
role refused the view (idem_app's own privileges), and a store that is down, each leave ``/metrics`` answering with
``idempotency_store_health_up 0``, one store error of stage ``health`` per reading and no stale
figures; ``IDEM_HEALTH_GAUGE_INTERVAL = 0`` leaves the gauges out.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from idem_shim.routes import decorated_routes
from tests.python.support.shim import APP_ROLE, AppFactory, closed_port, state_of, with_host_port

ORDERS = "POST /orders"
ROLL = "POST /quarantine"


def samples(app_metrics: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text, by (name, sorted labels)."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(app_metrics.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(app: Flask) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text, _ = state_of(app).metrics.render()
    return samples(text)


def claim(admin: str, endpoint: str, *, age: timedelta = timedelta(0), ttl: str = "24 hours") -> int:
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => %s, p_request => %s::jsonb,"
            " p_ttl => %s::interval, p_now => now() - %s::interval)",
            (str(uuid.uuid4()), endpoint, json.dumps({"n": 1}), ttl, age),
        ).fetchone()
    assert row is not None
    return int(row[0])


def let_the_app_read_health(admin: str) -> None:
    """The narrow grant docs/shim.md recommends: the view and its function, nothing else of
    idem_admin (contract §3a keeps idem_health from idem_app)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"GRANT EXECUTE ON FUNCTION idem_health TO {APP_ROLE}")
        conn.execute(f"GRANT SELECT ON idem_health TO {APP_ROLE}")


def complete(admin: str, key_id: int) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}')", (key_id,))


def test_the_gauges_show_what_the_store_holds(fresh_admin_url: str, make_app: AppFactory) -> None:
    for _ in range(3):
        complete(fresh_admin_url, claim(fresh_admin_url, ORDERS))
    for _ in range(2):  # expired two days ago, waiting for the cleanup
        complete(fresh_admin_url, claim(fresh_admin_url, ORDERS, age=timedelta(days=2)))
    claim(fresh_admin_url, ORDERS, age=timedelta(minutes=5))  # a dead holder nobody healed
    claim(fresh_admin_url, ROLL)  # a live holder
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:  # a heal on ROLL
        key = str(uuid.uuid4())
        conn.execute(
            "SELECT idem_claim(p_key => %s, p_user_id => 1, p_endpoint => %s, p_request => '{}',"
            " p_now => now() - interval '2 minutes')",
            (key, ROLL),
        )
        conn.execute("SELECT idem_claim(p_key => %s, p_user_id => 1, p_endpoint => %s, p_request => '{}')", (key, ROLL))

    let_the_app_read_health(fresh_admin_url)
    got = scrape(make_app())
    assert got[("idempotency_store_health_up", ())] == 1.0
    assert got[("idempotency_store_rows", (("endpoint", ORDERS), ("status", "completed")))] == 5.0
    assert got[("idempotency_store_expired_rows", (("endpoint", ORDERS), ("status", "completed")))] == 2.0
    assert got[("idempotency_store_rows", (("endpoint", ORDERS), ("status", "in_flight")))] == 1.0
    assert got[("idempotency_store_stale_in_flight", (("endpoint", ORDERS),))] == 1.0
    assert got[("idempotency_store_stale_in_flight", (("endpoint", ROLL),))] == 0.0
    assert got[("idempotency_store_oldest_lease_seconds", (("endpoint", ORDERS),))] >= 300
    assert got[("idempotency_store_oldest_row_seconds", (("endpoint", ORDERS), ("status", "completed")))] >= 2 * 86400
    assert got[("idempotency_store_events_24h", (("endpoint", ROLL), ("event", "stale_heal")))] == 1.0
    assert not any(name == "idempotency_store_errors_total" for name, _ in got)


def test_a_scrape_inside_the_interval_reuses_the_last_reading(fresh_admin_url: str, make_app: AppFactory) -> None:
    complete(fresh_admin_url, claim(fresh_admin_url, ORDERS))
    let_the_app_read_health(fresh_admin_url)
    app = make_app(IDEM_HEALTH_GAUGE_INTERVAL=0.5)
    rows = ("idempotency_store_rows", (("endpoint", ORDERS), ("status", "completed")))
    first = scrape(app)
    took = first[("idempotency_store_health_query_seconds", ())]
    complete(fresh_admin_url, claim(fresh_admin_url, ORDERS))
    assert scrape(app)[rows] == 1.0, "a scrape within the interval read the table again"
    time.sleep(0.6)  # past the gauge interval (0.5 s): the interval is what is tested
    again = scrape(app)
    assert again[rows] == 2.0
    assert 0 < took < 2.0


def test_a_role_refused_the_view_counts_a_store_error_and_metrics_still_answer(
    fresh_admin_url: str, make_app: AppFactory
) -> None:
    complete(fresh_admin_url, claim(fresh_admin_url, ORDERS))
    # The app's role as contract §3a leaves it: a member of idem_app, which may not read idem_health.
    app = make_app(IDEM_HEALTH_GAUGE_INTERVAL=0.2)
    error = ("idempotency_store_errors_total", (("endpoint", ""), ("stage", "health")))
    got = scrape(app)
    assert got[("idempotency_store_health_up", ())] == 0.0
    assert not any(name.startswith("idempotency_store_rows") for name, _ in got)
    # The error is counted as the reading fails, after the counters of this scrape were written.
    assert scrape(app)[error] == 1.0, "a reading inside the interval is not a second error"
    time.sleep(0.3)  # past the gauge interval (0.2 s): the interval is what is tested
    scrape(app)
    assert scrape(app)[error] == 2.0


def test_a_store_that_is_down_leaves_metrics_answering(fresh_admin_url: str, make_app: AppFactory) -> None:
    dead = with_host_port(fresh_admin_url, "127.0.0.1", closed_port())
    app = make_app(url=dead, IDEM_CHECK_SCHEMA=False)
    started = time.monotonic()
    got = scrape(app)
    assert time.monotonic() - started < 5.0, "a scrape waited for the store"
    assert got[("idempotency_store_health_up", ())] == 0.0
    assert scrape(app)[("idempotency_store_errors_total", (("endpoint", ""), ("stage", "health")))] == 1.0


def test_interval_zero_leaves_the_gauges_out(make_app: AppFactory) -> None:
    got = scrape(make_app(IDEM_HEALTH_GAUGE_INTERVAL=0))
    assert not any(name.startswith("idempotency_store_") and "errors" not in name for name, _ in got)


def test_the_reference_apps_role_reads_the_store_gauges(fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/raptor's init-db gives raptor_web what the gauges read (idem_monitor), and no more."""
    from examples.raptor import create_app
    from examples.raptor.cli import app_url, init_db

    init_db(fresh_admin_url)
    monkeypatch.setenv("DATABASE_URL", app_url(fresh_admin_url))
    app = create_app({"IDEM_HEALTH_GAUGE_INTERVAL": 0.001})
    try:
        found = samples(app.test_client().get("/metrics").get_data())
        assert found[("idempotency_store_health_up", ())] == 1.0
        with psycopg.connect(app_url(fresh_admin_url)) as conn:
            for query in ("SELECT * FROM idem_inspect(%s)", "CALL idem_cleanup()", "SELECT idem_erase_user(1)"):
                with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(query, (str(uuid.uuid4()),) if "%s" in query else None)
    finally:
        state_of(app).store.close()


GAUGES = (
    "idempotency_store_rows",
    "idempotency_store_expired_rows",
    "idempotency_store_oldest_row_seconds",
    "idempotency_store_stale_in_flight",
    "idempotency_store_oldest_lease_seconds",
    "idempotency_store_events_24h",
)


def test_made_up_endpoints_are_one_other_series(
    fresh_admin_url: str, fresh_app_role_url: str, make_app: AppFactory
) -> None:
    """Issue 39 F5: idem_app's one statement of 2,000 claims under made-up endpoints (SQL injection in
    a handler) makes no series of theirs: every gauge has at most one series per scope the app
    declares, plus one ``other``, whatever the table holds."""
    with psycopg.connect(fresh_app_role_url, autocommit=True) as conn:
        conn.execute(
            "SELECT public.idem_claim(p_key => gen_random_uuid()::text, p_user_id => 1,"
            " p_endpoint => 'POST /api/x' || g, p_request => '{}') FROM generate_series(1, 2000) g"
        )
    complete(fresh_admin_url, claim(fresh_admin_url, ORDERS))
    let_the_app_read_health(fresh_admin_url)
    app = make_app()
    declared = {route.scope for route in decorated_routes(app)}
    assert ORDERS in declared and len(declared) < 20
    got = scrape(app)
    for gauge in GAUGES:
        endpoints = [dict(labels)["endpoint"] for name, labels in got if name == gauge]
        assert set(endpoints) <= declared | {"other"}, f"{gauge} exports endpoints the app never declared"
    assert got[("idempotency_store_rows", (("endpoint", "other"), ("status", "in_flight")))] == 2000.0
    assert got[("idempotency_store_rows", (("endpoint", ORDERS), ("status", "completed")))] == 1.0
    assert len(state_of(app).metrics.render()[0]) < 20_000, "/metrics grew with the made-up endpoints"
