"""Raptor, reduced to what the idempotency layer needs to be shown in its real setting.

    flask --app examples.raptor run                          # development server
    gunicorn -c examples/raptor/gunicorn.conf.py 'examples.raptor:create_app()'
    python -m examples.raptor init-db | seed-user | set-mode | app-url

Routes (contract §5):
    POST   /api/trading/orders             Tier 1: fail-closed, 24 h
    POST   /api/trading/lcc/roll           Tier 1: fail-closed, 24 h
    POST   /api/trading/orm/orders         Tier 1: fail-closed, 24 h; the order on Flask-SQLAlchemy (orm.py)
    POST   /api/trading/live/orders        Tier 1: fail-closed, 24 h, heal, release; to the broker
    POST   /api/billing/checkout-session   Tier 2: fail-open, 7 days
    DELETE /api/trading/orders/<id>        not instrumented (already idempotent)
    GET    /metrics, GET /healthz
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from flask import Flask, jsonify

from .cli import raptor_cli
from .settings import Settings


def create_app(config: dict[str, Any] | None = None) -> Flask:
    # Imported here, not at module level, so that `python -m examples.raptor` can set up
    # a database before the app (and its shim) could start.
    from idem_shim import ConfigError, Idem

    _configure_logging()
    app = Flask("raptor")
    # The shim reads every IDEM_* key from app.config, then from the environment (how gunicorn
    # passes them), so nothing is copied here.
    if config:
        app.config.update(config)
    settings = Settings.from_env()
    if not settings.database_url:
        raise ConfigError(
            "raptor: set DATABASE_URL (or RAPTOR_DATABASE_URL) to the database URL, "
            'e.g. `eval "$(make -s env)"` in the checkout'
        )
    app.config.setdefault("DATABASE_URL", settings.database_url)  # IDEM_DATABASE_URL, if set, wins
    app.extensions["raptor"] = settings
    _register_routes(app, settings)
    # After the routes: init_app refuses two routes sharing a scope at start-up (routes.py).
    # sqlalchemy=: db.session inside a decorated route is on the request's connection (orm.py).
    from .orm import db as orm_db

    Idem(app, sqlalchemy=orm_db)
    app.cli.add_command(raptor_cli)
    return app


def _configure_logging() -> None:
    """One line per record, with level and pid, to stderr (gunicorn's error log), unless the
    host already configured logging. RAPTOR_LOG_LEVEL: INFO by default, so the shim's line
    per duplicate (replay, in flight, ...) shows; its store errors are WARNING and up."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=os.environ.get("RAPTOR_LOG_LEVEL", "INFO").upper(),
            format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s",
        )


def _route(app: Flask, rule: str, view: Callable, methods: list[str], *decorators: Callable | None) -> None:
    """Wrap `view` in `decorators`, outermost first; None entries are left out."""
    wrapped = view
    for decorate in reversed([d for d in decorators if d is not None]):
        wrapped = decorate(wrapped)
    app.add_url_rule(rule, endpoint=view.__name__, view_func=wrapped, methods=methods)


