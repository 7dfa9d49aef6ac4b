"""Raptor's calls past its database: the broker's order API and Stripe's checkout sessions.

Plain http.client, one connection per call, with a timeout: what matters here is not the
client but what it sends. Every call that changes state downstream carries the request's
``idem_shim.downstream_key(...)`` (the broker's ``client_order_id``, Stripe's
``Idempotency-Key``), so sending it again — from a retry inside the handler, the re-execution
after a heal, or a zombie worker that wakes late — can never make a second order or session.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit


class DownstreamUnavailable(Exception):
    """No answer: refused, timed out, or the connection dropped (the call may have landed)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


def call(
    base_url: str,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 5.0,
) -> Answer:
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException, TimeoutError) as exc:
        raise DownstreamUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = {"raw": raw.decode("utf-8", "replace")[:200]}
    return Answer(response.status, parsed, {k.lower(): v for k, v in response.getheaders()})


class Broker:
    """The broker's order API (Alpaca's shape; examples/simulators/broker.py)."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s

    def submit(self, order: dict[str, Any]) -> Answer:
        return call(
            self.base_url,
            "POST",
            "/v2/orders",
            body=json.dumps(order).encode(),
            headers={"Content-Type": "application/json"},
            timeout_s=self.timeout_s,
        )

    def find(self, client_order_id: str) -> dict[str, Any] | None:
        """The order sent with ``client_order_id``, or None if the broker has none."""
        answer = call(
            self.base_url,
            "GET",
            "/v2/orders:by_client_order_id?" + urlencode({"client_order_id": client_order_id}),
            timeout_s=self.timeout_s,
        )
        if answer.status == 404:
            return None
        if answer.status != 200 or not isinstance(answer.body, dict):
            raise DownstreamUnavailable(f"order lookup answered {answer.status}")
        return answer.body


class Stripe:
    """Stripe's checkout sessions (examples/simulators/stripe.py)."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s

    def create_checkout_session(self, params: dict[str, str], idempotency_key: str | None) -> Answer:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return call(
            self.base_url,
            "POST",
            "/v1/checkout/sessions",
            body=urlencode(params).encode(),
            headers=headers,
            timeout_s=self.timeout_s,
        )
