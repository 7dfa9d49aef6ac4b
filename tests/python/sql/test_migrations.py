"""
Migrations stay in step with a fresh install (procrastinate's proof, done our way):
up, down to zero, up again, and migrate twice, then compare normalised schema dumps.
Also: down to zero leaves nothing of ours behind, and never drops a host's own tables.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

import testdb
from idem_shim.queries import EXPECTED_SCHEMA_VERSION
from tests.python.support import earlier
from tests.python.support.roles import login_role
from tests.python.support.schema import rollback_all, schema
from tests.python.support.sqlapi import connect

ROOT = Path(__file__).resolve().parents[3]


def migrate(url: str, *args: str) -> str:
    done = subprocess.run(
        [testdb.idem_command(), "migrate", "--database-url", url, *args], check=True, capture_output=True, text=True
    )
    return done.stdout


def test_up_down_up_and_migrating_twice_give_the_schema_of_one_fresh_install(
    empty_db: str, other_empty_db: str
) -> None:
    migrate(other_empty_db)
    reference = schema(other_empty_db)
    assert "idem_claim" in reference and "idempotency_keys" in reference

    migrate(empty_db)
    rollback_all(empty_db)
    migrate(empty_db)
    second = migrate(empty_db)
    assert "0 migration(s) applied" in second
    assert schema(empty_db) == reference


def test_down_to_zero_leaves_nothing_of_ours(empty_db: str) -> None:
    migrate(empty_db)
    rollback_all(empty_db)
    with connect(empty_db) as conn:
        leftovers = conn.execute("""
            SELECT c.relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relname NOT LIKE '\\_yoyo%' AND c.relname NOT LIKE 'yoyo%'
            UNION ALL
            SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' AND p.proname LIKE 'idem%'
            UNION ALL
            SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
             WHERE n.nspname = 'public' AND t.typname LIKE 'idem%'""").fetchall()
    assert leftovers == []


def test_a_hosts_own_tables_are_used_and_never_dropped(empty_db: str) -> None:
    with connect(empty_db) as conn:
        conn.execute("CREATE TABLE users (id integer PRIMARY KEY, name text NOT NULL)")
        conn.execute(
            "CREATE TABLE audit_log (id bigserial PRIMARY KEY, user_id integer, action text NOT NULL,"
            " context jsonb, created_at timestamptz DEFAULT now(), actor text)"
        )
    migrate(empty_db)
    rollback_all(empty_db)
    with connect(empty_db) as conn:
        cols = conn.execute("""SELECT string_agg(column_name, ',' ORDER BY ordinal_position) AS c
                                 FROM information_schema.columns WHERE table_name = 'users'""").fetchone()
        assert cols == {"c": "id,name"}
        assert conn.execute("SELECT to_regclass('audit_log') IS NOT NULL AS ok").fetchone() == {"ok": True}


def test_a_database_of_sql_api_2_upgrades_and_its_rows_replay_as_they_did(empty_db: str, tmp_path: Path) -> None:
    """Migrated and used by the previous version, then migrated by this one: the old rows replay
    their body unchanged with no headers, and new completions store headers."""
    earlier.build(empty_db, 2, tmp_path)
    keys = {name: str(uuid.uuid4()) for name in ("object", "text", "array")}
    bodies = {"object": '{"order_id": 16}', "text": '"plain words"', "array": "[1, 2]"}
    with connect(empty_db) as conn:
        assert conn.execute("SELECT idem_schema_version() AS v").fetchone() == {"v": 2}
        for name, key in keys.items():
            row = conn.execute(
                "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'e', p_request => '{}')",
                (key,),
            ).fetchone()
            assert row is not None
            conn.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s::jsonb)",
                (row["key_id"], bodies[name]),
            )

    assert "migrate: 0 migration(s) applied" not in migrate(empty_db)  # not "10 migration(s)"
    with connect(empty_db) as conn:
        assert conn.execute("SELECT idem_schema_version() AS v").fetchone() == {"v": EXPECTED_SCHEMA_VERSION}
        for name, key in keys.items():
            replay = conn.execute(
                "SELECT outcome, response_code, response_body::text AS body, response_headers"
                " FROM idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'e',"
                " p_request => '{}')",
                (key,),
            ).fetchone()
            assert replay == {"outcome": "replay", "response_code": 201, "body": bodies[name], "response_headers": None}
        # and the upgraded database takes headers from now on
        row = conn.execute(
            "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'e', p_request => '{}')",
            (str(uuid.uuid4()),),
        ).fetchone()
        assert row is not None
        conn.execute(
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}',"
            ' p_response_headers => \'{"Location": "/orders/17"}\')',
            (row["key_id"],),
        )
        assert conn.execute(
            "SELECT response_headers FROM idempotency_keys WHERE id = %s", (row["key_id"],)
        ).fetchone() == {"response_headers": {"Location": "/orders/17"}}


def test_a_store_upgraded_4_then_8_then_9_keeps_tokenless_only_the_claims_taken_before_tokens(
    empty_db: str, tmp_path: Path
) -> None:
    """Two upgrades on one node: the claim of SQL API 4 (no token) stays completable by key_id
    alone; the claim SQL API 8 took right after its upgrade (with a token) is not, even though
    both are in flight and older than the second upgrade."""
    claim = "SELECT * FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'e', p_request => '{}')"
    earlier.build(empty_db, 4, tmp_path / "api4")
    with connect(empty_db) as conn:
        conn.execute("INSERT INTO users (id) VALUES (1)")
        before = conn.execute(claim, (str(uuid.uuid4()),)).fetchone()
        conn.execute("DO $$ BEGIN CREATE ROLE idem_admin NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    earlier.build(empty_db, 8, tmp_path / "api8")
    with connect(empty_db) as conn:
        after = conn.execute(claim, (str(uuid.uuid4()),)).fetchone()
        assert before is not None and after is not None and after["claim_token"] is not None
    migrate(empty_db)
    with login_role(empty_db, "idem_app") as (_, web), connect(web) as app, connect(empty_db) as admin:
        marks = admin.execute("SELECT id, legacy_token FROM idempotency_keys ORDER BY id").fetchall()
        assert [m["legacy_token"] for m in marks] == ["none", "key_id"], marks
        complete = (
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{\"forged\": true}')"
        )
        with pytest.raises(psycopg.Error) as refused:
            app.execute(complete, (after["key_id"],))
        assert refused.value.sqlstate == "IDM00", refused.value
        app.execute(complete, (before["key_id"],))  # the old shim's completion, mid-upgrade
        states = admin.execute("SELECT status FROM idempotency_keys ORDER BY id").fetchall()
        assert [r["status"] for r in states] == ["completed", "in_flight"]


def test_claims_in_flight_across_the_upgrade_keep_the_tokens_they_were_given(empty_db: str, tmp_path: Path) -> None:
    """A rolling deploy from SQL API 8: the claims in flight at migration 0012 (marked there) finish
    with the 32-digit token of their key_id, as the old shim sends it; no other claim accepts one,
    and no claim is completable without a token by the app's role."""
    earlier.build(empty_db, 8, tmp_path)
    with connect(empty_db) as conn:
        conn.execute("INSERT INTO users (id) VALUES (1)")
        held, other = (
            conn.execute(
                "SELECT key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'e',"
                " p_request => '{}')",
                (str(uuid.uuid4()),),
            ).fetchone()
            for _ in range(2)
        )
        assert held is not None and other is not None and len(held["claim_token"]) == 32
    migrate(empty_db)
    with login_role(empty_db, "idem_app") as (_, web), connect(web) as app:
        new = app.execute(
            "SELECT key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'e',"
            " p_request => '{}')",
            (str(uuid.uuid4()),),
        ).fetchone()
        assert new is not None and len(new["claim_token"]) == 48
        complete = (
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}', p_claim_token => %s)"
        )
        for key_id, token, sqlstate in (
            (other["key_id"], None, "IDM00"),  # a claim of SQL API 5-8 had a token: it needs it
            (new["key_id"], held["claim_token"], "IDM01"),  # an old token fits no other claim
            (new["key_id"], new["claim_token"][:32], "IDM01"),  # nor does the hash half of a new one
        ):
            with pytest.raises(psycopg.Error) as refused:
                app.execute(complete, (key_id, token))
            assert refused.value.sqlstate == sqlstate, refused.value
        app.execute(complete, (held["key_id"], held["claim_token"]))  # the old shim's completion
        app.execute(complete, (new["key_id"], new["claim_token"]))
    with connect(empty_db) as conn:
        states = conn.execute("SELECT id, status, legacy_token FROM idempotency_keys ORDER BY id").fetchall()
    assert [(r["status"], r["legacy_token"]) for r in states] == [
        ("completed", "key_id"),
        ("in_flight", "key_id"),
        ("completed", None),
    ]


def test_a_database_whose_strings_are_not_standard_gets_the_same_schema(empty_db: str, other_empty_db: str) -> None:
    """ALTER DATABASE ... SET standard_conforming_strings = off (a legacy app's setting) reaches the
    migrating session: idem migrate sets it back on, so every body and comment reads as written."""
    migrate(other_empty_db)
    with connect(empty_db) as conn:
        name = conn.execute("SELECT current_database() AS d").fetchone()
        assert name is not None
        conn.execute(f'ALTER DATABASE "{name["d"]}" SET standard_conforming_strings = off')
    migrate(empty_db)
    assert _routines(empty_db) == _routines(other_empty_db)


def _routines(url: str) -> list[tuple[object, ...]]:
    """Each idem routine as stored, printed with the standard setting (pg_dump would print a
    database's literals after the database's own): its definition and its comment."""
    with psycopg.connect(url, options="-c standard_conforming_strings=on") as conn:
        return conn.execute(
            "SELECT p.proname, pg_catalog.pg_get_functiondef(p.oid), pg_catalog.obj_description(p.oid, 'pg_proc')"
            " FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'public'::regnamespace"
            " AND pg_catalog.starts_with(p.proname, 'idem_') ORDER BY 1"
        ).fetchall()
