"""Billing: checkout sessions (Tier 2: fail-open, keys kept 7 days).

With RAPTOR_STRIPE_URL set, the session comes from Stripe (examples/simulators/stripe.py), called
with ``Idempotency-Key: downstream_key("stripe")``: the re-execution after a heal gets Stripe's
stored session back (``Idempotent-Replayed: true``) instead of a second one. A request the layer
does not track (no key, or the store down on this fail-open route) has no key to forward and
calls Stripe without one. Without RAPTOR_STRIPE_URL the "provider" is the row in
raptor.checkout_sessions, so a duplicate would be a visible second row.
"""

from __future__ import annotations

import secrets

from flask import current_app, g, jsonify, request

from idem_shim import IdemError, downstream_key

from .auth import error
from .db import business_transaction
from .downstream import DownstreamUnavailable, Stripe

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
    settings = current_app.extensions["raptor"]
    session_id = "cs_test_" + secrets.token_hex(12)
    url = f"https://checkout.example.invalid/pay/{session_id}"
    if settings.stripe_url:
        try:
            stripe_key: str | None = downstream_key("stripe")
        except IdemError:
            stripe_key = None  # untracked (no key, or fail-open without the store): nothing to forward
        try:
            answer = Stripe(settings.stripe_url, settings.downstream_timeout_s).create_checkout_session(
                {
                    "mode": "subscription",
                    "success_url": "https://raptor.example.invalid/billing/done",
                    "line_items[0][price]": f"price_{plan}",
                    "line_items[0][quantity]": "1",
                    "client_reference_id": str(g.current_user_id),
                },
                stripe_key,
            )
        except DownstreamUnavailable as exc:
            return error(502, "payment_provider_unavailable", {"Retry-After": "1"}, detail=str(exc))
        if answer.status != 200 or not isinstance(answer.body, dict):
            return error(502, "payment_provider_error", detail=f"Stripe answered {answer.status}")
        session_id, url = answer.body["id"], answer.body["url"]
    params = {
        "id": session_id,
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
        url=url,
    ), 201
