"""Metric values and log lines after a scripted sequence of requests.

Sequence on POST /orders: claimed, replay, mismatch, in flight (another worker's holder), stale
holder healed, its retry claimed, previous failed; plus an untracked request and a malformed key
that count nothing. Then: the counters and the claim-latency histogram hold exactly those values,
the exposition text carries them, and there is one structured log line per non-claimed outcome,
with the endpoint and the key's first 4 characters, never the whole key nor the body.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.python.support.shim import post, running_app, shim_db

ENDPOINT = "POST /orders"
SECRET = "body-marker-that-must-never-be-logged"


def direct_claim(admin: str, key: str, body: Any, age: timedelta = timedelta(0)) -> int:
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => %s,"
            " p_request => %s::jsonb, p_now => now() - %s::interval)",
            (key, ENDPOINT, json.dumps(body), age),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_metrics_and_logs_after_a_scripted_sequence(fresh_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    url = shim_db(fresh_admin_url)
    body = {"item": SECRET}
    keys = [str(uuid.uuid4()) for _ in range(4)]
    direct_claim(fresh_admin_url, keys[1], body)  # a live holder
    direct_claim(fresh_admin_url, keys[2], body, age=timedelta(seconds=60))  # a dead holder
    failed = direct_claim(fresh_admin_url, keys[3], body)
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute("SELECT idem_fail(p_key_id => %s)", (failed,))

    with running_app(url) as app, caplog.at_level(logging.INFO, logger="idem_shim"):
        client = app.test_client()
        caplog.clear()
        statuses = [
            post(client, "/orders", keys[0], body).status_code,  # claimed
            post(client, "/orders", keys[0], body).status_code,  # replay
            post(client, "/orders", keys[0], {"item": "other"}).status_code,  # mismatch
            post(client, "/orders", keys[1], body).status_code,  # in_flight
            post(client, "/orders", keys[2], body).status_code,  # stale (healed)
            post(client, "/orders", keys[2], body).status_code,  # claimed
            post(client, "/orders", keys[3], body).status_code,  # previous_failed
            post(client, "/orders", None, body).status_code,  # untracked
            post(client, "/orders", "nope", body).status_code,  # malformed
        ]
        assert statuses == [201, 201, 422, 409, 409, 201, 409, 201, 400]

        state = app.extensions["idem"]
        registry = state.metrics.registry

        def value(name: str, **labels: str) -> float:
            return registry.get_sample_value(name, {"endpoint": ENDPOINT, **labels}) or 0.0

        assert value("idempotency_miss_total") == 2
        assert value("idempotency_hit_total", outcome="replay") == 1
        assert value("idempotency_hit_total", outcome="mismatch") == 1
        assert value("idempotency_hit_total", outcome="in_flight") == 1
        assert value("idempotency_hit_total", outcome="stale") == 1
        assert value("idempotency_hit_total", outcome="previous_failed") == 1
        assert value("idempotency_replay_total") == 1
        assert value("idempotency_stale_heals_total") == 1
        assert value("idempotency_store_errors_total", stage="claim") == 0
        assert value("idempotency_claim_seconds_count", outcome="claimed") == 2
        assert value("idempotency_claim_seconds_count", outcome="replay") == 1
        assert 0 < value("idempotency_claim_seconds_sum", outcome="claimed") < 5
        total_claims = sum(
            value("idempotency_claim_seconds_count", outcome=o)
            for o in ("claimed", "replay", "mismatch", "in_flight", "stale", "previous_failed")
        )
        assert total_claims == 7

        text, content_type = state.metrics.render()
        assert content_type.startswith("text/plain")
        assert b'idempotency_miss_total{endpoint="POST /orders"} 2.0' in text
        assert b'idempotency_hit_total{endpoint="POST /orders",outcome="replay"} 1.0' in text

    lines = [r for r in caplog.records if r.name == "idem_shim"]
    events = [getattr(r, "idem_event", None) for r in lines]
    assert events == ["replay", "mismatch", "in_flight", "stale", "previous_failed"]
    levels = [r.levelname for r in lines]
    assert levels == ["INFO", "WARNING", "INFO", "WARNING", "INFO"]
    for record, key in zip(lines, [keys[0], keys[0], keys[1], keys[2], keys[3]], strict=True):
        message = record.getMessage()
        assert f'endpoint="{ENDPOINT}"' in message
        assert f"key={key[:4]} " in message and key not in message
        assert "key_id=" in message
        assert SECRET not in message and SECRET not in json.dumps(record.__dict__["idem"], default=str)


def test_apps_get_separate_registries(fresh_admin_url: str) -> None:
    url = shim_db(fresh_admin_url)
    with running_app(url) as first, running_app(url) as second:
        post(first.test_client(), "/orders", str(uuid.uuid4()), {"item": "a"})
        one = first.extensions["idem"].metrics.registry
        two = second.extensions["idem"].metrics.registry
        assert one.get_sample_value("idempotency_miss_total", {"endpoint": ENDPOINT}) == 1
        assert two.get_sample_value("idempotency_miss_total", {"endpoint": ENDPOINT}) is None
