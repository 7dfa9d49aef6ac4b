"""Raptor's settings: every environment variable the app reads, in one place.

Settings fixed at start-up live in `Settings`; the two kill switches are read on every request
(`new_orders_disabled()` here, `FLAG_IDEMPOTENCY_MIDDLEWARE` in the shim), so an operator can
flip them without a restart wherever the environment can change (a config reload, a test).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

APP_ROLE = "raptor_web"


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw not in ("0", "off", "false", "no")


def prepare_threshold() -> int | None:
    """psycopg's prepare_threshold, shared with the shim (`IDEM_PREPARE_THRESHOLD`).

    PgBouncer in transaction mode cannot keep prepared statements: set it to `none`.
    """
    raw = os.environ.get("IDEM_PREPARE_THRESHOLD")
    if raw is None:
        return 5
    if raw.strip().lower() in ("", "none"):
        return None
    return int(raw)


@dataclass(frozen=True)
class Settings:
    database_url: str
    # RAPTOR_IDEMPOTENCY=off serves the order route undecorated (the benchmark's baseline).
    idempotency: bool
    # Test-only, off by default: RAPTOR_TEST_ORDER_DELAY_MS delays every order; it, or
    # RAPTOR_TEST_HOOKS=1, lets a request choose its own delay (X-Raptor-Test-Delay-Ms).
    test_order_delay_ms: int
    test_hooks: bool
    # How long the app waits to (re)connect its own database connection.
    connect_timeout_s: float
    # Where the order route is mounted. Only the rename test moves it (RAPTOR_ORDERS_RULE=
    # /api/v2/trading/orders): its keys stay, because the route declares its scope.
    orders_rule: str = "/api/trading/orders"
    # The services past the database (examples/simulators): the broker of the live route and
    # Stripe of the checkout route; empty: the live route answers 503, checkout stays local.
    broker_url: str = ""
    stripe_url: str = ""
    downstream_timeout_s: float = 5.0
    # The paper order route's claim option (RAPTOR_ORDER_CLAIM, the chaos soak's CHAOS_CLAIM):
    # "before", the default shape, passes no option; another value is passed to the decorator
    # as claim=, which checks it.
    order_claim: str = "before"

    @classmethod
    def from_env(cls) -> Settings:
        url = os.environ.get("RAPTOR_DATABASE_URL") or os.environ.get("DATABASE_URL") or ""
        return cls(
            database_url=url,
            idempotency=_flag("RAPTOR_IDEMPOTENCY", True),
            test_order_delay_ms=_int("RAPTOR_TEST_ORDER_DELAY_MS", 0),
            test_hooks=_flag("RAPTOR_TEST_HOOKS", False) or _int("RAPTOR_TEST_ORDER_DELAY_MS", 0) > 0,
            connect_timeout_s=float(_int("RAPTOR_DB_CONNECT_TIMEOUT_S", 3)),
            orders_rule=os.environ.get("RAPTOR_ORDERS_RULE", "").strip() or "/api/trading/orders",
            broker_url=os.environ.get("RAPTOR_BROKER_URL", "").rstrip("/"),
            stripe_url=os.environ.get("RAPTOR_STRIPE_URL", "").rstrip("/"),
            downstream_timeout_s=float(_int("RAPTOR_DOWNSTREAM_TIMEOUT_MS", 5000)) / 1000.0,
            order_claim=os.environ.get("RAPTOR_ORDER_CLAIM", "").strip() or "before",
        )


def new_orders_disabled() -> bool:
    """MBT_NEW_ORDERS_DISABLED: the order path's own kill switch, read per request."""
    return _flag("MBT_NEW_ORDERS_DISABLED", False)


def live_trading_enabled() -> bool:
    """RAPTOR_LIVE_TRADING: the live path's gate, off by default, read per request."""
    return _flag("RAPTOR_LIVE_TRADING", False)
