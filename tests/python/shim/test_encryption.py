"""Stored responses encrypted under the app's response key, and the
credential guard on what may be stored.

Cases: with IDEM_RESPONSE_KEY the row holds ciphertext only and the replay is the plain answer;
rotation (new key + the old one as IDEM_RESPONSE_KEY_FALLBACK) still replays; without the key
that opens a body the replay is 503 on both tiers and the handler never runs again; a weak key
stops the app at start-up; export-user decrypts; a response with a credential-named field is
refused by the database: 500, the handler's writes roll back, the key fails.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from typing import Any

import pytest

from idem_shim.cli import idempotency_cli
from tests.python.support.shim import dsr_url, executions, post, running_app, scalar, shim_db

K1, K2, K3 = (secrets.token_urlsafe(32) for _ in range(3))


@pytest.fixture
def url(fresh_admin_url: str) -> str:
    return shim_db(fresh_admin_url)


def stored_body(admin: str) -> Any:
    return scalar(admin, "SELECT response_body FROM idempotency_keys ORDER BY id DESC LIMIT 1")


def test_encrypted_at_rest_and_replayed_in_clear(url: str, fresh_admin_url: str) -> None:
    key = str(uuid.uuid4())
    with running_app(url, IDEM_RESPONSE_KEY=K1) as app:
        client = app.test_client()
        first = post(client, "/orders", key, {"item": "secret-sauce"})
        assert first.status_code == 201
        body = stored_body(fresh_admin_url)
        assert body["idem_enc"] == "pgp-sym-v1" and "secret-sauce" not in json.dumps(body)
        replay = post(client, "/orders", key, {"item": "secret-sauce"})
        assert replay.get_json() == {**first.get_json(), "idempotency_replayed": True}

    with running_app(
        url, IDEM_RESPONSE_KEY=K2, IDEM_RESPONSE_KEY_FALLBACK=K1, IDEM_DSR_DATABASE_URL=dsr_url(fresh_admin_url)
    ) as rotated:
        replay = post(rotated.test_client(), "/orders", key, {"item": "secret-sauce"})
        assert replay.status_code == 201 and replay.get_json()["item"] == "secret-sauce"
        code = rotated.test_cli_runner().invoke(idempotency_cli, ["export-user", "1"])
        assert json.loads(code.output)[0]["response_body"]["item"] == "secret-sauce"


def test_without_the_opening_key_a_replay_is_503_and_never_reruns(url: str, fresh_admin_url: str) -> None:
    orders, billing = str(uuid.uuid4()), str(uuid.uuid4())
    with running_app(url, IDEM_RESPONSE_KEY=K1) as app:
        client = app.test_client()
        assert post(client, "/orders", orders, {"item": "a"}).status_code == 201
        assert post(client, "/billing", billing).status_code == 201
    with running_app(url, IDEM_RESPONSE_KEY=K3) as app:
        client = app.test_client()
        for path, key, body in (("/orders", orders, {"item": "a"}), ("/billing", billing, None)):
            response = post(client, path, key, body)
            assert response.status_code == 503, path
            assert response.get_json() == {"error": "idempotency_store_unavailable"}
        assert executions(app) == 0
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders") == 2


def test_a_weak_key_stops_the_app(url: str) -> None:
    with pytest.raises(ValueError, match="at least 32 characters"):
        running_app(url, IDEM_RESPONSE_KEY="hunter2").__enter__()


def test_the_key_never_shows_in_settings_repr(url: str) -> None:
    with running_app(url, IDEM_RESPONSE_KEY=K1) as app:
        assert K1 not in repr(app.extensions["idem"].settings)


def test_a_credential_in_the_response_is_refused_and_nothing_commits(
    url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with running_app(url) as app, caplog.at_level(logging.ERROR, logger="idem_shim"):
        app.testing = False
        key = str(uuid.uuid4())
        assert post(app.test_client(), "/leaky", key).status_code == 500
        assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'leaky'") == 0
        assert scalar(fresh_admin_url, "SELECT status FROM idempotency_keys") == "failed"
    # Told apart by its SQLSTATE (IDM04): the route's bug is named, with what to do about it.
    assert [r.getMessage().split()[1] for r in caplog.records if r.name == "idem_shim"] == ["response_refused"]


def test_refused_completions_answer_500_every_time(url: str, fresh_admin_url: str) -> None:
    """The refusal comes back through the COMMIT's pipeline; whichever order psycopg reads the
    two results in, it is the route's failure (500), never a store outage (503). Before the
    shim unwrapped PipelineAborted, about one attempt in five answered 503."""
    with running_app(url) as app:
        app.testing = False
        client = app.test_client()
        codes = [post(client, "/leaky", str(uuid.uuid4())).status_code for _ in range(20)]
    assert codes == [500] * 20
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'leaky'") == 0
