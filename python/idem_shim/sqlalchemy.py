"""SQLAlchemy on the request's connection (contract §4d): the ORM's writes commit with the key.

``Idem(app, sqlalchemy=db)`` (Flask-SQLAlchemy 3.x) makes ``db.session`` inside a decorated route
a ``Session`` on ``idem_shim.connection()``; ``idem_shim.sqlalchemy.session()`` gives one to plain
SQLAlchemy. Outside decorated routes ``db.session`` is the app's own.

It is SQLAlchemy's "joining a Session into an external transaction": a ``Connection`` in a
transaction, and ``Session(bind=connection, join_transaction_mode="create_savepoint")``, so the
ORM's ``commit()`` ends a savepoint, its ``rollback()`` returns to one, and the transaction itself
is the decorator's (its COMMIT carries ``idem_complete``; an exception, a 5xx or a fenced claim
rolls all of it back). The ``Connection`` comes from one ``Engine`` per app whose ``creator`` is
``idem_shim.connection``: the dialect's first-connect queries run once per process, and each
request's check-out costs no round trip. The psycopg connection is idem's own (never a proxy of
it), so that ``Engine``'s dialect may not end or close it: ``_JoinedDialect`` sends no COMMIT,
ROLLBACK or close, and no RELEASE SAVEPOINT either (the decorator's COMMIT releases every
savepoint; a later ``rollback()`` returns to the later savepoint), which keeps the ORM path at one
round trip more than the plain one (the SAVEPOINT).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from .errors import OutsideRequestError
from .scope import RequestScope, connection, current_scope

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy
    from sqlalchemy.util import ScopedRegistry

    from .state import IdemState

__all__ = ["FlaskSQLAlchemy", "session"]

_DIALECT: Final = "idem_shim_joined"
#: What a Flask-SQLAlchemy session factory is given that a plain ``Session`` does not take (its
#: ``db``: the joined session is a plain one, since Flask-SQLAlchemy's ``get_bind`` would route the
#: default bind back to the app's own engine), or that the joined session sets itself.
_NOT_SESSION_OPTIONS: Final = frozenset({"db", "bind", "binds", "join_transaction_mode"})


class _JoinedDialect(PGDialect_psycopg):
    """psycopg's dialect over a connection whose transaction is the decorator's."""

    supports_statement_cache = True

    def on_connect(self) -> None:
        return None  # psycopg's adds a notice handler per check-out, and idem's connections outlive them

    def do_commit(self, dbapi_connection: Any) -> None:
        pass  # the decorator's COMMIT, with idem_complete

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass  # the decorator's, or the ORM's savepoint (ROLLBACK TO SAVEPOINT)

    def do_close(self, dbapi_connection: Any) -> None:
        pass  # idem's pool takes it back

    def do_release_savepoint(self, connection: Any, name: str) -> None:
        pass  # released by the decorator's COMMIT: one round trip less per ORM commit


registry.register(f"postgresql.{_DIALECT}", __name__, "_JoinedDialect")


class Joined:
    """One request's SQLAlchemy ``Connection`` on ``idem_shim.connection()`` and the ``Session``
    joined to it; the decorator closes it when the handler returns (``RequestScope.end_orm``)."""

    __slots__ = ("connection", "session")

    def __init__(self, engine: Engine, options: dict[str, Any]) -> None:
        self.connection: Connection = engine.connect()
        self.connection.begin()  # SQLAlchemy's name for the decorator's transaction: it sends nothing
        self.session = Session(bind=self.connection, join_transaction_mode="create_savepoint", **options)

    def close(self) -> None:
        """Work not committed returns to its savepoint (as a ``Session`` closed rolls back);
        nothing ends the decorator's transaction."""
        try:
            self.session.close()
        finally:
            self.connection.close()


_ENGINE_LOCK: Final = threading.Lock()


def _engine(state: IdemState) -> Engine:
    """The app's ``Engine`` over idem's connections, made on first use."""
    engine = state.sqlalchemy_engine
    if engine is None:
        with _ENGINE_LOCK:
            engine = state.sqlalchemy_engine
            if engine is None:
                engine = create_engine(
                    f"postgresql+{_DIALECT}://",
                    creator=connection,
                    poolclass=NullPool,
                    pool_reset_on_return=None,
                    # hstore's OID would be looked up and registered on one connection only
                    use_native_hstore=False,
                )
                state.sqlalchemy_engine = engine
    return engine


def joined(scope: RequestScope, options: dict[str, Any] | None = None) -> Session:
    """The request's joined ``Session``, made the first time it is asked for."""
    orm = scope.orm
    if not isinstance(orm, Joined):
        orm = scope.orm = Joined(_engine(scope.state), options or {})
    return orm.session


def session() -> Session:
    """A ``Session`` on the request's connection (plain SQLAlchemy 2.x), the same one for every call
    in a request or an ``idempotent()`` call: ``commit()`` ends a savepoint, ``rollback()`` returns
    to it, and what commits commits with the key. Raises ``OutsideRequestError`` elsewhere."""
    scope = current_scope()
    if scope is None:
        raise OutsideRequestError(
            "idem_shim.sqlalchemy.session() works only inside a route wrapped by @idempotency_key "
            "or inside idem_shim.idempotent()"
        )
    return joined(scope)


class FlaskSQLAlchemy:
    """``Idem(app, sqlalchemy=db)``: ``db.session`` in a decorated route is the request's joined
    ``Session`` (with the session options ``db`` was made with), elsewhere the app's own."""

    def __init__(self, db: SQLAlchemy) -> None:
        # Flask-SQLAlchemy's registry of sessions by app context; the joined one is a plain Session
        self.registry = cast("ScopedRegistry[Session]", db.session.registry)
        made: Callable[[], Session] = self.registry.createfunc
        # One db in several apps (an app factory): the app's own factory, wrapped once
        earlier = getattr(made, "__self__", None)
        self.app_session: Callable[[], Session] = earlier.app_session if isinstance(earlier, FlaskSQLAlchemy) else made
        self.options = {
            name: value for name, value in db.session.session_factory.kw.items() if name not in _NOT_SESSION_OPTIONS
        }
        self.registry.createfunc = self._create

    def _create(self) -> Session:
        scope = current_scope()
        if scope is None or scope.state.sqlalchemy is None:  # not a decorated route of a joined app
            return self.app_session()
        return joined(scope, self.options)

    def hide(self) -> Session | None:
        """At the handler's start: set aside a session the app context already holds (a
        ``before_request`` that loaded the user), so ``db.session`` is made anew, joined."""
        if not self.registry.has():
            return None
        outer: Session = self.registry()
        self.registry.clear()
        return outer

    def restore(self, outer: Session | None) -> None:
        """At the handler's end (the joined session closed): the app context's own again."""
        if outer is None:
            self.registry.clear()
        else:
            self.registry.set(outer)
