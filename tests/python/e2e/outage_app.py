"""A payments app of one's own, for tests/python/e2e/test_outage.py: every route is one user's
(``E2E_USER_ID``, no session lookup), so a stopped store's server stops nothing but the store and
what shares its database; Raptor looks its sessions up in that database, which would answer first.

    gunicorn -c CONF 'tests.python.e2e.outage_app:create_app()'

Configured from the environment alone (``IDEM_DATABASE_URL`` or ``DATABASE_URL`` and every other
``IDEM_*`` key: nothing is copied into ``app.config``).

- ``POST /orders``: Tier 1 (fail_closed), one row through ``connection()``; ``X-Sleep-Ms`` holds
  it that long first (two at once land on two sync workers).
- ``POST /billing``: Tier 2 (fail_open), one row through ``connection()``: the business tables
  share the store's database.
- ``POST /elsewhere``: Tier 2, one row in ``ELSEWHERE_URL``'s database on a connection of its own:
  the business database is another server.
- ``GET /metrics``: the shim's ``metrics.render()``; ``GET /healthz``: no database.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import psycopg
from flask import Flask, g, request

if TYPE_CHECKING:
    from tests.python.e2e.e2e_harness import Database

INSERT = "INSERT INTO public.outage_items (route, idem_key) VALUES (%s, %s) RETURNING id"
#: What the test creates in the store's database (and in ELSEWHERE_URL's) before serving.
SCHEMA = "CREATE TABLE IF NOT EXISTS public.outage_items (id bigserial PRIMARY KEY, route text, idem_key text)"


def install(db: Database) -> int:
    """The app's table in ``db`` (the store's database, cloned from the e2e template), Raptor's
    app role granted it, and a user: its id, the app's ``E2E_USER_ID``."""
    db.query(SCHEMA)
    db.query("GRANT SELECT, INSERT ON public.outage_items TO raptor_web")
    db.query("GRANT USAGE ON SEQUENCE public.outage_items_id_seq TO raptor_web")
    return db.seed_user().user_id


def create_app() -> Flask:
    from idem_shim import Idem, connection, idempotency_key

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")
    app = Flask("outage_app")
    user_id = int(os.environ["E2E_USER_ID"])
    elsewhere = os.environ.get("ELSEWHERE_URL", "")

    @app.before_request
    def session() -> None:
        g.current_user_id = user_id

    def row(conn: psycopg.Connection[Any], route: str) -> Any:
        found = conn.execute(INSERT, (route, request.headers.get("Idempotency-Key"))).fetchone()
        assert found is not None
        return {"item_id": found[0]}, 201

    @app.post("/orders")
    @idempotency_key(ttl_hours=24, fail_closed=True)
    def orders() -> Any:
        time.sleep(int(request.headers.get("X-Sleep-Ms", "0")) / 1000)
        return row(connection(), "orders")

    @app.post("/billing")
    @idempotency_key(ttl_hours=168, fail_closed=False)
    def billing() -> Any:
        return row(connection(), "billing")

    @app.post("/elsewhere")
    @idempotency_key(ttl_hours=168, fail_closed=False)
    def elsewhere_billing() -> Any:
        with psycopg.connect(elsewhere) as conn:  # committed when the block ends
            return row(conn, "elsewhere")

    @app.get("/metrics")
    def metrics() -> Any:
        body, content_type = app.extensions["idem"].metrics.render()
        return body, 200, {"Content-Type": content_type}

    @app.get("/healthz")
    def healthz() -> Any:
        return {"status": "ok"}

    Idem(app)
    return app
