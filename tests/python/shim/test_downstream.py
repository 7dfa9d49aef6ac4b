"""Contract §4a through the decorator: downstream_key(namespace) and attempt() in a handler.

Cases: inside a claimed request the key equals SQL's idem_downstream_key for the request's (key,
user, endpoint), is a lower-case UUID, is asked of the database once per namespace, differs per
namespace and per user; attempt() is 1, and 2 for the execution after a stale heal, whose
downstream key is the one every execution of that request gets; outside a claimed request (no
header, kill switch, outside any decorated route) both raise IdemError naming why; an empty,
blank, over-long or non-text namespace raises ValueError at the call.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from flask import Flask

import idem_shim
from idem_shim.config import KILL_SWITCH_ENV
from idem_shim.errors import IdemError, NotClaimedError, OutsideRequestError
from tests.python.support.shim import AppFactory, Order, post, scalar

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
ENDPOINT = "POST /orders"


def new_key() -> str:
    return str(uuid.uuid4())


def sql_downstream_key(url: str, key: str, user: int | None, namespace: str, endpoint: str = ENDPOINT) -> str:
    value = scalar(url, "SELECT idem_downstream_key(%s, %s, %s, %s)", (key, user, endpoint, namespace))
    assert isinstance(value, str)
    return value


class Recorder:
    """A handler that records what the accessors answered, then places no order."""

    def __init__(self, namespaces: tuple[Any, ...] = ("broker",)) -> None:
        self.namespaces = namespaces
        self.seen: list[dict[str, Any]] = []

    def __call__(self, order: Order) -> Any:
        seen: dict[str, Any] = {}
        for ns in self.namespaces:
            try:
                seen[f"key:{ns}"] = idem_shim.downstream_key(ns)
            except (ValueError, IdemError) as exc:
                seen[f"key:{ns}"] = exc
        try:
            seen["attempt"] = idem_shim.attempt()
        except IdemError as exc:
            seen["attempt"] = exc
        self.seen.append(seen)
        return {"ok": True}, 201


def test_downstream_key_is_the_sql_value_and_attempt_is_1(make_app: AppFactory, fresh_admin_url: str) -> None:
    recorder = Recorder(("broker", "stripe", "broker"))
    client = make_app(recorder).test_client()
    key = new_key()
    assert post(client, "/orders", key, {"item": "a"}, user=1).status_code == 201
    seen = recorder.seen[0]
    broker = seen["key:broker"]
    assert isinstance(broker, str) and UUID_RE.match(broker)
    assert broker == sql_downstream_key(fresh_admin_url, key, 1, "broker")
    assert seen["key:stripe"] == sql_downstream_key(fresh_admin_url, key, 1, "stripe") != broker
    assert key not in broker and seen["attempt"] == 1
    # another user with the same key: another scope, another downstream key
    assert post(client, "/orders", key, {"item": "a"}, user=2).status_code == 201
    assert recorder.seen[1]["key:broker"] == sql_downstream_key(fresh_admin_url, key, 2, "broker") != broker


def _claim_as_another_worker(admin: str, key: str, body: Any, age: timedelta) -> int:
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT outcome, key_id FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => %s,"
            " p_request => %s::jsonb, p_now => now() - %s::interval)",
            (key, ENDPOINT, json.dumps(body), age),
        ).fetchone()
    assert row is not None and row[0] == "claimed"
    return int(row[1])


def test_the_execution_after_a_heal_is_attempt_2_with_the_same_downstream_key(
    make_app: AppFactory, fresh_admin_url: str
) -> None:
    recorder = Recorder()
    client = make_app(recorder).test_client()
    key = new_key()
    dead = _claim_as_another_worker(fresh_admin_url, key, {"item": "h"}, timedelta(seconds=45))
    assert post(client, "/orders", key, {"item": "h"}).status_code == 409  # healed
    assert post(client, "/orders", key, {"item": "h"}).status_code == 201  # the re-execution
    seen = recorder.seen[0]
    assert seen["attempt"] == 2
    assert seen["key:broker"] == sql_downstream_key(fresh_admin_url, key, 1, "broker")
    assert (
        scalar(
            fresh_admin_url,
            "SELECT count(*) FROM idempotency_events WHERE event = 'stale_heal' AND key_id = %s",
            (dead,),
        )
        == 1
    )
    # a replay runs no handler: nothing more recorded
    assert post(client, "/orders", key, {"item": "h"}).status_code == 201
    assert len(recorder.seen) == 1


def test_without_a_claim_both_raise_idem_error_naming_why(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    client = make_app(recorder).test_client()
    assert post(client, "/orders", None, {"item": "n"}).status_code == 201
    for name in ("key:broker", "attempt"):
        exc = recorder.seen[0][name]
        assert isinstance(exc, NotClaimedError) and isinstance(exc, IdemError)
        assert "no Idempotency-Key header" in str(exc)
    monkeypatch.setenv(KILL_SWITCH_ENV, "0")
    assert post(client, "/orders", new_key(), {"item": "n"}).status_code == 201
    assert isinstance(recorder.seen[1]["key:broker"], NotClaimedError)
    assert "kill switch" in str(recorder.seen[1]["key:broker"])


def test_outside_a_decorated_route_both_raise_idem_error(make_app: AppFactory) -> None:
    app: Flask = make_app(Recorder())
    with app.test_request_context("/"):
        with pytest.raises(OutsideRequestError, match="downstream_key"):
            idem_shim.downstream_key("broker")
        with pytest.raises(IdemError, match="attempt"):
            idem_shim.attempt()


@pytest.mark.parametrize("namespace", ["", "   ", 7, None, b"broker", "x" * 201, "a\x00b"])
def test_a_bad_namespace_is_a_value_error_at_the_call(make_app: AppFactory, namespace: Any) -> None:
    recorder = Recorder((namespace,))
    client = make_app(recorder).test_client()
    assert post(client, "/orders", new_key(), {"item": "v"}).status_code == 201
    exc = recorder.seen[0][f"key:{namespace}"]
    assert isinstance(exc, ValueError) and "namespace" in str(exc)
    # outside a claimed request the bad argument is still what is reported first
    with make_app(recorder).test_request_context("/"), pytest.raises(ValueError, match="namespace"):
        idem_shim.downstream_key(namespace)


def test_both_are_exported() -> None:
    assert {"downstream_key", "attempt"} <= set(idem_shim.__all__)
