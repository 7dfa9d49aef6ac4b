"""
An upgrade in place, under traffic: a database built by an earlier idem (SQL API 1:
migrations 0001–0003 and the functions of that time, built by tests/python/support/earlier.py) takes
claims and completions on other connections, as the app's role, while `idem migrate` brings it
to the package's SQL API. Migrations 0004 and 0005 DROP the old signatures of idem_claim,
idem_complete and idem_cleanup; because the migrations and the function files commit as one
transaction, no call in the loop ever finds a function missing: zero errors.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import testdb
from idem_shim import schema as idem_schema
from idem_shim.queries import EXPECTED_SCHEMA_VERSION
from tests.python.support import earlier
from tests.python.support.roles import as_app_role
from tests.python.support.sqlapi import connect, one
from tests.python.support.waiting import wait_until

WORKERS = 4

# What a shim of SQL API 1 sends, and what stays valid across the upgrade (named arguments, the
# new parameters have defaults). Prepared after a few calls, as psycopg does by default.
# The claim token is read by name from the row when the claim returned one: a claim
# taken before migration 0008 has none and completes without it (0008 records those key_ids).
CLAIM = (
    "SELECT c.outcome, c.key_id, to_jsonb(c) ->> 'claim_token' FROM idem_claim(p_key => %s::text, "
    "p_user_id => NULL::integer, p_endpoint => %s::text, p_request => %s::jsonb, p_ttl => '1 hour'::interval) c"
)
COMPLETE = "SELECT idem_complete(p_key_id => %s::bigint, p_response_code => %s::integer, p_response_body => %s::jsonb)"
COMPLETE_WITH_TOKEN = (
    "SELECT idem_complete(p_key_id => %s::bigint, p_response_code => %s::integer, p_response_body => %s::jsonb, "
    "p_claim_token => %s::text)"
)


def claim(conn: psycopg.Connection[Any], params: tuple[str, str, str]) -> tuple[str, int, str | None]:
    """The claim as the shim sends it (idem_shim.store.Store._claim_on): an upgrade that adds a column
    to idem_claim_result makes PostgreSQL refuse a statement prepared before it once (42804 or
    0A000), then re-plan it; the shim sends it again, once, on the same connection."""
    try:
        row = conn.execute(CLAIM, params).fetchone()
    except (psycopg.errors.DatatypeMismatch, psycopg.errors.FeatureNotSupported):
        row = conn.execute(CLAIM, params).fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), row[2]


@pytest.fixture
def v1_db(admin_url: str, tmp_path: Path) -> Iterator[str]:
    name = f"idem_up_{uuid.uuid4().hex[:10]}"
    url = testdb.create(admin_url, name)
    earlier.build(url, 1, tmp_path)
    yield url
    testdb.drop(admin_url, name)


class Traffic:
    """Claims, completions and replays in a loop on WORKERS connections of the app's role."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = as_app_role(url), threading.Event()
        self.errors: list[str] = []
        self.done = [0] * WORKERS
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(WORKERS)]

    def run(self, worker: int) -> None:
        endpoint = f"POST /upgrade/{worker}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                key, body = str(uuid.uuid4()), json.dumps({"n": self.done[worker]})
                try:
                    outcome, key_id, token = claim(conn, (key, endpoint, body))
                    assert outcome == "claimed", outcome
                    with conn.transaction():  # the completion joins the handler's transaction
                        if token is None:
                            conn.execute(COMPLETE, (key_id, 201, json.dumps({"ok": True})))
                        else:
                            conn.execute(COMPLETE_WITH_TOKEN, (key_id, 201, json.dumps({"ok": True}), token))
                    again = claim(conn, (key, endpoint, body))
                    assert again[0] == "replay", again
                except Exception as exc:  # every failure counts, whatever its kind
                    self.errors.append(f"worker {worker} call {self.done[worker]}: {type(exc).__name__}: {exc}")
                    time.sleep(0.01)  # a failed call backs off a moment: traffic, not a wait for anything
                self.done[worker] += 1

    def wait_for(self, calls: int, timeout: float = 60) -> None:
        target = [d + calls for d in self.done]
        wait_until(
            lambda: all(d >= t for d, t in zip(self.done, target, strict=True)),
            timeout=timeout,
            what=f"{calls} more calls of every worker (from {list(self.done)})",
        )


@pytest.mark.slow
def test_an_upgrade_under_traffic_never_shows_a_missing_function(v1_db: str) -> None:
    with connect(v1_db) as conn:
        assert conn.execute("SELECT public.idem_schema_version() AS v").fetchone() == {"v": 1}
        assert conn.execute(
            "SELECT to_regprocedure('public.idem_claim(text, integer, text, jsonb, "
            "interval, interval, integer, text, timestamptz)') IS NOT NULL AS old"
        ).fetchone() == {"old": True}
    traffic = Traffic(v1_db)
    for thread in traffic.threads:
        thread.start()
    try:
        traffic.wait_for(20)  # warmed up: statements prepared against the old functions
        for _ in range(2):  # the upgrade, then a migrate with nothing pending, both under traffic
            done = subprocess.run(
                [testdb.idem_command(), "migrate", "--database-url", v1_db], capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
        assert "0 migration(s) applied" in done.stdout
        traffic.wait_for(20)
    finally:
        traffic.stop.set()
        for thread in traffic.threads:
            thread.join(timeout=30)
    assert traffic.errors == [], traffic.errors[:5]
    with connect(v1_db) as conn:
        assert conn.execute("SELECT public.idem_schema_version() AS v").fetchone() == {"v": EXPECTED_SCHEMA_VERSION}
        assert conn.execute("SELECT count(*) AS n FROM _yoyo_migration").fetchone() == {
            "n": len(idem_schema.read_migrations())
        }
        completed = one(conn, "SELECT count(*) AS n FROM idempotency_keys WHERE status = 'completed'")
    assert completed["n"] == sum(traffic.done) >= WORKERS * 40
