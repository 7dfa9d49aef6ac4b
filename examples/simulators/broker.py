"""A broker simulator: Alpaca's order API, reduced to what exactly-once needs (contract §5).

    python -m examples.simulators.broker --port 0 --db broker.sqlite3

- ``POST /v2/orders`` {"symbol", "qty", "side": "buy"|"sell", "type": "market"|"limit",
  "time_in_force", "limit_price"?, "client_order_id"?}: 200 with the order; a market order (or a
  marketable limit) fills at once at the symbol's price and adds one row to the fill ledger.
  A ``client_order_id`` already used is the broker's 422 ``client_order_id must be unique``, and
  nothing is filled: what makes a retried or a zombie's submission harmless.
- ``GET /v2/orders:by_client_order_id?client_order_id=…``: 200 with that order, 404 if none.
- ``GET /_sim/fills``, ``GET /_sim/orders``: the ledger and the orders, for checkers.
- ``POST /_sim/faults``: see common.py (they apply to ``POST /v2/orders``).
Bad input answers as Alpaca does: 400 for a body that is not JSON, 422 for a bad field.
"""

from __future__ import annotations

import decimal
import time
import uuid
from typing import Any

from .common import Answer, Dropped, Request, Route, Store, json_body, serve

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id               TEXT PRIMARY KEY,
    client_order_id  TEXT NOT NULL UNIQUE,
    symbol           TEXT NOT NULL,
    qty              INTEGER NOT NULL,
    side             TEXT NOT NULL,
    type             TEXT NOT NULL,
    time_in_force    TEXT NOT NULL,
    limit_price      TEXT,
    status           TEXT NOT NULL,
    filled_qty       INTEGER NOT NULL,
    filled_avg_price TEXT,
    submitted_at     REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fills (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id         TEXT NOT NULL REFERENCES orders (id),
    client_order_id  TEXT NOT NULL,
    symbol           TEXT NOT NULL,
    qty              INTEGER NOT NULL,
    side             TEXT NOT NULL,
    price            TEXT NOT NULL,
    filled_at        REAL NOT NULL
);
"""

#: Deterministic prices, as Raptor's paper instruments; an unknown symbol is Alpaca's 422.
PRICES = {"AAPL": "190.00", "MSFT": "410.00", "SPY": "520.00", "TSLA": "240.00", "NVDA": "880.00"}
MAX_CLIENT_ORDER_ID = 128
INSERT_ORDER = (
    "INSERT INTO orders (id, client_order_id, symbol, qty, side, type, time_in_force, limit_price, status,"
    " filled_qty, filled_avg_price, submitted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SELECT_ORDERS = (
    "SELECT id, client_order_id, symbol, qty, side, type, time_in_force, limit_price, status,"
    " filled_qty, filled_avg_price, submitted_at FROM orders"
)
MAX_QTY = 1_000_000


def unprocessable(message: str, code: int = 40010000) -> Answer:
    return 422, {"code": code, "message": message}, {}


def bad_request(message: str) -> Answer:
    return 400, {"code": 40010000, "message": message}, {}


def _order_view(row: tuple[Any, ...]) -> dict[str, Any]:
    (oid, coid, symbol, qty, side, type_, tif, limit, status, filled_qty, avg, submitted) = row
    return {
        "id": oid,
        "client_order_id": coid,
        "symbol": symbol,
        "qty": str(qty),
        "side": side,
        "type": type_,
        "time_in_force": tif,
        "limit_price": limit,
        "status": status,
        "filled_qty": str(filled_qty),
        "filled_avg_price": avg,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(submitted)),
    }


def _qty(value: Any) -> int | None:
    """Alpaca takes qty as a number or a numeric string; whole shares here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and 0 < value <= MAX_QTY else None


def _price(value: Any) -> decimal.Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        price = decimal.Decimal(str(value))
    except decimal.InvalidOperation:
        return None
    return price if price.is_finite() and price > 0 else None


