"""A bench-only Flask app whose one write route is a single INSERT: contract §6's "a route whose
handler is a single INSERT keeps >= 0.6x" (Raptor's order route does much more per request).

    gunicorn -c examples/raptor/gunicorn.conf.py 'bench.app:create_app()'

POST /bench/items with a JSON body inserts one row into bench_items and answers 201 with its id.
BENCH_IDEMPOTENCY=off serves it undecorated (the baseline): the same INSERT in one transaction
on a pool connection of the same kind. Decorated, the INSERT runs in the claim's transaction and
commits together with idem_complete, as in any idem route. Every request is user 1's (no
session lookup, so the route costs only the INSERT and whatever idempotency adds).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from flask import Flask, g, jsonify, request
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

INSERT = "INSERT INTO bench_items (payload) VALUES (%s) RETURNING id"
SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
)
"""


def worker_connection(url: str) -> Callable[[], Any]:
    """The undecorated routes' connections: `with own() as conn:` commits on a clean exit. One
    small pool per worker, built on first use after gunicorn's fork (bench/peers' apps too)."""
    pools: dict[int, ConnectionPool] = {}

    def own_connection() -> Any:
        pool = pools.get(os.getpid())
        if pool is None:
            pool = pools[os.getpid()] = ConnectionPool(
                url, min_size=1, max_size=2, kwargs={"prepare_threshold": 5}, open=True
            )
        return pool.connection()

    return own_connection


def create_app() -> Flask:
    from idem_shim import Idem, connection, idempotency_key

    app = Flask("bench")
    url = os.environ["DATABASE_URL"]
    app.config["IDEM_DATABASE_URL"] = url
    decorated = os.environ.get("BENCH_IDEMPOTENCY", "on").lower() not in ("0", "off", "false", "no")
    Idem(app)
    own_connection = worker_connection(url)

    @app.before_request
    def user() -> None:
        g.current_user_id = 1

    def insert_decorated() -> Any:
        (item_id,) = connection().execute(INSERT, (Jsonb(request.get_json()),)).fetchone()  # type: ignore[misc]
        return jsonify(id=item_id), 201

    def insert_plain() -> Any:
        with own_connection() as conn:  # commits on a clean exit
            (item_id,) = conn.execute(INSERT, (Jsonb(request.get_json()),)).fetchone()
        return jsonify(id=item_id), 201

    if decorated:
        view = idempotency_key(ttl_hours=24, fail_closed=True)(insert_decorated)
    else:
        view = insert_plain
    app.add_url_rule("/bench/items", endpoint="items", view_func=view, methods=["POST"])

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify(status="ok", idempotency="on" if decorated else "off")

    return app
