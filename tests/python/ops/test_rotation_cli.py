"""
`flask idempotency rotate-response-key`: run with a DBA's role (a member of idem_admin,
through IDEM_ADMIN_DATABASE_URL, contract §3a) while the app holds the new key and the old one as
fallback, it re-encrypts every stored body and every replay still works; --from-plain encrypts
bodies stored before encryption was switched on; keys never printed. The app's own role is refused
in one line that names idem_admin, and nothing is re-encrypted.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import uuid
from typing import Any

import pytest
from flask import Flask

from idem_shim.cli import idempotency_cli
from tests.python.support.shim import dba_url, post, running_app, scalar, shim_db

K_OLD, K_NEW = secrets.token_urlsafe(32), secrets.token_urlsafe(32)


def dba_app(url: str, dba: str, **config: Any) -> contextlib.AbstractContextManager[Flask]:
    """The app on its own role (``url``), its admin verbs on a DBA's (IDEM_ADMIN_DATABASE_URL)."""
    return running_app(url, IDEM_ADMIN_DATABASE_URL=dba, **config)


def run(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(idempotency_cli, args)
    return result.exit_code, result.output


def kids(admin: str) -> list[str | None]:
    rows = scalar(admin, "SELECT json_agg(response_body->>'kid' ORDER BY id) FROM idempotency_keys")
    return list(rows if isinstance(rows, list) else json.loads(rows))


def test_rotation_from_the_cli_keeps_every_replay(fresh_admin_url: str) -> None:
    url, dba = shim_db(fresh_admin_url), dba_url(fresh_admin_url)
    plain_key = str(uuid.uuid4())
    with running_app(url) as app:  # before encryption: one body stored in clear
        assert post(app.test_client(), "/orders", plain_key, {"item": "clear"}).status_code == 201
    old_keys = [str(uuid.uuid4()) for _ in range(5)]
    with dba_app(url, dba, IDEM_RESPONSE_KEY=K_OLD) as app:
        code, output = run(app, "rotate-response-key", "--from-plain", "--batch-size", "2")
        assert code == 0, output
        assert "re-encrypted 1 stored responses" in output
        for key in old_keys:
            assert post(app.test_client(), "/orders", key, {"item": key}).status_code == 201
    assert None not in kids(fresh_admin_url)

    with dba_app(url, dba, IDEM_RESPONSE_KEY=K_NEW, IDEM_RESPONSE_KEY_FALLBACK=K_OLD) as app:
        code, output = run(app, "rotate-response-key", "--batch-size", "2")
        assert code == 0, output
        assert "re-encrypted 6 stored responses in 3 batches" in output
        assert K_OLD not in output and K_NEW not in output
    assert len(set(kids(fresh_admin_url))) == 1

    with running_app(url, IDEM_RESPONSE_KEY=K_NEW) as app:  # the old key is gone for good
        client = app.test_client()
        for key in old_keys:
            replay = post(client, "/orders", key, {"item": key})
            assert replay.status_code == 201 and replay.headers.get("Idempotent-Replayed") == "true"
        assert post(client, "/orders", plain_key, {"item": "clear"}).headers.get("Idempotent-Replayed") == "true"


def test_rotation_without_a_fallback_key_is_a_usage_error(fresh_admin_url: str) -> None:
    with running_app(shim_db(fresh_admin_url), IDEM_RESPONSE_KEY=K_NEW) as app:
        code, output = run(app, "rotate-response-key")
        assert code != 0 and "IDEM_RESPONSE_KEY_FALLBACK" in output


K_WRONG = secrets.token_urlsafe(32)


def _store_bodies(url: str, n: int, **config: Any) -> list[str]:
    keys = [str(uuid.uuid4()) for _ in range(n)]
    with running_app(url, **config) as app:
        for key in keys:
            assert post(app.test_client(), "/orders", key, {"item": key}).status_code == 201
    return keys


def test_a_fallback_that_opens_nothing_says_so_and_fails(fresh_admin_url: str) -> None:
    url, dba = shim_db(fresh_admin_url), dba_url(fresh_admin_url)
    _store_bodies(url, 3, IDEM_RESPONSE_KEY=K_OLD)
    before = kids(fresh_admin_url)
    with dba_app(url, dba, IDEM_RESPONSE_KEY=K_NEW, IDEM_RESPONSE_KEY_FALLBACK=K_WRONG) as app:
        code, output = run(app, "rotate-response-key", "--batch-size", "2")
    assert code != 0, output
    assert "re-encrypted 0 stored responses" in output
    assert "3 stored responses are still under key id " + str(before[0]) in output, output
    assert "IDEM_RESPONSE_KEY_FALLBACK" in output and K_WRONG not in output
    assert kids(fresh_admin_url) == before  # nothing changed


def test_switching_off_with_a_wrong_fallback_does_not_claim_clear(fresh_admin_url: str) -> None:
    url, dba = shim_db(fresh_admin_url), dba_url(fresh_admin_url)
    _store_bodies(url, 2, IDEM_RESPONSE_KEY=K_OLD)
    with dba_app(url, dba, IDEM_RESPONSE_KEY_FALLBACK=K_WRONG) as app:
        code, output = run(app, "rotate-response-key")
    assert code != 0, output
    assert "2 stored responses are still under key id" in output and "-> clear)" not in output
    with dba_app(url, dba, IDEM_RESPONSE_KEY_FALLBACK=K_OLD) as app:  # the right key
        code, output = run(app, "rotate-response-key")
    assert code == 0, output
    assert "re-encrypted 2 stored responses" in output and "(fallback key -> clear)" in output
    assert kids(fresh_admin_url) == [None, None]


def test_a_finished_rotation_run_again_is_a_success(fresh_admin_url: str) -> None:
    url, dba = shim_db(fresh_admin_url), dba_url(fresh_admin_url)
    _store_bodies(url, 2, IDEM_RESPONSE_KEY=K_NEW)
    with dba_app(url, dba, IDEM_RESPONSE_KEY=K_NEW, IDEM_RESPONSE_KEY_FALLBACK=K_OLD) as app:
        code, output = run(app, "rotate-response-key")
    assert code == 0, output
    assert "re-encrypted 0 stored responses" in output and "every stored response is under the current key" in output


def test_the_app_role_may_not_rotate(fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-encryption is idem_admin's (an attacker with the app's role could otherwise re-encrypt
    every body under a key only they hold): without IDEM_ADMIN_DATABASE_URL the verb runs as the
    app's role, is refused in one line naming idem_admin, and no body changes."""
    monkeypatch.delenv("IDEM_ADMIN_DATABASE_URL", raising=False)
    url = shim_db(fresh_admin_url)
    _store_bodies(url, 2, IDEM_RESPONSE_KEY=K_OLD)
    before = kids(fresh_admin_url)
    with running_app(url, IDEM_RESPONSE_KEY=K_NEW, IDEM_RESPONSE_KEY_FALLBACK=K_OLD) as app:
        code, output = run(app, "rotate-response-key")
    assert code == 1, output
    assert output.strip() == (
        "Error: this role may not re-encrypt the stored responses: "
        "it needs idem_admin (GRANT idem_admin TO <role>), or set IDEM_ADMIN_DATABASE_URL to a DBA's URL"
    ), output
    assert K_OLD not in output and K_NEW not in output
    assert kids(fresh_admin_url) == before
