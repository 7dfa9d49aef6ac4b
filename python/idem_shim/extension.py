"""``Idem``: the Flask extension object (Flask's extension guide: no app kept on ``self``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from flask import Flask, current_app
from prometheus_client import CollectorRegistry

from .config import Settings
from .db import Store
from .errors import NotInitialisedError, SchemaError
from .metrics import Metrics

EXTENSION_KEY = "idem"


@dataclass(slots=True)
class IdemState:
    """Everything the shim keeps for one app, at ``app.extensions["idem"]``."""

    settings: Settings
    store: Store
    metrics: Metrics


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
        from .cli import idempotency_cli  # the CLI imports this module

        settings = Settings.from_mapping(app.config)
        state = IdemState(
            settings=settings,
            store=Store(settings),
            metrics=Metrics(registry if registry is not None else self._registry),
        )
        if settings.check_schema:
            try:
                state.store.check_schema_at_startup()
            except SchemaError:
                if not _cli_brings_the_schema():
                    raise
        app.extensions[EXTENSION_KEY] = state
        if "idempotency" not in app.cli.commands:
            app.cli.add_command(idempotency_cli)
        return state


def _cli_brings_the_schema() -> bool:
    """True under `flask idempotency migrate|sql|status`: the app must load for the command that
    installs or reports on the schema its start-up check would refuse."""
    args = sys.argv[1:]
    return any(arg == "idempotency" and args[i + 1:i + 2] in (["migrate"], ["sql"], ["status"])
               for i, arg in enumerate(args))


def get_state(app: Flask | None = None) -> IdemState:
    """The shim's state of ``app`` (default: the current app)."""
    target = app if app is not None else current_app
    state = target.extensions.get(EXTENSION_KEY)
    if not isinstance(state, IdemState):
        raise NotInitialisedError(
            "idem_shim is not initialised on this app: call Idem(app) or Idem().init_app(app)"
        )
    return state
