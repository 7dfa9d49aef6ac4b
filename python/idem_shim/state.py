"""What the shim keeps for one app (``app.extensions["idem"]``) and how code finds it.

Its own module so that everything that needs the state (the decorator, the CLI, the HTTP
answers) imports it from below ``extension.py``, never from the module that builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app

from .config import Settings
from .db import Store
from .errors import NotInitialisedError
from .metrics import Metrics

EXTENSION_KEY = "idem"


@dataclass(slots=True)
class IdemState:
    """Everything the shim keeps for one app, at ``app.extensions["idem"]``."""

    settings: Settings
    store: Store
    metrics: Metrics
    #: routes.check_routes passed on the first tracked request (every route is registered by then).
    routes_checked: bool = False


def get_state(app: Flask | None = None) -> IdemState:
    """The shim's state of ``app`` (default: the current app)."""
    target = app if app is not None else current_app
    state = target.extensions.get(EXTENSION_KEY)
    if not isinstance(state, IdemState):
        raise NotInitialisedError("idem_shim is not initialised on this app: call Idem(app) or Idem().init_app(app)")
    return state
