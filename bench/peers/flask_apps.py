"""The Flask apps of idem and idemkit: POST /orders behind the library, POST /orders/raw beside it.

    gunicorn -c examples/raptor/gunicorn.conf.py 'bench.peers.flask_apps:idem_app()'
    gunicorn -c examples/raptor/gunicorn.conf.py 'bench.peers.flask_apps:idemkit_app()'

Both routes run the same handler: bench/peers/orders.py's INSERT on a connection of the worker's
own pool (bench/app.py's), committed before the response, except that idem's decorated route
runs it on idem's connection, in the claim's transaction, as every idem route does. Every
request is user 1's (the scope of its key), as in bench/app.py.
"""

from __future__ import annotations

import json
import os
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
    """idem as its README sets it up: Idem(app), @idempotency_key on the route, g.current_user_id."""
    from idem_shim import Idem, connection, idempotency_key

    @idempotency_key(ttl_hours=24, fail_closed=True)
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
