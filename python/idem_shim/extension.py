"""``Idem``: the Flask extension object (Flask's extension guide: no app kept on ``self``)."""

from __future__ import annotations

import sys

from flask import Flask
from prometheus_client import CollectorRegistry

from .cli import idempotency_cli
from .config import Settings
from .db import Store
from .errors import SchemaError
from .metrics import Metrics
from .state import EXTENSION_KEY, IdemState, get_state

__all__ = ["EXTENSION_KEY", "Idem", "IdemState", "get_state"]


class Idem:
    """Put the idempotency store in front of an app's decorated routes.

    ``Idem(app)`` or ``idem = Idem(); idem.init_app(app)`` (app factories). ``registry`` is the
    Prometheus registry for the shim's metrics; by default each app gets its own, reachable as
    ``app.extensions["idem"].metrics.registry``.
    """

    def __init__(self, app: Flask | None = None, *, registry: CollectorRegistry | None = None) -> None:
        self._registry = registry
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, *, registry: CollectorRegistry | None = None) -> IdemState:
        """Read ``IDEM_*`` config, prepare the (lazy) pool, check the schema, add the CLI.

        Raises ``SchemaError`` when the database answers but lacks the SQL API or has an older
        one; a database that does not answer only logs a WARNING (the app still starts).
        """
        settings = Settings.from_mapping(app.config)
        state = IdemState(
            settings=settings,
            store=Store(settings),
            metrics=Metrics(registry if registry is not None else self._registry),
        )
        if settings.health_gauge_interval > 0:
            state.metrics.watch_store(state.store.health_rows, settings.health_gauge_interval)
        if settings.check_schema:
            try:
                state.store.check_schema_at_startup()
            except SchemaError:
                if not _cli_brings_the_schema():
                    raise
        app.extensions[EXTENSION_KEY] = state
        # Attached to this app's own CLI (not a ``flask.commands`` entry point): the group is
        # there only for apps that use idem, and ``app.test_cli_runner()`` finds it.
        if "idempotency" not in app.cli.commands:
            app.cli.add_command(idempotency_cli)
        return state


def _cli_brings_the_schema() -> bool:
    """True under `flask idempotency migrate|sql|status`: the app must load for the command that
    installs or reports on the schema its start-up check would refuse."""
    args = sys.argv[1:]
    return any(
        arg == "idempotency" and args[i + 1 : i + 2] in (["migrate"], ["sql"], ["status"]) for i, arg in enumerate(args)
    )