def _register_routes(app: Flask, settings: Settings) -> None:
    import psycopg

    from idem_shim import idempotency_key
    from idem_shim.queries import SCHEMA_VERSION

    from . import billing, db, live, orm, trading
    from .auth import live_gates, order_gates, require_session

    tier1 = idempotency_key(ttl_hours=24, fail_closed=True)
    # The order route declares its scope, so moving it (/api/v2/...) keeps every key a client
    # is still retrying. The scope is the default it had before it was declared, so keys taken
    # before that deploy keep working too. It keeps a failed key failed (on_failure "keep"):
    # an order that failed half-way may already be known to a risk check, a notification or
    # (on the live path) a broker, so its retry must not place it a second time; the client
    # gets 409 idempotency_previous_failed and decides with a new key.
    # RAPTOR_IDEMPOTENCY=off serves the order route undecorated: the same handler and the
    # same transaction handling, for the benchmark's side-by-side comparison.
    # RAPTOR_ORDER_CLAIM picks the route's claim shape (the chaos soak's CHAOS_CLAIM): every
    # effect of a paper order is in this database, so it may run under claim="in_transaction".
    claim = {} if settings.order_claim == "before" else {"claim": settings.order_claim}
    order_layer = (
        idempotency_key(ttl_hours=24, fail_closed=True, scope="POST /api/trading/orders", **claim)
        if settings.idempotency
        else None
    )

    _route(app, settings.orders_rule, trading.place_order, ["POST"], require_session, order_gates, order_layer)
    _route(app, "/api/trading/lcc/roll", trading.roll_lcc, ["POST"], require_session, order_gates, tier1)
    # The paper order again, on Flask-SQLAlchemy: db.session.commit() commits with the key.
    orm_layer = idempotency_key(ttl_hours=24, fail_closed=True)
    _route(app, orm.RULE, orm.place_order_orm, ["POST"], require_session, order_gates, orm_layer)
    # The broker dedupes on client_order_id = downstream_key("broker"), so healing a dead
    # worker's key is safe here (quarantine would block the order until the key expires), and
    # so is releasing a failed one (on_failure "release"): a failure after the broker filled
    # (the database lost as the order is recorded) is retried and adopts the fill, where "keep"
    # told the client 409 previous_failed and left the fill named by no key.
    # required=True: without a key there is nothing to forward, so no order may be sent.
    _route(
        app,
        "/api/trading/live/orders",
        live.place_live_order,
        ["POST"],
        require_session,
        live_gates,
        idempotency_key(ttl_hours=24, fail_closed=True, on_stale="heal", on_failure="release", required=True),
    )
    # Checkout releases a failed key (on_failure "release"): its only writes are in this
    # database and roll back on a 5xx, and the provider's call carries its own idempotency key,
    # so a retry with the same key may run again and the client following the IETF draft
    # (409 means "retry") is not stuck with a failure.
    _route(
        app,
        "/api/billing/checkout-session",
        billing.create_checkout_session,
        ["POST"],
        require_session,
        idempotency_key(ttl_hours=168, fail_closed=False, on_failure="release"),
    )
    _route(app, "/api/trading/orders/<int:order_id>", trading.cancel_order, ["DELETE"], require_session)

    @app.errorhandler(psycopg.OperationalError)
    @app.errorhandler(psycopg.errors.ReadOnlySqlTransaction)
    def database_unavailable(exc: psycopg.Error):
        # The database went away under a handler, or the server it reached is a standby now
        # (25006, after a failover; the connection is dropped): the shim has already failed or
        # left the key as the case needs. A retryable 503, never a 500.
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            db.drop_app_connection()
        app.logger.warning(
            "database unavailable: %s", str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        return jsonify(error="service_unavailable"), 503, {"Retry-After": "1"}

    orm.init_app(app, settings.database_url, database_unavailable)

    @app.get("/healthz")
    def healthz():
        try:
            # The catalog, not idem_schema_version(): the app role executes the request path only.
            version, _member = db.fetch_one(SCHEMA_VERSION)
        except db.UNAVAILABLE as exc:
            return jsonify(status="unavailable", error=type(exc).__name__), 503
        return jsonify(status="ok", idem_schema_version=version, idempotency="on" if settings.idempotency else "off")

    @app.get("/metrics")
    def metrics():
        from prometheus_client import REGISTRY, generate_latest

        # Under gunicorn (PROMETHEUS_MULTIPROC_DIR, gunicorn.conf.py): every worker's counters
        # summed, then the store's gauges; in one process the shim's registry, then the
        # process's own metrics.
        text, content_type = app.extensions["idem"].metrics.render()
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            text += generate_latest(REGISTRY)
        return text, 200, {"Content-Type": content_type}
