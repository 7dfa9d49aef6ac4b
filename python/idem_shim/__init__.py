"""idem_shim: a Postgres-native Idempotency-Key layer for Flask routes (contract §4).

    from idem_shim import Idem, idempotency_key, connection

    @app.post("/api/trading/orders")
    @require_session
    @idempotency_key(ttl_hours=24, fail_closed=True)
    def place_order():
        conn = connection()          # the transaction idem_complete joins
        conn.execute("INSERT ...")
        return {"order_id": 1}, 201

    Idem(app)                        # after the routes, which it checks

With Flask-SQLAlchemy, ``Idem(app, sqlalchemy=db)``: ``db.session`` in a decorated route then
writes on that same connection (``idem_shim.sqlalchemy``; plain SQLAlchemy: its ``session()``).

Outside a request (a queue consumer, a CLI command): ``idempotent(scope=..., db=pool)`` (jobs.py).

See docs/shim.md.
Everything else stays importable from its module (``idem_shim.errors.StoreUnavailableError``,
``idem_shim.config.Settings``, ``idem_shim.state.get_state``, ...).
"""

from .decorator import idempotency_key
from .errors import (
    ClaimLostError,
    ConfigError,
    DuplicateError,
    IdemError,
    InFlightError,
    KeyMismatchError,
    PreviousFailedError,
)
from .extension import Idem
from .jobs import idempotent
from .scope import attempt, connection, current_key_id, downstream_key, heartbeat

# What a route author uses: the extension, the decorator, the request's connection and its
# lease, what it forwards past the database (downstream_key, attempt), and the errors a route or
# an app factory may catch; idempotent() for code outside a request, and the errors its
# duplicates raise.
__all__ = [
    "ClaimLostError",
    "ConfigError",
    "DuplicateError",
    "Idem",
    "IdemError",
    "InFlightError",
    "KeyMismatchError",
    "PreviousFailedError",
    "attempt",
    "connection",
    "current_key_id",
    "downstream_key",
    "heartbeat",
    "idempotency_key",
    "idempotent",
]
