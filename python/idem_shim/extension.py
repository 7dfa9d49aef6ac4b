"""``Idem``: the Flask extension object (Flask's extension guide: no app kept on ``self``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from flask import Flask
from prometheus_client import CollectorRegistry

from .config import Settings
from .metrics import Metrics
from .routes import check_routes, declared_scopes
from .state import EXTENSION_KEY, IdemState, get_state, is_schema_check_deferred
from .store import Store

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["EXTENSION_KEY", "Idem", "IdemState", "get_state"]


class Idem:
    """Put the idempotency store in front of an app's decorated routes.

    ``Idem(app)`` or ``idem = Idem(); idem.init_app(app)`` (app factories). ``registry`` is the
    Prometheus registry for the shim's metrics; by default each app gets its own, reachable as
    ``app.extensions["idem"].metrics.registry``. ``sqlalchemy`` is the app's Flask-SQLAlchemy
    ``db``: inside a decorated route ``db.session`` then runs on the request's connection, so the
    ORM's writes commit with the key (``idem_shim/sqlalchemy.py``, docs/shim.md "ORMs").
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        registry: CollectorRegistry | None = None,
        sqlalchemy: SQLAlchemy | None = None,
    ) -> None:
        self._registry = registry
        self._sqlalchemy = sqlalchemy
        if app is not None:
            self.init_app(app)

    def init_app(
        self, app: Flask, *, registry: CollectorRegistry | None = None, sqlalchemy: SQLAlchemy | None = None
    ) -> IdemState:
        """Read ``IDEM_*`` config, prepare the (lazy) pool, check the schema.

        Raises ``SchemaError`` when the database answers but lacks the SQL API or has an older
        one; a database that does not answer only logs a WARNING (the app still starts). The
        ``flask idempotency`` commands come from the package's ``flask.commands`` entry point, so
        this module never loads the CLI (nor click, nor the schema tool).
        Raises ``ConfigError`` when two routes registered so far share a scope that not both
        declare (``routes.py``); call it after registering the routes to have that at start-up.
        """
        settings = Settings.from_mapping(app.config, require_url=not is_schema_check_deferred())
        check_routes(app)
        state = IdemState(
            settings=settings,
            store=Store(settings),
            metrics=Metrics(registry if registry is not None else self._registry),
        )
        if settings.health_gauge_interval > 0:
            scopes = _gauge_scopes(app, settings)
            state.metrics.watch_store(lambda: state.store.health_rows(scopes()), settings.health_gauge_interval)
        if settings.check_schema and not is_schema_check_deferred():
            state.store.schema.at_startup()
        db = sqlalchemy if sqlalchemy is not None else self._sqlalchemy
        if db is not None:
            from .sqlalchemy import FlaskSQLAlchemy  # SQLAlchemy is imported only by apps that use it

            state.sqlalchemy = FlaskSQLAlchemy(db)
        app.extensions[EXTENSION_KEY] = state
        return state


def _gauge_scopes(app: Flask, settings: Settings) -> Callable[[], list[str]]:
    """What the store gauges name at each reading: the decorated routes' scopes as the URL map
    has them then (routes registered after ``init_app`` included) and ``IDEM_GAUGE_SCOPES``.
    The app is held weakly: its state, which holds this, must not keep it alive."""
    app_ref = weakref.ref(app)

    def scopes() -> list[str]:
        found = app_ref()
        return sorted((declared_scopes(found) if found is not None else frozenset()) | set(settings.gauge_scopes))

    return scopes
