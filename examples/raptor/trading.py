"""Trading handlers: paper orders, their cancellation, and LCC rolls.

Each handler validates first and writes last, all inside `business_transaction()`: a refused
request (unknown symbol, not enough cash) writes nothing and answers 4xx, which the
idempotency layer stores and replays like any other answer below 500. Every write of a
request — the order, the cash, the position, the business audit row — lands in the same
statement or transaction, so a request killed half-way leaves nothing behind.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from flask import current_app, g, jsonify, request

from .auth import error
from .db import business_transaction

MAX_QTY = 1_000_000

# One round trip: lock the user's account row (which serialises all of the user's money and
# position changes) and read what validation needs.
LOCK_ACCOUNT = """
SELECT a.cash_cents, i.price_cents, COALESCE(p.qty, 0) AS position_qty
  FROM raptor.accounts a
  LEFT JOIN raptor.instruments i ON i.symbol = %(symbol)s
  LEFT JOIN raptor.positions p ON p.user_id = a.user_id AND p.symbol = %(symbol)s
 WHERE a.user_id = %(user_id)s
   FOR UPDATE OF a
"""

# One round trip for the whole fill. A buy upserts the position; a sell (already checked
# against the locked position) decrements it.
_FILL = """
WITH o AS (
    INSERT INTO raptor.paper_orders
        (user_id, symbol, side, qty, order_type, limit_price_cents, fill_price_cents,
         status, client_key)
    VALUES (%(user_id)s, %(symbol)s, %(side)s, %(qty)s, %(order_type)s, %(limit_price_cents)s,
            %(price_cents)s, 'filled', %(client_key)s)
    RETURNING id
), c AS (
    UPDATE raptor.accounts SET cash_cents = cash_cents + %(cash_delta)s
     WHERE user_id = %(user_id)s
    RETURNING cash_cents
), p AS (
    {position}
), a AS (
    INSERT INTO public.audit_log (user_id, action, context)
    SELECT %(user_id)s, 'paper_order_filled',
           jsonb_build_object('order_id', o.id, 'symbol', %(symbol)s::text,
                              'side', %(side)s::text, 'qty', %(qty)s::bigint,
                              'fill_price_cents', %(price_cents)s::bigint,
                              'cash_delta_cents', %(cash_delta)s::bigint)
      FROM o
)
SELECT o.id, c.cash_cents, p.qty FROM o, c, p
"""
FILL_BUY = _FILL.format(
    position="""
    INSERT INTO raptor.positions AS pos (user_id, symbol, qty)
    VALUES (%(user_id)s, %(symbol)s, %(qty)s)
    ON CONFLICT (user_id, symbol) DO UPDATE SET qty = pos.qty + EXCLUDED.qty
    RETURNING qty"""
)
FILL_SELL = _FILL.format(
    position="""
    UPDATE raptor.positions SET qty = qty - %(qty)s
     WHERE user_id = %(user_id)s AND symbol = %(symbol)s
    RETURNING qty"""
)

# On Citus (examples/raptor/schema_citus.sql) an INSERT ... SELECT inside a statement is not
# routed to one shard: Citus plans it through intermediate results sent to every worker, and
# the transaction then commits on both by two-phase commit. So there the fill is two statements
# of the same transaction, each on the user's shard: the CTE without its audit row, then the
# audit row with the order's id as a value. (The other handlers' statements keep their form:
# on Citus they are correct but not single-shard; only the fill and the live order's record
# (live.py) are measured there.)
_AUDIT_CTE = _FILL[_FILL.index("), a AS (") : _FILL.index("SELECT o.id, c.cash_cents")]
FILL_BUY_DISTRIBUTED = FILL_BUY.replace(_AUDIT_CTE, ")\n")
FILL_SELL_DISTRIBUTED = FILL_SELL.replace(_AUDIT_CTE, ")\n")
FILL_AUDIT = """
INSERT INTO public.audit_log (user_id, action, context)
VALUES (%(user_id)s, 'paper_order_filled',
        jsonb_build_object('order_id', %(order_id)s::bigint, 'symbol', %(symbol)s::text,
                           'side', %(side)s::text, 'qty', %(qty)s::bigint,
                           'fill_price_cents', %(price_cents)s::bigint,
                           'cash_delta_cents', %(cash_delta)s::bigint))
