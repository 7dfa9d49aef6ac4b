"""The Flask apps of idem, idemkit and the floor: POST /orders behind the library, POST /orders/raw beside it.

    gunicorn -c examples/raptor/gunicorn.conf.py 'bench.peers.flask_apps:idem_app()'
    gunicorn -c examples/raptor/gunicorn.conf.py 'bench.peers.flask_apps:idemkit_app()'
    python -m bench.peers.flask_apps floor-store    # the floor's table, in DATABASE_URL's database
    gunicorn -c examples/raptor/gunicorn.conf.py 'bench.peers.flask_apps:floor_app()'

Both routes run the same handler: bench/peers/orders.py's INSERT on a connection of the worker's
own pool (bench/app.py's), committed before the response, except that idem's decorated route
runs it on idem's connection, in the claim's transaction, as every idem route does, and the
floor's in the transaction that commits its completion. Every request is user 1's (the scope of
its key), as in bench/app.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, g, jsonify, request

from bench.app import worker_connection
from bench.peers import orders


def _insert(conn: Any) -> Any:
    orders.handler_work(request.args)
    body = json.dumps(request.get_json())
    (order_id,) = conn.execute(orders.INSERT, (request.headers.get("Idempotency-Key"), body)).fetchone()
    return jsonify(id=order_id), 201


def _orders_app(name: str, protected: Callable[[], Any] | None = None) -> Flask:
    """The app; `protected` is the /orders view (default: the raw view, for a WSGI middleware)."""
    app = Flask(name)
    own_connection = worker_connection(os.environ["DATABASE_URL"])

    def raw() -> Any:
        with own_connection() as conn:  # commits on a clean exit
            return _insert(conn)

    app.add_url_rule(orders.RAW, endpoint="raw", view_func=raw, methods=["POST"])
    app.add_url_rule(orders.PROTECTED, endpoint="protected", view_func=protected or raw, methods=["POST"])

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify(status="ok")

    return app


def idem_app() -> Flask:
    """idem as its README sets it up: Idem(app), @idempotency_key on the route, g.current_user_id.
    BENCH_IDEM_CLAIM (e.g. in_transaction) is passed as the decorator's claim=; unset or "before",
    no option: the default shape."""
    from idem_shim import Idem, connection, idempotency_key

    claim = os.environ.get("BENCH_IDEM_CLAIM", "").strip()
    options: dict[str, Any] = {} if claim in ("", "before") else {"claim": claim}

    @idempotency_key(ttl_hours=24, fail_closed=True, **options)
    def create_order() -> Any:
        return _insert(connection())

    app = _orders_app("idem", create_order)
    app.config["IDEM_DATABASE_URL"] = os.environ["DATABASE_URL"]
    Idem(app)

    @app.before_request
    def user() -> None:
        g.current_user_id = 1

    return app


def idemkit_app() -> Flask:
    """idemkit as its README sets up Flask: WSGIIdempotencyMiddleware around app.wsgi_app with the
    Postgres backend (PostgresBackend.from_url: its asyncpg pool, lease and fencing token) and a
    scope. The middleware acts on every POST that carries a key, so the raw route's path is sent
    around it to the bare app: the raw route pays nothing of idemkit."""
    from idemkit import HttpConfig, WSGIIdempotencyMiddleware
    from idemkit.backends.postgres import PostgresBackend

    app = _orders_app("idemkit")
    bare = app.wsgi_app
    protected = WSGIIdempotencyMiddleware(
        bare,
        backend=PostgresBackend.from_url(os.environ["DATABASE_URL"]),
        config=HttpConfig(scope=lambda req: "1"),  # user 1, as in the other apps
    )

    def dispatch(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        wsgi = bare if environ.get("PATH_INFO") == orders.RAW else protected
        return wsgi(environ, start_response)

    app.wsgi_app = dispatch  # type: ignore[method-assign]
    return app


# The floor: idem's shape in raw SQL, with none of its rules (no claim token, no screens, no
# functions, no metrics, no canonical fingerprint, no replay). Its store is floor_keys, a copy of
# idempotency_keys (bench/sql_path.py's RAW_COPY: the same columns, indexes, constraints, users
# foreign key and fillfactor).
FLOOR_ENDPOINT = f"POST {orders.PROTECTED}"
#: The claim: one statement in autocommit. set_config is volatile, so the CTE is run (not inlined)
#: as the INSERT reads its one row, and the transaction commits with synchronous_commit off, as
#: idem's claim does. Parameters: key, user id, endpoint, request hash.
FLOOR_CLAIM = """\
WITH s AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO floor_keys (idem_key, scope_user_id, scope_endpoint, request_hash, expires_at)
SELECT %s, %s, %s, %s, now() + interval '24 hours' FROM s
ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
RETURNING id"""
#: The completion, in the handler's transaction. Parameters: response code, body, the claim's id.
FLOOR_COMPLETE = """\
UPDATE floor_keys SET status = 'completed', response_code = %s, response_body = %s::jsonb
 WHERE id = %s AND status = 'in_flight'"""


def floor_store(url: str) -> None:
    """floor_keys in url's database (a migrated one: idempotency_keys is what it copies)."""
    from bench.sql_path import make_raw_copy  # the main venv's: the peers' never runs this

    make_raw_copy(url, "floor_keys", "uq_floor_key_user_endpoint")


def floor_app() -> Flask:
    """The least any implementation of idem's contract shape does per request: the claim committed
    before the handler, the completion committed with the handler's writes, one round trip more
    than the raw route. A duplicate key (no row claimed) answers 409 and runs nothing; there is no
    replay, and a handler that fails leaves its key in flight for ever."""
    floor_connection = worker_connection(os.environ["DATABASE_URL"])  # a pool of its own, as idem's

    def create_order() -> Any:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return jsonify(error="Idempotency-Key required"), 400
        request_hash = hashlib.sha256(request.get_data()).hexdigest()
        with floor_connection() as conn:
            conn.autocommit = True  # the claim: one round trip, committed on its own
            claimed = conn.execute(FLOOR_CLAIM, (key, 1, FLOOR_ENDPOINT, request_hash)).fetchone()
            conn.autocommit = False
            if claimed is None:
                return jsonify(error="a request with this Idempotency-Key was already received"), 409
            response, status = _insert(conn)  # BEGIN, the INSERT
            # The completion and the COMMIT leave together: Parse/Bind/Execute twice, one Sync at
            # the block's exit (conn.commit() here would sync twice, a round trip more).
            with conn.pipeline():
                conn.execute(FLOOR_COMPLETE, (status, response.get_data(as_text=True), claimed[0]))
                conn.execute("COMMIT")
        return response, status

    return _orders_app("floor", create_order)


if __name__ == "__main__" and sys.argv[1:] == ["floor-store"]:
    floor_store(os.environ["DATABASE_URL"])
