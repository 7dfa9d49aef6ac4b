"""Billing: checkout sessions (Tier 2: fail-open, keys kept 7 days).

In Raptor the session comes from Stripe, which dedups on its own idempotency key; here the
"provider" is a row in raptor.checkout_sessions, so a duplicate would be a visible second row.
"""

from __future__ import annotations

import secrets

from flask import current_app, g, jsonify, request

from .auth import error
from .db import business_transaction

PLANS = {"starter": 900, "pro": 2900, "team": 9900}  # monthly price in cents

CREATE = """
WITH s AS (
    INSERT INTO raptor.checkout_sessions (id, user_id, plan, amount_cents, client_key)
    VALUES (%(id)s, %(user_id)s, %(plan)s, %(amount_cents)s, %(client_key)s)
    RETURNING id
)
INSERT INTO public.audit_log (user_id, action, context)
SELECT %(user_id)s, 'checkout_session_created',
       jsonb_build_object('checkout_session_id', s.id, 'plan', %(plan)s::text,
                          'amount_cents', %(amount_cents)s::bigint)
  FROM s
"""


def create_checkout_session():
    """POST /api/billing/checkout-session. Body: {"plan": "starter"|"pro"|"team"}.

    201 with the session; 400 malformed; 422 unknown_plan.
    """
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("plan"), str):
        return error(400, "invalid_request", detail='expected {"plan": "..."}')
    plan = body["plan"]
    if plan not in PLANS:
        return error(422, "unknown_plan", plans=sorted(PLANS))
    key = request.headers.get("Idempotency-Key")
    params = {
        "id": "cs_test_" + secrets.token_hex(12),
        "user_id": g.current_user_id,
        "plan": plan,
        "amount_cents": PLANS[plan],
        "client_key": key.strip()[:100] if key else None,
    }
    with business_transaction() as conn:
        conn.execute(CREATE, params)
    if current_app.extensions["raptor"].test_hooks and request.headers.get("X-Raptor-Test-Fail") == "after-writes":
        # Test-only (RAPTOR_TEST_HOOKS=1): the provider failed after our writes. The 502 rolls
        # them back and, with on_failure="release", frees the key for the client's retry.
        return error(502, "payment_provider_unavailable")
    return jsonify(
        checkout_session_id=params["id"],
        plan=plan,
        amount_cents=PLANS[plan],
        status="open",
        url=f"https://checkout.example.invalid/pay/{params['id']}",
    ), 201