"""
_distributed: bool | None = None


def is_distributed(conn: Any) -> bool:
    """Whether this database is a Citus coordinator (asked once per process)."""
    global _distributed
    if _distributed is None:
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')").fetchone()
        _distributed = bool(row and row[0])
    return _distributed


# A limit order that is not marketable at the deterministic price rests, moving nothing.
REST = """
WITH o AS (
    INSERT INTO raptor.paper_orders
        (user_id, symbol, side, qty, order_type, limit_price_cents, status, client_key)
    VALUES (%(user_id)s, %(symbol)s, %(side)s, %(qty)s, 'limit', %(limit_price_cents)s,
            'open', %(client_key)s)
    RETURNING id
), a AS (
    INSERT INTO public.audit_log (user_id, action, context)
    SELECT %(user_id)s, 'paper_order_accepted',
           jsonb_build_object('order_id', o.id, 'symbol', %(symbol)s::text,
                              'side', %(side)s::text, 'qty', %(qty)s::bigint,
                              'limit_price_cents', %(limit_price_cents)s::bigint)
      FROM o
)
SELECT o.id FROM o
"""

CANCEL = """
WITH c AS (
    UPDATE raptor.paper_orders SET status = 'cancelled', cancelled_at = now()
     WHERE id = %(order_id)s AND status = 'open'
    RETURNING id
)
INSERT INTO public.audit_log (user_id, action, context)
SELECT %(user_id)s, 'paper_order_cancelled', jsonb_build_object('order_id', c.id) FROM c
"""

LOCK_LEG = """
SELECT underlying, expiry, strike_cents, contracts, status
  FROM raptor.lcc_legs
 WHERE id = %(leg_id)s AND user_id = %(user_id)s
   FOR UPDATE
