"""Bearer-token sessions and the order path's gates.

Decorator order on an order route, outermost first:

    @require_session          sets g.current_user_id (and g.trading_mode)
    @order_gates              paper/live gate, MBT_NEW_ORDERS_DISABLED
    @idempotency_key(...)     the shim: claim, replay, complete

The gates sit outside the idempotency layer on purpose: a retry is checked against today's
gates before any stored response is considered, so a replay can never bypass them.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import g, jsonify, request

from . import db
from .settings import live_trading_enabled, new_orders_disabled

SESSION_QUERY = """
SELECT a.user_id, a.trading_mode
  FROM raptor.sessions s
  JOIN raptor.accounts a USING (user_id)
 WHERE s.token_sha256 = %s AND s.expires_at > now()
"""


def new_token() -> tuple[str, str]:
    """A fresh bearer token and the hash that the database stores."""
    token = secrets.token_urlsafe(32)
    return token, token_hash(token)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def error(http_status: int, code: str, headers: dict[str, str] | None = None, /, **extra: Any):
    """A JSON error answer: {"error": code, ...extra}."""
    return jsonify({"error": code, **extra}), http_status, headers or {}


def require_session(view: Callable) -> Callable:
    """401 without a valid bearer token; 503 when the session store cannot be reached."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error(401, "unauthorized", {"WWW-Authenticate": "Bearer"})
        try:
            row = db.fetch_one(SESSION_QUERY, (token_hash(token.strip()),))
        except db.UNAVAILABLE:
            return error(503, "service_unavailable", {"Retry-After": "1"})
        if row is None:
            return error(401, "unauthorized", {"WWW-Authenticate": "Bearer"})
        g.current_user_id, g.trading_mode = row
        return view(*args, **kwargs)

    return wrapper


def order_gates(view: Callable) -> Callable:
    """Refuses new orders before the idempotency layer sees the request.

    - MBT_NEW_ORDERS_DISABLED=1 (read per request): 503 new_orders_disabled;
    - an account in live mode: 403 live_trading_not_enabled (live orders go to the live route,
      behind `live_gates`).
    """

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any):
        if new_orders_disabled():
            return error(
                503,
                "new_orders_disabled",
                {"Retry-After": "60"},
                detail="new orders are disabled by MBT_NEW_ORDERS_DISABLED",
            )
        if g.trading_mode != "paper":
            return error(
                403, "live_trading_not_enabled", detail="this account is in live mode; only paper orders are accepted"
            )
        return view(*args, **kwargs)

    return wrapper


def live_gates(view: Callable) -> Callable:
    """The live route's gates, outside the idempotency layer like `order_gates` (a replay of a
    live order is refused once live trading is switched off):

    - MBT_NEW_ORDERS_DISABLED=1: 503 new_orders_disabled;
    - RAPTOR_LIVE_TRADING off (the default; read per request): 403 live_trading_disabled;
    - an account in paper mode: 403 account_not_live (`raptor set-mode --mode live`).
    """

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any):
        if new_orders_disabled():
            return error(
                503,
                "new_orders_disabled",
                {"Retry-After": "60"},
                detail="new orders are disabled by MBT_NEW_ORDERS_DISABLED",
            )
        if not live_trading_enabled():
            return error(403, "live_trading_disabled", detail="live trading is off (RAPTOR_LIVE_TRADING)")
        if g.trading_mode != "live":
            return error(403, "account_not_live", detail="this account trades paper; switch it to live first")
        return view(*args, **kwargs)

    return wrapper
