"""A Stripe simulator: ``POST /v1/checkout/sessions`` with Stripe's idempotency (contract §5).

    python -m examples.simulators.stripe --port 0 --db stripe.sqlite3

- ``POST /v1/checkout/sessions``, form-encoded as Stripe's API is (``mode``, ``success_url``,
  ``line_items[0][price]``, ``line_items[0][quantity]``, ``client_reference_id``, ...): 200 with
  a new ``cs_test_…`` session. With an ``Idempotency-Key`` header the first answer is kept 24 h:
  the same key with the same parameters gets that stored answer again, with
  ``Idempotent-Replayed: true``, and creates nothing; the same key with other parameters is
  Stripe's 400 ``idempotency_error``.
- ``GET /_sim/sessions``: every session created, for checkers. ``POST /_sim/faults``: common.py.
Bad input answers as Stripe does: 400 ``invalid_request_error`` naming the parameter.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any
from urllib.parse import parse_qsl

from .common import Answer, Dropped, Request, Route, Store, serve

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id            TEXT PRIMARY KEY,
    params        TEXT NOT NULL,
    amount_total  INTEGER NOT NULL,
    created       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
    key          TEXT PRIMARY KEY,
    params_hash  TEXT NOT NULL,
    status       INTEGER NOT NULL,
    body         TEXT NOT NULL,
    created      REAL NOT NULL
);
"""

KEY_RETENTION_S = 24 * 3600
MAX_KEY_CHARS = 255
#: price ids of the simulator's catalogue, in cents (Raptor's plans)
PRICES = {"price_starter": 900, "price_pro": 2900, "price_team": 9900}


def invalid(message: str, param: str | None = None, type_: str = "invalid_request_error") -> Answer:
    error: dict[str, Any] = {"type": type_, "message": message}
    if param is not None:
        error["param"] = param
    return 400, {"error": error}, {}


def bad_request(message: str) -> Answer:
    return invalid(message)


def routes(store: Store) -> dict[tuple[str, str], Route]:
    db = store.db

    def create(req: Request) -> Answer:
        try:
            pairs = parse_qsl(req.body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(req.body))
        except (UnicodeDecodeError, ValueError):
            return invalid("the body must be application/x-www-form-urlencoded parameters")
        params = dict(pairs)
        if len(params) != len(pairs):
            return invalid("a parameter was given twice")
        mode = params.get("mode")
        if mode not in ("payment", "subscription", "setup"):
            return invalid("Missing required param: mode." if mode is None else f"Invalid mode: {mode!r}", "mode")
        if not params.get("success_url"):
            return invalid("Missing required param: success_url.", "success_url")
        price = params.get("line_items[0][price]")
        if price not in PRICES:
            return invalid(f"No such price: {price!r}", "line_items[0][price]")
        quantity = params.get("line_items[0][quantity]", "1")
        if not quantity.isdigit() or not 0 < int(quantity) <= 100:
            return invalid("Invalid integer: quantity must be 1..100", "line_items[0][quantity]")
        key = req.headers.get("Idempotency-Key")
        if key is not None and not 0 < len(key) <= MAX_KEY_CHARS:
            return invalid(f"Idempotency-Key must be 1..{MAX_KEY_CHARS} characters", type_="idempotency_error")
        params_hash = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
        with store.lock:
            now = time.time()
            if key is not None:
                db.execute("DELETE FROM idempotency WHERE created < ?", (now - KEY_RETENTION_S,))
                row = db.execute("SELECT params_hash, status, body FROM idempotency WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    if row[0] != params_hash:
                        return invalid(
                            "Keys for idempotent requests can only be used with the same parameters they were first "
                            "used with. Try using a key other than '" + key + "' if you meant to execute a different "
                            "request.",
                            type_="idempotency_error",
                        )
                    return row[1], json.loads(row[2]), {"Idempotent-Replayed": "true"}
            if store.faults.take("fail_before_accept"):
                return 500, {"error": {"type": "api_error", "message": "simulated outage"}}, {}
            session = {
                "id": "cs_test_" + secrets.token_hex(12),
                "object": "checkout.session",
                "mode": mode,
                "amount_total": PRICES[price] * int(quantity),
                "currency": "usd",
                "client_reference_id": params.get("client_reference_id"),
                "status": "open",
                "url": "https://checkout.stripe.invalid/c/pay/",
                "created": int(now),
            }
            session["url"] += session["id"]
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO sessions (id, params, amount_total, created) VALUES (?, ?, ?, ?)",
                (session["id"], json.dumps(params, sort_keys=True), session["amount_total"], now),
            )
            if key is not None:
                db.execute(
                    "INSERT INTO idempotency (key, params_hash, status, body, created) VALUES (?, ?, ?, ?, ?)",
                    (key, params_hash, 200, json.dumps(session), now),
                )
            db.execute("COMMIT")
            drop = store.faults.take("drop_after_accept")
            delay = store.faults.take_delay()
        if delay:
            time.sleep(delay)
        if drop:
            raise Dropped
        return 200, session, {"Idempotency-Key": key} if key is not None else {}

    def sessions(_req: Request) -> Answer:
        with store.lock:
            rows = db.execute("SELECT id, params, amount_total, created FROM sessions ORDER BY created").fetchall()
        return (
            200,
            {
                "sessions": [
                    {"id": r[0], "params": json.loads(r[1]), "amount_total": r[2], "created": r[3]} for r in rows
                ]
            },
            {},
        )

    return {("POST", "/v1/checkout/sessions"): create, ("GET", "/_sim/sessions"): sessions}


def main(argv: list[str] | None = None) -> None:
    serve("stripe", SCHEMA, routes, bad_request, argv)


if __name__ == "__main__":
    main()