"""

ROLL = """
WITH closed AS (
    UPDATE raptor.lcc_legs SET status = 'closed', closed_at = now()
     WHERE id = %(leg_id)s
    RETURNING id, underlying
), opened AS (
    INSERT INTO raptor.lcc_legs
        (user_id, underlying, expiry, strike_cents, contracts, status, rolled_from, client_key)
    SELECT %(user_id)s, closed.underlying, %(new_expiry)s, %(new_strike_cents)s,
           %(contracts)s, 'open', closed.id, %(client_key)s
      FROM closed
    RETURNING id
), a AS (
    INSERT INTO public.audit_log (user_id, action, context)
    SELECT %(user_id)s, 'lcc_roll',
           jsonb_build_object('closed_leg_id', %(leg_id)s::bigint, 'opened_leg_id', opened.id,
                              'new_expiry', %(new_expiry)s::date,
                              'new_strike_cents', %(new_strike_cents)s::bigint)
      FROM opened
)
SELECT opened.id FROM opened
"""


def _client_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    return key.strip()[:100] if key else None


def _positive_int(body: dict, name: str, upper: int = 2**62) -> int | None:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= upper:
        return None
    return value


def test_delay(conn: Any, where: str) -> None:
    """Test-only: make an order slow, inside its transaction, when the app allows it.

    Off unless RAPTOR_TEST_ORDER_DELAY_MS > 0 (a delay for every order) or RAPTOR_TEST_HOOKS=1.
    Then the headers X-Raptor-Test-Delay-Ms (overrides the default, 0 allowed) and
    X-Raptor-Test-Delay-At (`after-writes`, the default, or `before-writes`) choose the delay.
    The sleep runs in the database and names this worker's pid, so a test can find the
    process serving a slow order in pg_stat_activity and kill or freeze it.
    """
    settings = current_app.extensions["raptor"]
    if not settings.test_hooks:
        return
    ms = int(request.headers.get("X-Raptor-Test-Delay-Ms", settings.test_order_delay_ms))
    at = request.headers.get("X-Raptor-Test-Delay-At", "after-writes")
    if ms > 0 and at == where:
        conn.execute(f"SELECT pg_sleep(%s) /* raptor-test-delay pid={os.getpid()} */", (ms / 1000.0,))


def place_order():
    """POST /api/trading/orders: fill a paper order at the instrument's deterministic price.

    Body: {"symbol": "AAPL", "side": "buy"|"sell", "qty": 10,
           "type": "market"|"limit" (default market), "limit_price_cents": 19000 (limit only)}
    201 filled or resting; 400 malformed; 422 unknown_symbol | insufficient_cash |
    insufficient_position.
    """
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return error(400, "invalid_request", detail="expected a JSON object")
    symbol = body.get("symbol")
    side = body.get("side")
    qty = _positive_int(body, "qty", MAX_QTY)
    order_type = body.get("type", "market")
    limit = body.get("limit_price_cents")
    if not isinstance(symbol, str) or not symbol:
        return error(400, "invalid_request", detail="symbol is required")
    if side not in ("buy", "sell"):
        return error(400, "invalid_request", detail="side must be 'buy' or 'sell'")
    if qty is None:
        return error(400, "invalid_request", detail=f"qty must be an integer in 1..{MAX_QTY}")
    if order_type not in ("market", "limit"):
        return error(400, "invalid_request", detail="type must be 'market' or 'limit'")
    if order_type == "limit":
        limit = _positive_int(body, "limit_price_cents")
        if limit is None:
            return error(400, "invalid_request", detail="a limit order needs limit_price_cents")
    else:
        limit = None
    params = {
        "user_id": g.current_user_id,
        "symbol": symbol.upper(),
        "side": side,
        "qty": qty,
        "order_type": order_type,
        "limit_price_cents": limit,
        "client_key": _client_key(),
    }

    with business_transaction() as conn:
        test_delay(conn, "before-writes")
        row = conn.execute(LOCK_ACCOUNT, params).fetchone()
        if row is None:
            return error(404, "account_not_found")
        cash, price, position = row
        if price is None:
            return error(422, "unknown_symbol", detail=f"no instrument {params['symbol']!r}")
        marketable = limit is None or (side == "buy" and limit >= price) or (side == "sell" and limit <= price)
        needed = qty * (price if marketable else limit)
        if side == "buy" and needed > cash:
            return error(422, "insufficient_cash", needed_cents=needed, available_cents=cash)
        if side == "sell" and qty > position:
            return error(422, "insufficient_position", requested=qty, held=position)

        if not marketable:
            (order_id,) = conn.execute(REST, params).fetchone()
            test_delay(conn, "after-writes")
            return (
                jsonify(
                    order_id=order_id,
                    status="open",
                    symbol=params["symbol"],
                    side=side,
                    qty=qty,
                    order_type="limit",
                    limit_price_cents=limit,
                ),
                201,
                {"Location": f"/api/trading/orders/{order_id}"},
            )  # a retried create finds its order

        params |= {"price_cents": price, "cash_delta": -needed if side == "buy" else needed}
        if is_distributed(conn):
            fill = FILL_BUY_DISTRIBUTED if side == "buy" else FILL_SELL_DISTRIBUTED
            order_id, cash_after, position_after = conn.execute(fill, params).fetchone()
            conn.execute(FILL_AUDIT, params | {"order_id": order_id})
        else:
            order_id, cash_after, position_after = conn.execute(
                FILL_BUY if side == "buy" else FILL_SELL, params
            ).fetchone()
        test_delay(conn, "after-writes")
        return (
            jsonify(
                order_id=order_id,
                status="filled",
                symbol=params["symbol"],
                side=side,
                qty=qty,
                order_type=order_type,
                fill_price_cents=price,
                notional_cents=needed,
                cash_after_cents=cash_after,
                position_after=position_after,
            ),
            201,
            {"Location": f"/api/trading/orders/{order_id}"},
        )


def cancel_order(order_id: int):
    """DELETE /api/trading/orders/<id>: already idempotent, so not instrumented.

    An open order is cancelled; a cancelled one answers the same 200 again; a filled one is
    409 order_not_cancellable; another user's or a missing order is 404.
    """
    with business_transaction() as conn:
        row = conn.execute(
            "SELECT status FROM raptor.paper_orders WHERE id = %s AND user_id = %s FOR UPDATE",
            (order_id, g.current_user_id),
        ).fetchone()
        if row is None:
            return error(404, "order_not_found")
        if row[0] == "filled":
            return error(409, "order_not_cancellable", order_id=order_id, status="filled")
        if row[0] == "open":
            conn.execute(CANCEL, {"order_id": order_id, "user_id": g.current_user_id})
        return jsonify(order_id=order_id, status="cancelled"), 200


def roll_lcc():
    """POST /api/trading/lcc/roll: close one LCC leg and open its successor, atomically.

    Body: {"leg_id": 7, "new_expiry": "2027-03-19", "new_strike_cents": 21000,
           "contracts": 1 (default: the closed leg's)}
    201 rolled; 400 malformed; 404 leg_not_found; 422 leg_not_open | invalid_roll.
    """
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return error(400, "invalid_request", detail="expected a JSON object")
    leg_id = _positive_int(body, "leg_id")
    strike = _positive_int(body, "new_strike_cents")
    try:
        new_expiry = dt.date.fromisoformat(str(body.get("new_expiry")))
    except ValueError:
        new_expiry = None
    if leg_id is None or strike is None or new_expiry is None:
        return error(400, "invalid_request", detail="leg_id, new_expiry (YYYY-MM-DD) and new_strike_cents are required")
    contracts = body.get("contracts")
    if contracts is not None and _positive_int(body, "contracts", 10_000) is None:
        return error(400, "invalid_request", detail="contracts must be a positive integer")
    params = {
        "leg_id": leg_id,
        "user_id": g.current_user_id,
        "new_expiry": new_expiry,
        "new_strike_cents": strike,
        "client_key": _client_key(),
    }

    with business_transaction() as conn:
        leg = conn.execute(LOCK_LEG, params).fetchone()
        if leg is None:
            return error(404, "leg_not_found")
        underlying, expiry, _strike, old_contracts, status = leg
        if status != "open":
            return error(422, "leg_not_open", leg_id=leg_id, status=status)
        if new_expiry <= expiry:
            return error(
                422, "invalid_roll", detail="new_expiry must be after the leg's expiry", expiry=expiry.isoformat()
            )
        params["contracts"] = contracts or old_contracts
        (opened_id,) = conn.execute(ROLL, params).fetchone()
        return jsonify(
            closed_leg_id=leg_id,
            opened_leg_id=opened_id,
            underlying=underlying,
            expiry=new_expiry.isoformat(),
            strike_cents=strike,
            contracts=params["contracts"],
        ), 201
