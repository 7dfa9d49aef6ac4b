"""The live path (contract §5): POST /api/trading/live/orders sends the order to the broker.

The paper route fills in Raptor's own database, so the idempotency layer alone makes it
exactly-once. Here the fill happens at the broker, outside any transaction of ours, so the
handler follows the pattern of docs/shim.md, "Calling out of the database":

1. ``client_order_id = downstream_key("broker")``: the same for every execution of this
   request, across stale heals; the broker refuses a second order with it (422) and can be
   asked for the order by it;
2. ``attempt() > 1``: an earlier execution may have reached the broker before its worker died,
   so the order is looked up first and adopted when found;
3. a submission whose answer is lost (dropped connection, timeout, 5xx) is looked up, then sent
   again with the same client_order_id: harmless, the broker dedupes;
4. the adopted or new order is recorded in raptor.live_orders in the claim's transaction, which
   commits with the key's completion (a zombie's record rolls back with its fenced completion).

No row lock is held while the broker is called, so a frozen worker cannot block the retry.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import current_app, g, jsonify, request

from idem_shim import attempt, downstream_key

from .auth import error
from .db import business_transaction
from .downstream import Broker, DownstreamUnavailable
from .trading import MAX_QTY, _positive_int, is_distributed, test_delay

logger = logging.getLogger("raptor.live")

#: How many times one execution sends the order when no answer comes back (same client_order_id).
SUBMIT_TRIES = 4
DUPLICATE_CODE = 40010001  # the broker's "client_order_id must be unique"

RECORD = """
WITH o AS (
    INSERT INTO raptor.live_orders
        (user_id, client_order_id, broker_order_id, symbol, side, qty, status, filled_qty,
         filled_avg_price, attempt, adopted)
    VALUES (%(user_id)s, %(client_order_id)s, %(broker_order_id)s, %(symbol)s, %(side)s, %(qty)s,
            %(status)s, %(filled_qty)s, %(filled_avg_price)s, %(attempt)s, %(adopted)s)
    -- already recorded: by an execution that completed before this one (a zombie's late
    -- record); this one's completion is then fenced and its client gets 409
    ON CONFLICT (client_order_id) DO NOTHING
    RETURNING id
), a AS (
    INSERT INTO public.audit_log (user_id, action, context)
    SELECT %(user_id)s, 'live_order_recorded',
           jsonb_build_object('live_order_id', o.id, 'broker_order_id', %(broker_order_id)s::text,
                              'client_order_id', %(client_order_id)s::text, 'symbol', %(symbol)s::text,
                              'side', %(side)s::text, 'qty', %(qty)s::bigint,
                              'attempt', %(attempt)s::integer, 'adopted', %(adopted)s::boolean)
      FROM o
)
SELECT o.id FROM o
"""
# On Citus (examples/raptor/schema_citus.sql) the row is unique per (user_id, client_order_id),
# the distribution column first, and the audit row is a second statement on the same shard, as
# the fill's is (trading.py): one worker, no two-phase commit.
_AUDIT_CTE = RECORD[RECORD.index("), a AS (") : RECORD.index("SELECT o.id FROM o")]
RECORD_DISTRIBUTED = RECORD.replace(_AUDIT_CTE, ")\n").replace(
    "ON CONFLICT (client_order_id)", "ON CONFLICT (user_id, client_order_id)"
)
RECORD_AUDIT = """
INSERT INTO public.audit_log (user_id, action, context)
VALUES (%(user_id)s, 'live_order_recorded',
        jsonb_build_object('live_order_id', %(live_order_id)s::bigint, 'broker_order_id', %(broker_order_id)s::text,
                           'client_order_id', %(client_order_id)s::text, 'symbol', %(symbol)s::text,
                           'side', %(side)s::text, 'qty', %(qty)s::bigint,
                           'attempt', %(attempt)s::integer, 'adopted', %(adopted)s::boolean))