def routes(store: Store) -> dict[tuple[str, str], Route]:
    db = store.db

    def submit(req: Request) -> Answer:
        body = json_body(req)
        if not isinstance(body, dict):
            return bad_request("request body must be a JSON object")
        symbol, side = body.get("symbol"), body.get("side")
        type_, tif = body.get("type", "market"), body.get("time_in_force", "day")
        coid = body.get("client_order_id", str(uuid.uuid4()))
        qty = _qty(body.get("qty"))
        if not isinstance(symbol, str) or symbol.upper() not in PRICES:
            return unprocessable(
                f"could not find asset {symbol!r}" if isinstance(symbol, str) else "symbol is required"
            )
        if qty is None:
            return unprocessable(f"qty must be a whole number of shares in 1..{MAX_QTY}")
        if side not in ("buy", "sell"):
            return unprocessable("side must be buy or sell")
        if type_ not in ("market", "limit"):
            return unprocessable("type must be market or limit")
        if tif not in ("day", "gtc", "ioc", "fok", "opg", "cls"):
            return unprocessable("invalid time_in_force")
        if not isinstance(coid, str) or not coid or len(coid) > MAX_CLIENT_ORDER_ID:
            return unprocessable(f"client_order_id must be a string of 1..{MAX_CLIENT_ORDER_ID} characters")
        limit = _price(body.get("limit_price")) if type_ == "limit" else None
        if type_ == "limit" and limit is None:
            return unprocessable("limit_price is required for a limit order and must be positive")
        symbol = symbol.upper()
        price = decimal.Decimal(PRICES[symbol])
        fills = limit is None or (side == "buy" and limit >= price) or (side == "sell" and limit <= price)
        with store.lock:
            if store.faults.take("fail_before_accept"):
                return 503, {"code": 50300000, "message": "service unavailable (simulated)"}, {"Retry-After": "1"}
            if db.execute("SELECT 1 FROM orders WHERE client_order_id = ?", (coid,)).fetchone():
                return unprocessable("client_order_id must be unique", 40010001)
            oid = str(uuid.uuid4())
            now = time.time()
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                INSERT_ORDER,
                (
                    oid,
                    coid,
                    symbol,
                    qty,
                    side,
                    type_,
                    tif,
                    None if limit is None else str(limit),
                    "filled" if fills else "new",
                    qty if fills else 0,
                    str(price) if fills else None,
                    now,
                ),
            )
            if fills:
                db.execute(
                    "INSERT INTO fills (order_id, client_order_id, symbol, qty, side, price, filled_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (oid, coid, symbol, qty, side, str(price), now),
                )
            db.execute("COMMIT")
            drop = store.faults.take("drop_after_accept")
            delay = store.faults.take_delay()
            row = db.execute(SELECT_ORDERS + " WHERE id = ?", (oid,)).fetchone()
        if delay:
            time.sleep(delay)
        if drop:
            raise Dropped
        return 200, _order_view(row), {}

    def by_client_order_id(req: Request) -> Answer:
        values = req.query.get("client_order_id") or []
        if len(values) != 1 or not values[0]:
            return unprocessable("client_order_id is required (once)")
        with store.lock:
            row = db.execute(SELECT_ORDERS + " WHERE client_order_id = ?", (values[0],)).fetchone()
        if row is None:
            return 404, {"code": 40410000, "message": f"order not found for {values[0]}"}, {}
        return 200, _order_view(row), {}

    def ledger(_req: Request) -> Answer:
        with store.lock:
            rows = db.execute(
                "SELECT id, order_id, client_order_id, symbol, qty, side, price, filled_at FROM fills ORDER BY id"
            ).fetchall()
        keys = ("id", "order_id", "client_order_id", "symbol", "qty", "side", "price", "filled_at")
        return 200, {"fills": [dict(zip(keys, r, strict=True)) for r in rows]}, {}

    def orders(_req: Request) -> Answer:
        with store.lock:
            rows = db.execute(SELECT_ORDERS + " ORDER BY submitted_at").fetchall()
        return 200, {"orders": [_order_view(r) for r in rows]}, {}

    return {
        ("POST", "/v2/orders"): submit,
        ("GET", "/v2/orders:by_client_order_id"): by_client_order_id,
        ("GET", "/_sim/fills"): ledger,
        ("GET", "/_sim/orders"): orders,
    }


def main(argv: list[str] | None = None) -> None:
    serve("broker", SCHEMA, routes, bad_request, argv)


if __name__ == "__main__":
    main()
