"""idem_shim: a Postgres-native Idempotency-Key layer for Flask routes (SPEC §4).

    from idem_shim import Idem, idempotency_key, connection

    idem = Idem(app)

    @app.post("/api/trading/orders")
    @require_session
    @idempotency_key(ttl_hours=24, fail_closed=True)
    def place_order():
        conn = connection()          # the transaction idem_complete joins
        conn.execute("INSERT ...")
        return {"order_id": 1}, 201

See docs/shim.md.
"""

from .config import KILL_SWITCH_ENV, ConfigVars, Settings
from .decorator import endpoint_label, idempotency_key
from .errors import (
    ClaimLostError,
    ConfigError,
    IdemError,
    NotInitialisedError,
    OutsideRequestError,
    ResponseRefusedError,
    SchemaError,
    StoreUnavailableError,
)
from .extension import Idem, IdemState, get_state
from .metrics import Metrics
from .scope import connection, current_key_id, heartbeat

__all__ = [
    "KILL_SWITCH_ENV",
    "ClaimLostError",
    "ConfigError",
    "ConfigVars",
    "Idem",
    "IdemError",
    "IdemState",
    "Metrics",
    "NotInitialisedError",
    "OutsideRequestError",
    "ResponseRefusedError",
    "SchemaError",
    "Settings",
    "StoreUnavailableError",
    "connection",
    "current_key_id",
    "endpoint_label",
    "get_state",
    "heartbeat",
    "idempotency_key",
]
