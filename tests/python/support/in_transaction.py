"""Pieces of the ``claim="in_transaction"`` tests (tests/python/shim/test_claim_in_transaction.py).

``wait_until`` polls a condition read from the database (a backend's wait, a row gone), never a
fixed sleep; ``forward_to_broker`` calls ``downstream_key()`` from a module of its own, which the
decoration-time check cannot see (the call is refused there instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import idem_shim


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} never held within {timeout} s")
        time.sleep(0.01)


def forward_to_broker() -> str:
    return idem_shim.downstream_key("broker")


# Views that name a lease accessor, each way a module spells it: refused when decorated.
from idem_shim import downstream_key, heartbeat  # noqa: E402 - the views' own imports


def forwards_by_name(key: str = "") -> object:
    return downstream_key("broker")


def forwards_by_module(key: str = "") -> object:
    return idem_shim.downstream_key("broker")


def beats_by_name(key: str = "") -> object:
    return heartbeat()


def beats_by_module(key: str = "") -> object:
    return idem_shim.heartbeat()


LEASE_VIEWS = {
    "downstream_key": (forwards_by_name, forwards_by_module),
    "heartbeat": (beats_by_name, beats_by_module),
}


def http_post(port: int, path: str, key: str, body: dict[str, object]) -> int | None:
    """POST to a worker process; None when the worker died under the request."""
    import json
    import urllib.error
    import urllib.request

    sent = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Idempotency-Key": key, "X-User": "1", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(sent, timeout=30) as answer:  # noqa: S310
            return int(answer.status)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
