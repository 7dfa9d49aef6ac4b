"""bench/peers (`make bench-peers`) without its own venv: the peers' pins stay out of the main venv,
idem's app of that harness protects one route and leaves the other raw, and the floor (idem's
shape in raw SQL) runs a key's handler once and commits its claim asynchronously.

The harness itself needs .venv-peers and minutes of load, so `make test` does not run it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from bench.peers import orders

ROOT = Path(__file__).resolve().parents[3]


def _peers_group() -> list[str]:
    text = (ROOT / "requirements.txt").read_text()
    group = text[text.index("\n# peers:") :]
    return [line for line in group.splitlines() if line and not line.startswith("#")]


def test_the_peers_are_pinned_exactly_and_absent_from_the_main_venv() -> None:
    pins = _peers_group()
    assert {"idemkit", "drf-idempotency", "fastidempotent"} <= {p.split("==")[0] for p in pins}, pins
    for pin in pins:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", pin), f"not an exact pin: {pin}"
        with pytest.raises(PackageNotFoundError):  # make venv stops at the group's header
            version(pin.split("==")[0])


def _one_key_twice(
    make_app: Callable[[], Flask], url: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[FlaskClient, str, TestResponse, TestResponse]:
    """The app on url's database (its `orders` table, user 1): the same fresh key POSTed twice."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(orders.SCHEMA)
        conn.execute("INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")
    monkeypatch.setenv("DATABASE_URL", url)
    client = make_app().test_client()
    key = str(uuid.uuid4())
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    first = client.post(orders.PROTECTED, data=orders.BODY, headers=headers)
    return client, key, first, client.post(orders.PROTECTED, data=orders.BODY, headers=headers)


def test_the_idem_app_replays_its_protected_route_and_runs_the_raw_one_each_time(
    fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.peers.flask_apps import idem_app

    client, key, first, again = _one_key_twice(idem_app, fresh_admin_url, monkeypatch)
    assert (first.status_code, again.status_code) == (201, 201), again.get_data(as_text=True)
    assert again.get_json()["id"] == first.get_json()["id"]
    raw = [client.post(orders.RAW, data=orders.BODY, headers={"Content-Type": "application/json"}) for _ in range(2)]
    assert [r.status_code for r in raw] == [201, 201]
    with psycopg.connect(fresh_admin_url) as conn:
        rows = conn.execute("SELECT idem_key, count(*) FROM orders GROUP BY idem_key ORDER BY idem_key").fetchall()
    assert rows == [(key, 1), (None, 2)]


def test_the_floor_runs_a_key_once_and_answers_its_duplicate_409_without_a_replay(
    fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.peers.flask_apps import floor_app, floor_store

    floor_store(fresh_admin_url)
    _, key, first, again = _one_key_twice(floor_app, fresh_admin_url, monkeypatch)
    assert (first.status_code, again.status_code) == (201, 409), again.get_data(as_text=True)
    assert "id" not in again.get_json()
    assert not any(name.lower().endswith("replayed") for name in again.headers.keys())
    with psycopg.connect(fresh_admin_url) as conn:
        rows = conn.execute("SELECT idem_key, count(*) FROM orders GROUP BY idem_key").fetchall()
        stored = conn.execute(
            "SELECT idem_key, scope_user_id, scope_endpoint, status, response_code, response_body FROM floor_keys"
        ).fetchall()
    assert rows == [(key, 1)]  # the handler ran once
    assert stored == [(key, 1, "POST /orders", "completed", 201, first.get_json())]


def test_the_floor_claim_commits_asynchronously_and_its_table_is_idems(fresh_admin_url: str) -> None:
    from bench.peers.flask_apps import FLOOR_CLAIM, floor_store
    from bench.sql_path import check_same_shape

    floor_store(fresh_admin_url)
    check_same_shape(fresh_admin_url, "floor_keys")  # indexes, constraints, fillfactor
    with psycopg.connect(fresh_admin_url) as conn:
        conn.execute("INSERT INTO users (id) VALUES (1)")
        conn.execute("SET synchronous_commit = on")  # the session's (the test cluster's default is off)
        conn.commit()
        claimed = conn.execute(FLOOR_CLAIM, (str(uuid.uuid4()), 1, "POST /orders", "0" * 64)).fetchone()
        assert claimed is not None
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)  # at this transaction's commit
        conn.rollback()
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)  # and no later one's


def test_the_in_transaction_row_runs_only_where_the_decorator_takes_claim() -> None:
    from dataclasses import fields

    from bench.peers.harness import SYSTEMS, runnable
    from idem_shim.policy import Policy

    chosen, skipped = runnable(SYSTEMS)
    tx = [s for s in SYSTEMS if s.claim == "in_transaction"]
    assert [s.key for s in tx] == ["idem_tx"] and tx[0].env == {"BENCH_IDEM_CLAIM": "in_transaction"}
    if "claim" in {f.name for f in fields(Policy)}:
        assert chosen == SYSTEMS and skipped == []
    else:
        assert [s.key for s, _ in skipped] == ["idem_tx"] and "claim=" in skipped[0][1]
        assert [s.key for s in chosen] == [s.key for s in SYSTEMS if s.key != "idem_tx"]


def test_write_transactions_are_the_commits_that_wrote(fresh_admin_url: str) -> None:
    """A transaction with a savepoint is one write transaction (two transaction ids), an
    asynchronous commit one, a read-only transaction none: what the peers' table counts."""
    from bench.peers.harness import server_state, write_transactions

    xids: list[int] = []
    before = server_state(fresh_admin_url)
    with psycopg.connect(fresh_admin_url) as conn:
        conn.execute("CREATE TABLE wt (x int)")
        xids.append(int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]))  # type: ignore[index]
        conn.commit()
        conn.execute("SAVEPOINT s")
        conn.execute("INSERT INTO wt VALUES (1)")
        conn.execute("RELEASE s")
        xids.append(int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]))  # type: ignore[index]
        conn.commit()
        conn.execute("SET LOCAL synchronous_commit = off")
        conn.execute("INSERT INTO wt VALUES (2)")
        xids.append(int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]))  # type: ignore[index]
        conn.commit()
        assert conn.execute("SELECT count(*), pg_current_xact_id_if_assigned() FROM wt").fetchone() == (2, None)
        conn.commit()
    after = server_state(fresh_admin_url)
    assert after.xid - before.xid >= 4  # the subtransaction took an id of its own
    assert write_transactions(fresh_admin_url, before, after, xids) == 3
    assert write_transactions(fresh_admin_url, before, after, [xids[0] + 10**6]) == 0
