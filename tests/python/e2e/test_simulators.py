"""The simulators as processes (examples/simulators): the broker dedupes client_order_id (422,
nothing filled) and finds an order by it; Stripe replays a key's stored session with
Idempotent-Replayed and refuses the key with other parameters; the fault switches; malformed
requests get the real services' 400/422, never a 500."""

from __future__ import annotations

import json

import pytest

from examples.raptor.downstream import DownstreamUnavailable, call
from examples.simulators.process import Simulator

ORDER = {"symbol": "AAPL", "qty": 2, "side": "buy", "type": "market", "time_in_force": "day"}
FORM = "mode=subscription&success_url=https%3A%2F%2Fx.test%2Fdone&line_items%5B0%5D%5Bprice%5D=price_pro"


def post_json(sim: Simulator, body: object, raw: bytes | None = None) -> tuple[int, object]:
    a = call(sim.url, "POST", "/v2/orders", body=raw if raw is not None else json.dumps(body).encode())
    return a.status, a.body


def test_broker_dedupes_client_order_id_and_finds_orders_by_it(broker: Simulator) -> None:
    status, order = post_json(broker, {**ORDER, "client_order_id": "c-1"})
    assert status == 200 and isinstance(order, dict) and order["status"] == "filled"
    status, dup = post_json(broker, {**ORDER, "qty": 5, "client_order_id": "c-1"})
    assert status == 422 and isinstance(dup, dict) and dup["message"] == "client_order_id must be unique"
    assert [f["client_order_id"] for f in broker.fills()] == ["c-1"]
    found = call(broker.url, "GET", "/v2/orders:by_client_order_id?client_order_id=c-1")
    assert found.status == 200 and found.body["id"] == order["id"]
    assert call(broker.url, "GET", "/v2/orders:by_client_order_id?client_order_id=nope").status == 404


@pytest.mark.parametrize(
    ("body", "raw", "status"),
    [
        (None, b"{not json", 400),
        (None, b"\xff\xfe", 400),
        ([1, 2], None, 400),
        ({**ORDER, "symbol": "ZZZZ"}, None, 422),
        ({**ORDER, "symbol": 7}, None, 422),
        ({**ORDER, "qty": -1}, None, 422),
        ({**ORDER, "qty": "1.5"}, None, 422),
        ({**ORDER, "qty": True}, None, 422),
        ({**ORDER, "side": "hold"}, None, 422),
        ({**ORDER, "type": "stop"}, None, 422),
        ({**ORDER, "type": "limit"}, None, 422),
        ({**ORDER, "type": "limit", "limit_price": "NaN"}, None, 422),
        ({**ORDER, "time_in_force": 3}, None, 422),
        ({**ORDER, "client_order_id": ""}, None, 422),
        ({**ORDER, "client_order_id": "x" * 129}, None, 422),
        ({**ORDER, "client_order_id": {"a": 1}}, None, 422),
    ],
)
def test_broker_answers_malformed_orders_with_400_or_422(
    broker: Simulator, body: object, raw: bytes | None, status: int
) -> None:
    assert post_json(broker, body, raw)[0] == status
    assert broker.fills() == []


def test_broker_faults(broker: Simulator) -> None:
    broker.faults(fail_before_accept=1)
    assert post_json(broker, {**ORDER, "client_order_id": "f-1"})[0] == 503
    assert broker.fills() == []
    broker.faults(drop_after_accept=1)
    with pytest.raises(DownstreamUnavailable):
        post_json(broker, {**ORDER, "client_order_id": "f-2"})
    assert [f["client_order_id"] for f in broker.fills()] == ["f-2"]  # accepted, answer lost
    broker.faults(delay_ms=300, delay_count=1)
    with pytest.raises(DownstreamUnavailable):  # the caller gives up first; the order stands
        call(
            broker.url,
            "POST",
            "/v2/orders",
            body=json.dumps({**ORDER, "client_order_id": "f-3"}).encode(),
            timeout_s=0.1,
        )
    assert len(broker.fills()) == 2
    assert broker.faults()["applied"] == {"fail_before_accept": 1, "drop_after_accept": 1, "delay": 1}
    assert call(broker.url, "POST", "/_sim/faults", body=b'{"delay_ms": -1}').status == 400


def test_stripe_replays_a_key_and_refuses_it_with_other_parameters(stripe: Simulator) -> None:
    path = "/v1/checkout/sessions"
    first = call(stripe.url, "POST", path, body=FORM.encode(), headers={"Idempotency-Key": "k-1"})
    assert (
        first.status == 200 and first.body["id"].startswith("cs_test_") and "idempotent-replayed" not in first.headers
    )
    again = call(stripe.url, "POST", path, body=FORM.encode(), headers={"Idempotency-Key": "k-1"})
    assert again.status == 200 and again.body == first.body and again.headers["idempotent-replayed"] == "true"
    other = call(
        stripe.url,
        "POST",
        path,
        body=(FORM + "&line_items%5B0%5D%5Bquantity%5D=2").encode(),
        headers={"Idempotency-Key": "k-1"},
    )
    assert other.status == 400 and other.body["error"]["type"] == "idempotency_error"
    assert call(stripe.url, "POST", path, body=FORM.encode()).body["id"] != first.body["id"]
    assert len(stripe.get("/_sim/sessions")["sessions"]) == 2


@pytest.mark.parametrize(
    "form",
    [
        "",
        "mode=payment",
        "mode=nope&success_url=x",
        FORM.replace("price_pro", "price_x"),
        "%zz&&=",
        FORM + "&mode=payment",
        FORM + "&line_items%5B0%5D%5Bquantity%5D=0",
    ],
)
def test_stripe_answers_malformed_requests_with_400(stripe: Simulator, form: str) -> None:
    a = call(stripe.url, "POST", "/v1/checkout/sessions", body=form.encode())
    assert a.status == 400 and a.body["error"]["type"] == "invalid_request_error"
    assert (
        call(stripe.url, "POST", "/v1/checkout/sessions", body=b"\xff", headers={"Idempotency-Key": "x" * 300}).status
        == 400
    )
