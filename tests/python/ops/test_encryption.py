"""
Encrypted stored responses (contract §3): with a key, idem_complete stores
the body as pgcrypto ciphertext in a JSONB envelope and idem_claim decrypts it on replay; the key
travels only as a bound parameter; a rotation re-encrypts without losing a replay.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.python.support.roles import as_admin_role, as_app_role
from tests.python.support.sqlapi import Claim, claim, connect, new_key, one, token_args
from tests.python.support.waiting import wait_until

SECRET = "AAPL-limit-order-7f3e91-plaintext"
BODY = {"order_id": 7, "note": SECRET, "fill_price": "187.25"}

CLAIM_WITH_KEYS = """SELECT * FROM idem_claim(p_key => %(key)s, p_user_id => NULL,
    p_endpoint => 'POST /api/trading/orders', p_request => %(request)s,
    p_wait_ms => %(wait_ms)s, p_response_key => %(rk)s, p_response_key_fallback => %(fb)s)"""


def new_response_key() -> str:
    return secrets.token_urlsafe(32)


def claim_k(
    conn: psycopg.Connection[Any], key: str, rk: str | None, fb: str | None = None, wait_ms: int = 0
) -> dict[str, Any]:
    row = conn.execute(
        CLAIM_WITH_KEYS, {"key": key, "request": Jsonb({"qty": 1}), "wait_ms": wait_ms, "rk": rk, "fb": fb}
    ).fetchone()
    assert row is not None
    return dict(row)


HEADERS = {"Location": f"/orders/{SECRET}"}


def complete_k(conn: psycopg.Connection[Any], claimed: Claim, rk: str | None, body: Any = None) -> None:
    """idem_complete with a response key; ``claimed`` is the claim row (its token is passed)."""
    key_id, token = token_args(claimed)
    conn.execute(
        "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s,"
        " p_response_key => %s, p_response_headers => %s, p_claim_token => %s)",
        (key_id, Jsonb(BODY if body is None else body), rk, Jsonb(HEADERS), token),
    )


def store(conn: psycopg.Connection[Any], rk: str | None, body: Any = None) -> str:
    key = new_key()
    got = claim_k(conn, key, rk)
    assert got["outcome"] == "claimed"
    complete_k(conn, got, rk, body)
    return key


def kid(conn: psycopg.Connection[Any], rk: str) -> str:
    return str(one(conn, "SELECT idem_response_key_id(%s) AS k", (rk,))["k"])


def raw_rows(conn: psycopg.Connection[Any]) -> str:
    """Everything a DBA without the key can read: every row of both tables as text."""
    rows = conn.execute("""SELECT k::text AS t FROM idempotency_keys k
                           UNION ALL SELECT e::text FROM idempotency_events e
                           UNION ALL SELECT a::text FROM audit_log a""").fetchall()
    return "\n".join(r["t"] for r in rows)


def test_the_plaintext_is_absent_from_the_table_and_replays_decrypt(fresh_admin_url: str) -> None:
    rk = new_response_key()
    with connect(as_app_role(fresh_admin_url)) as app, connect(fresh_admin_url) as dba:
        key = store(app, rk)
        text = raw_rows(dba)
        assert SECRET not in text and "187.25" not in text
        assert rk not in text
        body = one(dba, "SELECT response_body AS b FROM idempotency_keys")["b"]
        assert set(body) == {"idem_enc", "kid", "data"} and body["idem_enc"] == "pgp-sym-v1"
        assert body["kid"] == kid(dba, rk) and body["data"].startswith("-----BEGIN PGP MESSAGE-----")

        replay = claim_k(app, key, rk)
        assert (replay["outcome"], replay["response_code"], replay["response_body"]) == ("replay", 201, BODY)
        # The audit row of the replay carries no body either.
        assert SECRET not in raw_rows(dba)


def test_a_replay_without_the_right_key_raises_idm03_and_changes_nothing(fresh_admin_url: str) -> None:
    rk = new_response_key()
    with connect(fresh_admin_url) as conn:
        key = store(conn, rk)
        for given in (None, new_response_key()):
            with pytest.raises(psycopg.Error, match="encrypted under key id") as err:
                claim_k(conn, key, given)
            assert err.value.sqlstate == "IDM03"
            assert rk not in str(err.value)
        assert conn.execute("SELECT count(*) AS n FROM audit_log").fetchone() == {"n": 0}
        assert claim_k(conn, key, rk)["outcome"] == "replay"


def test_a_tampered_body_raises_idm03(fresh_admin_url: str) -> None:
    rk = new_response_key()
    with connect(fresh_admin_url) as conn:
        key = store(conn, rk)
        other = one(conn, "SELECT idem_encrypt_response('{\"x\": 1}', %s) AS b", (new_response_key(),))
        conn.execute(
            "UPDATE idempotency_keys SET response_body = jsonb_set(response_body, '{data}', %s)",
            (Jsonb(other["b"]["data"]),),
        )
        with pytest.raises(psycopg.Error, match="does not decrypt") as err:
            claim_k(conn, key, rk)
        assert err.value.sqlstate == "IDM03"


def test_plain_bodies_stay_replayable_once_encryption_is_switched_on(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        key = store(conn, None)
        assert claim_k(conn, key, new_response_key())["response_body"] == BODY


def test_a_weak_key_is_refused_without_echoing_it(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        got = claim_k(conn, new_key(), None)
        for weak in ("short-key", "a" * 40, "ab" * 20):
            with pytest.raises(psycopg.Error, match="generated secret") as err:
                complete_k(conn, got, weak)
            assert err.value.sqlstate == "IDM00"
            assert weak not in str(err.value)


def test_replays_work_across_a_rotation(fresh_admin_url: str) -> None:
    old, new = new_response_key(), new_response_key()
    with (
        connect(as_app_role(fresh_admin_url)) as app,
        connect(as_admin_role(fresh_admin_url)) as rotator,
        connect(fresh_admin_url) as dba,
    ):
        before = [store(app, old) for _ in range(7)]
        plain = store(app, None)  # from before encryption was switched on
        # Phase 1: the app runs with the new key and the old one as fallback.
        after = [store(app, new, body={"n": i}) for i in range(3)]
        for key in before:
            assert claim_k(app, key, new, fb=old)["response_body"] == BODY
        # Phase 2: the rotation, in batches of 3 rows, while replays go on between batches. It is
        # idem_admin's (a DBA's): the app's role could otherwise re-encrypt every body under a key
        # only an attacker holds.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT * FROM idem_reencrypt_responses(p_old_key => %s, p_new_key => %s)", (old, new))
        last_id, total = 0, 0
        while True:
            row = rotator.execute(
                "SELECT * FROM idem_reencrypt_responses(p_old_key => %s, p_new_key => %s,"
                " p_after_id => %s, p_batch_size => 3)",
                (old, new, last_id),
            ).fetchone()
            assert row is not None
            if row["last_id"] is None:
                break
            last_id, total = row["last_id"], total + row["rewritten"]
            for key in before:
                assert claim_k(app, key, new, fb=old)["outcome"] == "replay"
        assert total == 7
        kids = dba.execute(
            "SELECT response_body->>'kid' AS kid, count(*) AS n FROM idempotency_keys GROUP BY 1 ORDER BY 1 NULLS LAST"
        ).fetchall()
        assert kids == [{"kid": kid(dba, new), "n": 10}, {"kid": None, "n": 1}]
        headers_kids = dba.execute(
            "SELECT response_headers->>'kid' AS kid, count(*) AS n FROM idempotency_keys"
            " GROUP BY 1 ORDER BY 1 NULLS LAST"
        ).fetchall()
        assert headers_kids == kids, "the headers are rotated with their bodies"
        # Phase 3: the old key is gone from the app; every replay still works.
        for key in before:
            got = claim_k(app, key, new)
            assert (got["response_body"], got["response_headers"]) == (BODY, HEADERS)
        for i, key in enumerate(after):
            assert claim_k(app, key, new)["response_body"] == {"n": i}
        assert claim_k(app, plain, new)["response_body"] == BODY
        with pytest.raises(psycopg.Error, match="encrypted under key id"):
            claim_k(app, before[0], old)
        assert SECRET not in "\n".join(
            r["t"]
            for r in dba.execute(
                "SELECT k::text AS t FROM idempotency_keys k WHERE response_body->>'idem_enc' IS NOT NULL"
            ).fetchall()
        )


def test_switching_encryption_on_and_off_for_stored_rows(fresh_admin_url: str) -> None:
    rk = new_response_key()
    with connect(fresh_admin_url) as conn:
        key = store(conn, None)

        def rotate(old: str | None, new: str | None) -> int:
            row = conn.execute("SELECT * FROM idem_reencrypt_responses(%s, %s)", (old, new)).fetchone()
            assert row is not None
            assert conn.execute(
                "SELECT last_id FROM idem_reencrypt_responses(%s, %s, %s)", (old, new, row["last_id"])
            ).fetchone() == {"last_id": None}
            return int(row["rewritten"])

        assert rotate(None, rk) == 1  # on: plain rows encrypted, headers too
        assert SECRET not in raw_rows(conn)
        assert claim_k(conn, key, rk)["response_body"] == BODY
        assert claim_k(conn, key, rk)["response_headers"] == HEADERS
        assert rotate(rk, None) == 1  # off: back to plain
        assert conn.execute("SELECT response_body AS b, response_headers AS h FROM idempotency_keys").fetchone() == {
            "b": BODY,
            "h": HEADERS,
        }
        with pytest.raises(psycopg.Error, match="the same key") as err:
            conn.execute("SELECT * FROM idem_reencrypt_responses(%s, %s)", (rk, rk))
        assert err.value.sqlstate == "IDM00"
        with pytest.raises(psycopg.Error, match="give p_old_key") as err:
            conn.execute("SELECT * FROM idem_reencrypt_responses(NULL, NULL)")
        assert err.value.sqlstate == "IDM00"


def test_export_decrypts_with_the_apps_keys_only(fresh_admin_url: str) -> None:
    rk = new_response_key()
    with connect(fresh_admin_url) as conn:
        uid = one(conn, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        got = claim(conn, new_key(), user_id=uid)
        complete_k(conn, got, rk)
        sealed = one(conn, "SELECT response_body FROM public.idem_export_user(p_user_id => %s)", (uid,))
        assert sealed["response_body"]["idem_enc"] == "pgp-sym-v1"
        opened = one(
            conn, "SELECT response_body FROM public.idem_export_user(p_user_id => %s, p_response_key => %s)", (uid, rk)
        )
        assert opened["response_body"] == BODY


def test_the_key_is_a_bound_parameter_never_visible_in_activity_or_settings(fresh_admin_url: str) -> None:
    rk = new_response_key()
    key = new_key()
    seen: dict[str, Any] = {}
    with connect(fresh_admin_url) as holder, connect(fresh_admin_url) as waiter, connect(fresh_admin_url) as dba:
        held = claim_k(holder, key, rk)
        pid = waiter.info.backend_pid

        def waiting_claim() -> Any:
            row = dba.execute("SELECT query, state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            return row if row and row["state"] == "active" and "idem_claim" in row["query"] else None

        def watch() -> None:
            with contextlib.suppress(TimeoutError):  # the assertion on `seen` says so
                seen.update(wait_until(waiting_claim, 3, what="the duplicate's claim waiting in pg_stat_activity"))
                seen["settings"] = one(dba, "SELECT string_agg(setting, ' ') AS s FROM pg_settings")["s"]
                seen["role_settings"] = one(
                    dba,
                    "SELECT coalesce(string_agg(array_to_string(setconfig, ' '), ' '), '') AS s"
                    "  FROM pg_db_role_setting",
                )["s"]
                complete_k(holder, held, rk)  # let the waiting duplicate replay

        watcher = threading.Thread(target=watch)
        watcher.start()
        dup = claim_k(waiter, key, rk, wait_ms=2500)  # waits inside the call while we look
        watcher.join()
        assert dup["outcome"] == "replay" and dup["response_body"] == BODY
        assert seen, "never saw the waiting claim in pg_stat_activity"
        assert rk not in seen["query"] and "p_response_key => $" in seen["query"]
        assert rk not in seen["settings"] and rk not in seen["role_settings"]
        assert rk not in raw_rows(dba)
