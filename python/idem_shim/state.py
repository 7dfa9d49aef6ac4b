"""What the shim keeps for one app (``app.extensions["idem"]``) and how code finds it.

Its own module so that everything that needs the state (the decorator, the CLI, the HTTP
answers) imports it from below ``extension.py``, never from the module that builds it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from flask import Flask, current_app

from .config import Settings
from .durations import HandlerDurations
from .errors import NotInitialisedError
from .metrics import Metrics
from .store import Store

if TYPE_CHECKING:
    from sqlalchemy import Engine


class JoinedSessions(Protocol):
    """Flask-SQLAlchemy's sessions joined in decorated routes (``sqlalchemy.FlaskSQLAlchemy``):
    the app context's own session set aside while the view runs, and put back after it."""

    def hide(self) -> object: ...

    def restore(self, outer: Any) -> None: ...


EXTENSION_KEY = "idem"

#: Set while a command that installs or reports on the schema loads the app (``idem migrate``,
#: ``status`` under ``flask idempotency``, ``idem openapi``): the start-up check would refuse the
#: very database the command is there to fix, and a command that never connects needs no URL.
_SCHEMA_CHECK_DEFERRED: ContextVar[bool] = ContextVar("idem_schema_check_deferred", default=False)


@contextmanager
def schema_check_deferred() -> Iterator[None]:
    """Within it, ``init_app`` does not check the SQL API (the caller is about to install it, or
    never connects) and takes a missing database URL as ``""`` (the command says what it needs)."""
    token = _SCHEMA_CHECK_DEFERRED.set(True)
    try:
        yield
    finally:
        _SCHEMA_CHECK_DEFERRED.reset(token)


def is_schema_check_deferred() -> bool:
    return _SCHEMA_CHECK_DEFERRED.get()


@dataclass(slots=True)
class IdemState:
    """Everything the shim keeps for one app, at ``app.extensions["idem"]``."""

    settings: Settings
    store: Store
    metrics: Metrics
    #: what this process's claimed executions took, per scope: a duplicate's Retry-After
    durations: HandlerDurations = field(default_factory=HandlerDurations)
    #: routes.check_routes passed on the first tracked request (every route is registered by then).
    routes_checked: bool = False
    #: ``Idem(app, sqlalchemy=db)``: Flask-SQLAlchemy's session joined in decorated routes
    sqlalchemy: JoinedSessions | None = None
    #: the Engine over idem's connections that joined sessions use (sqlalchemy.py), once made
    sqlalchemy_engine: Engine | None = None
    #: the routes already warned of a claimed request that ran nothing on its connection
    unjoined_warned: set[str] = field(default_factory=set)
    unjoined_lock: threading.Lock = field(default_factory=threading.Lock)


def get_state(app: Flask | None = None) -> IdemState:
    """The shim's state of ``app`` (default: the current app)."""
    target = app if app is not None else current_app
    state = target.extensions.get(EXTENSION_KEY)
    if not isinstance(state, IdemState):
        raise NotInitialisedError("idem_shim is not initialised on this app: call Idem(app) or Idem().init_app(app)")
    return state
