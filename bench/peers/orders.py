"""What every system's app shares: the `orders` table, its one INSERT, the routes' paths.

Imported by the apps in both venvs (the main one for idem, .venv-peers for the peers), so it
needs nothing beyond the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idem_key    text,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
)
"""
# The request's Idempotency-Key is stored with the row: the race counts rows per key.
INSERT = "INSERT INTO orders (idem_key, payload) VALUES (%s, %s::jsonb) RETURNING id"

PROTECTED = "/orders"  # behind the system's idempotency layer
RAW = "/orders/raw"  # the same handler, no idempotency layer on its path
BODY = '{"sku": "bench-widget", "qty": 1, "note": "one INSERT"}'

#: query parameter: the handler's own work in ms (a sleep) before its INSERT
HANDLER_MS = "handler_ms"


def handler_seconds(args: Mapping[str, str]) -> float:
    """How long the handler works before its INSERT, as the request's query string asks."""
    return int(args.get(HANDLER_MS) or 0) / 1000.0


def handler_work(args: Mapping[str, str]) -> None:
    """The handler's own work in a sync worker (an async app awaits handler_seconds instead)."""
    seconds = handler_seconds(args)
    if seconds:
        time.sleep(seconds)