"""


def _broker() -> Broker | None:
    settings = current_app.extensions["raptor"]
    return Broker(settings.broker_url, settings.downstream_timeout_s) if settings.broker_url else None


def _submit(broker: Broker, order: dict[str, Any]) -> tuple[dict[str, Any] | None, bool, Any]:
    """(the broker's order, adopted?, a refusal to answer with) for one execution."""
    coid = order["client_order_id"]
    for n in range(SUBMIT_TRIES):
        try:
            answer = broker.submit(order)
        except DownstreamUnavailable as exc:
            logger.warning("live order %s: no answer from the broker (%s); looking it up", coid, exc)
            answer = None
        if answer is not None and answer.status == 200 and isinstance(answer.body, dict):
            return answer.body, False, None
        if answer is not None and answer.status == 422:
            body = answer.body if isinstance(answer.body, dict) else {}
            if body.get("code") != DUPLICATE_CODE:
                return None, False, error(422, "broker_rejected", detail=body.get("message", "rejected"))
            # an earlier execution (or a zombie) got there first: that order is ours
        try:
            found = broker.find(coid)
        except DownstreamUnavailable:
            found = None
        if found is not None:
            return found, True, None
        time.sleep(min(0.05 * 2**n, 0.5))
    return (
        None,
        False,
        error(502, "broker_unavailable", {"Retry-After": "1"}, detail="the broker did not take the order"),
    )


def place_live_order():
    """POST /api/trading/live/orders. Body: {"symbol": "AAPL", "side": "buy"|"sell", "qty": 10}.

    201 with the broker's order (``attempt`` says which execution answered, ``adopted`` whether
    it found an order an earlier one had sent); 400 malformed; 422 broker_rejected; 502
    broker_unavailable; 503 live_broker_not_configured.
    """
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return error(400, "invalid_request", detail="expected a JSON object")
    symbol, side = body.get("symbol"), body.get("side")
    qty = _positive_int(body, "qty", MAX_QTY)
    if not isinstance(symbol, str) or not symbol:
        return error(400, "invalid_request", detail="symbol is required")
    if side not in ("buy", "sell"):
        return error(400, "invalid_request", detail="side must be 'buy' or 'sell'")
    if qty is None:
        return error(400, "invalid_request", detail=f"qty must be an integer in 1..{MAX_QTY}")
    broker = _broker()
    if broker is None:
        return error(503, "live_broker_not_configured", detail="RAPTOR_BROKER_URL is not set")

    client_order_id = downstream_key("broker")
    execution = attempt()
    with business_transaction() as conn:
        test_delay(conn, "before-broker")  # tests: a worker frozen here wakes as a zombie
    order: dict[str, Any] | None = None
    adopted = False
    if execution > 1:
        # A previous holder of this key may have reached the broker before it died.
        try:
            order = broker.find(client_order_id)
        except DownstreamUnavailable:
            order = None
        adopted = order is not None
    if order is None:
        order, adopted, refusal = _submit(
            broker,
            {
                "symbol": symbol.upper(),
                "qty": qty,
                "side": side,
                "type": "market",
                "time_in_force": "day",
                "client_order_id": client_order_id,
            },
        )
        if refusal is not None:
            return refusal
    assert order is not None
    params = {
        "user_id": g.current_user_id,
        "client_order_id": client_order_id,
        "broker_order_id": str(order.get("id")),
        "symbol": str(order.get("symbol")),
        "side": str(order.get("side")),
        "qty": int(order.get("qty") or qty),
        "status": str(order.get("status")),
        "filled_qty": int(order.get("filled_qty") or 0),
        "filled_avg_price": order.get("filled_avg_price"),
        "attempt": execution,
        "adopted": adopted,
    }
    with business_transaction() as conn:
        test_delay(conn, "after-broker")  # tests: a worker killed here had the broker's fill
        distributed = is_distributed(conn)
        recorded = conn.execute(RECORD_DISTRIBUTED if distributed else RECORD, params).fetchone()
        if recorded is not None and distributed:
            conn.execute(RECORD_AUDIT, params | {"live_order_id": recorded[0]})
        row = (
            recorded
            or conn.execute(
                "SELECT id FROM raptor.live_orders WHERE user_id = %s AND client_order_id = %s",
                (g.current_user_id, client_order_id),
            ).fetchone()
        )
        live_order_id = row[0] if row else None
    logger.info(
        "live order %s: broker order %s (attempt %s, adopted %s)",
        client_order_id,
        params["broker_order_id"],
        execution,
        adopted,
    )
    return (
        jsonify(
            live_order_id=live_order_id,
            broker_order_id=params["broker_order_id"],
            client_order_id=client_order_id,
            status=params["status"],
            symbol=params["symbol"],
            side=params["side"],
            qty=params["qty"],
            filled_qty=params["filled_qty"],
            filled_avg_price=params["filled_avg_price"],
            attempt=execution,
            adopted=adopted,
        ),
        201,
    )
