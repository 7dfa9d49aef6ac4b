"""Nothing the store's owner runs resolves a name through the caller's path (contract §3a).

The attack: the app's login role owns the database (``CREATE DATABASE app OWNER web``), so on
PostgreSQL 15 it owns ``public`` and may set the database's ``search_path``. As that role (a
plain member of ``idem_app``, never a superuser) the attacker plants, for every operator,
function and type that idem's SQL names (derived from the bodies, tests/python/support/planted.py),
a look-alike in ``public`` that logs and makes the attacker a superuser when anyone else runs
it, puts ``public`` before ``pg_catalog`` on the database's path, and plants ``pg_temp`` objects
in its own session too. Then the owner (a superuser, as a DBA typically is) does everything it
does in that database: ``idem migrate`` (the first, over the plants, and again), ``idem sql``
through psql, ``idem status``, the cleanup by ``CALL`` (batched, paced and paused) and through a
real pg_cron job, the schedule, the key rotation and its census, inspect, health (function and
view), a DBA's completion by key_id, and the CLI's admin and data-subject verbs. Nothing planted
may run and the attacker stays a plain login role. On SQL API 8 the first ``idem migrate``
already made it a superuser.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from flask import Flask
from psycopg import sql

import testdb
from idem_shim import Idem
from idem_shim.cli import idempotency_cli
from tests.python.support import planted
from tests.python.support.owned import declared_command, idem, pinned
from tests.python.support.sqlapi import new_key
from tests.python.support.waiting import wait_until

#: Expired rows for the cleanup: more than two of its default batches, so it paces itself.
EXPIRED = 2500
SEED = """
INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                                     response_code, response_body, created_at, locked_at, expires_at)
SELECT pg_catalog.gen_random_uuid()::pg_catalog.text, NULL, 'POST /orders', 'h', 'completed', 201,
       '{"ok": true}'::pg_catalog.jsonb, pg_catalog.now() OPERATOR(pg_catalog.-) '2 hours'::pg_catalog.interval,
       pg_catalog.now() OPERATOR(pg_catalog.-) '2 hours'::pg_catalog.interval,
       pg_catalog.now() OPERATOR(pg_catalog.-) '1 hour'::pg_catalog.interval
  FROM pg_catalog.generate_series(1, %s)
"""


def as_dba(url: str, notices: list[str]) -> psycopg.Connection[Any]:
    """A DBA's session as it comes: the database's default path (the attacker's), notices kept."""
    conn = psycopg.connect(url, autocommit=True)
    conn.add_notice_handler(lambda d: notices.append(f"{d.severity}: {d.message_primary}"))
    return conn


@pytest.fixture(scope="module")
def plan(admin_url: str, template_db: str) -> planted.Plan:
    """What idem's SQL names, read from a clean migrated store."""
    with pinned(testdb.url_for(admin_url, template_db)) as conn:
        found = planted.derive(conn)
    assert len(found.operators) > 100 and found.functions and "float8" in found.types, found
    assert ("/", "float8", "int4", "double precision") in found.operators  # the float8 / int4
    return found


def plant(owned: dict[str, str], plan: planted.Plan) -> None:
    """As public's owner (the database's): the plants stay where they are, public stays its own
    (a superuser's migrate makes idem's DDL guard, so it may not replace idem's objects)."""
    with pinned(owned["attacker_url"]) as conn:
        count = planted.plant(conn, owned["role"], plan)
    assert count > 200


def verdict(owned: dict[str, str], notices: list[str]) -> tuple[bool, list[Any], list[str]]:
    with pinned(owned["url"]) as conn:
        rolsuper = conn.execute(
            "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s", (owned["role"],)
        ).fetchone()
        log = planted.ran(conn)
    assert rolsuper is not None
    return bool(rolsuper[0]), log, [n for n in notices if "PWNED" in n]


def cli_app(owned: dict[str, str], response_key: str) -> Flask:
    """The app as the attacker's role (its login role), its admin and data-subject verbs on the DBA's URL."""
    app = Flask("owner_path")
    app.config.update(
        IDEM_DATABASE_URL=owned["attacker_url"],
        IDEM_ADMIN_DATABASE_URL=owned["url"],
        IDEM_DSR_DATABASE_URL=owned["url"],
        IDEM_RESPONSE_KEY=response_key,
    )
    Idem(app)
    return app


def test_nothing_planted_runs_in_what_the_owner_runs(owned: dict[str, str], plan: planted.Plan) -> None:
    plant(owned, plan)  # before idem is installed: the first migrate runs over the plants
    url, notices, errors = owned["url"], [], {}
    response_key, new_response_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    found: dict[str, Any] = {}

    def command(*args: str, stdin: str | None = None) -> None:
        done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300)
        notices.extend((done.stdout + done.stderr).splitlines())
        assert done.returncode == 0, f"{done.stdout}{done.stderr}"

    def prepare() -> None:
        with pinned(url) as conn:
            conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
            conn.execute(SEED, (EXPIRED,))
            found["user"] = conn.execute("INSERT INTO public.users DEFAULT VALUES RETURNING id").fetchone()[0]  # type: ignore[index]
        # The attacker's own session: pg_temp plants too, and the request path it may call.
        with psycopg.connect(owned["attacker_url"], autocommit=True) as app:
            app.execute(
                "CREATE FUNCTION pg_temp.now() RETURNS timestamptz LANGUAGE sql"
                " AS $$ SELECT pg_catalog.now() WHERE public.pwn('pg_temp.now') $$"
            )
            app.execute("CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (public.pwn('pg_temp.text'))")
            found["held"] = app.execute(
                "SELECT key_id FROM public.idem_claim(p_key => %s, p_user_id => NULL,"
                " p_endpoint => 'POST /orders', p_request => '{}')",
                (new_key(),),
            ).fetchone()[0]  # type: ignore[index]

    def dba(*statements: tuple[str, Any]) -> None:
        with as_dba(url, notices) as conn:
            for query, params in statements:
                conn.execute(query, params)

    def seed(n: int) -> None:
        with pinned(url) as conn:
            conn.execute(SEED, (n,))

    def owner_claims_and_completes() -> None:
        with as_dba(url, notices) as conn:
            row = conn.execute(
                "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => 'POST /orders',"
                " p_request => '{}')",
                (new_key(), found["user"]),
            ).fetchone()
            assert row is not None
            conn.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{\"n\": 2}',"
                ' p_response_key => %s, p_response_headers => \'{"Location": "/orders/2"}\')',
                (row[0], response_key),
            )

    def cli(*args: str) -> None:
        seed(30)
        result = cli_app(owned, new_response_key).test_cli_runner().invoke(idempotency_cli, args)
        notices.extend(result.output.splitlines())
        assert result.exit_code == 0, result.output

    steps: list[tuple[str, Callable[[], object]]] = [
        (
            "idem migrate, the first, over the plants",
            lambda: command(testdb.idem_command(), "migrate", "--database-url", url),
        ),
        ("the attacker joins idem_app and claims", prepare),
        ("idem migrate again", lambda: command(testdb.idem_command(), "migrate", "--database-url", url)),
        (
            "idem sql | psql",
            lambda: command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, stdin=idem("sql").stdout),
        ),
        ("idem status", lambda: notices.extend(idem("status", "--database-url", url).stdout.splitlines())),
        (
            "a DBA completes by key_id",
            lambda: dba(
                (
                    "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}')",
                    (found["held"],),
                )
            ),
        ),
        ("the owner claims and completes, encrypted", owner_claims_and_completes),
        (
            "CALL idem_cleanup(), batched, paced and paused",
            lambda: dba(
                ("CALL idem_cleanup(p_batch_size => 500, p_pause_ms => 1, p_max_rows_per_second => 100000)", None)
            ),
        ),
        ("1200 more expired rows", lambda: seed(1200)),
        ("CALL idem_cleanup() as pg_cron runs it", lambda: dba(("CALL public.idem_cleanup()", None))),
        (
            "the schedule and the plan",
            lambda: dba(("SELECT public.idem_schedule_cleanup()", None), ("SELECT * FROM idem_cleanup_plan()", None)),
        ),
        (
            "rotation and its census",
            lambda: dba(
                (
                    "SELECT * FROM idem_reencrypt_responses(p_old_key => %s, p_new_key => %s, p_after_id => 0)",
                    (response_key, new_response_key),
                ),
                (
                    "SELECT * FROM idem_reencrypt_responses(p_old_key => NULL, p_new_key => %s, p_after_id => 0)",
                    (new_response_key,),
                ),
                ("SELECT * FROM idem_response_key_census(p_current_key => %s)", (new_response_key,)),
            ),
        ),
        (
            "inspect and health",
            lambda: dba(
                ("SELECT * FROM idem_inspect(p_key => %s, p_with_body => true)", (new_key(),)),
                ("SELECT * FROM idem_health()", None),
                ("SELECT * FROM idem_health", None),
                ("SELECT idem_canonical_key(p_key => %s)", (new_key().upper(),)),
            ),
        ),
        (
            "export and erase",
            lambda: dba(
                ("SELECT idem_export_user(p_user_id => %s, p_response_key => %s)", (found["user"], new_response_key)),
                ("SELECT idem_erase_user(p_user_id => %s)", (found["user"],)),
            ),
        ),
        ("flask idempotency cleanup", lambda: cli("cleanup", "--batch-size", "10")),
        ("flask idempotency stats", lambda: cli("stats")),
        ("flask idempotency rotate-response-key", lambda: cli("rotate-response-key", "--from-plain")),
        ("flask idempotency export-user", lambda: cli("export-user", "1")),
        ("flask idempotency erase-user", lambda: cli("erase-user", "1")),
    ]
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # a refusal or a breakage; what matters is what ran
            errors[name] = str(exc).strip().splitlines()[0][:300]

    superuser, log, pwned = verdict(owned, notices)
    assert not superuser and not log and not pwned, (
        f"planted objects ran (the attacker is a superuser now: {superuser}):\n"
        + "\n".join(f"  as {who}: {what} <- {(context or '').splitlines()[-1]}" for who, what, context in log[:30])
        + f"\nsteps that failed: {errors}"
    )
    assert not errors, errors


@pytest.mark.slow
def test_nothing_planted_runs_in_the_pg_cron_job(owned: dict[str, str], admin_url: str, plan: planted.Plan) -> None:
    with pinned(admin_url) as conn:
        row = conn.execute(
            "SELECT pg_catalog.current_setting('cron.database_name', true)"
            " OPERATOR(pg_catalog.=) pg_catalog.current_database()"
        ).fetchone()
    if not row or not row[0]:
        pytest.skip("DATABASE_URL is not pg_cron's database")
    done = idem("migrate", "--database-url", owned["url"])
    assert done.returncode == 0, done.stderr
    with pinned(owned["url"]) as conn:
        conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
        conn.execute(SEED, (EXPIRED,))
    plant(owned, plan)  # after a clean migrate: what the job itself runs
    with pinned(admin_url) as conn:
        version = conn.execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_cron'").fetchone()
        assert version is not None
        major, minor = (int(p) for p in str(version[0]).split("-")[0].split(".")[:2])
        schedule = "5 seconds" if (major, minor) >= (1, 5) else "* * * * *"
        jobid = conn.execute(
            "SELECT cron.schedule_in_database(%s, %s, %s, %s)",
            (f"idem-pwn-{owned['db']}", schedule, declared_command(owned["url"]), owned["db"]),
        ).fetchone()
        assert jobid is not None
    try:
        with pinned(admin_url) as conn:
            run = wait_until(
                lambda: conn.execute(
                    "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s"
                    " AND status IN ('succeeded', 'failed') ORDER BY runid LIMIT 1",
                    (jobid[0],),
                ).fetchone(),
                timeout=90,
                what="pg_cron's run of the job",
            )
    finally:
        with pinned(admin_url) as conn:
            conn.execute("SELECT cron.unschedule(%s::bigint)", (jobid[0],))
            conn.execute("DELETE FROM cron.job_run_details WHERE jobid = %s", (jobid[0],))
    superuser, log, _ = verdict(owned, [])
    assert run is not None, "pg_cron did not run the job"
    assert not log and not superuser, f"the pg_cron job ran planted objects (superuser: {superuser}): {log[:10]}"
    assert run[0] == "succeeded", run[1]
    with pinned(owned["url"]) as conn:
        left = conn.execute("SELECT pg_catalog.count(*) FROM public.idempotency_keys").fetchone()
    assert left == (0,), "the job did not delete the expired rows"


def test_the_plants_are_where_the_owners_sessions_look(owned: dict[str, str], plan: planted.Plan) -> None:
    """The control: the attacker's path is the database's default and it may create in public."""
    plant(owned, plan)
    with pinned(owned["url"]) as conn:
        path = conn.execute(
            "SELECT s.setconfig FROM pg_catalog.pg_db_role_setting s"
            " JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase"
            " WHERE d.datname = pg_catalog.current_database() AND s.setrole = 0"
        ).fetchone()
        owner = conn.execute(
            "SELECT pg_catalog.has_schema_privilege(%s, 'public', 'CREATE')",
            (owned["role"],),
        ).fetchone()
    assert path == (["search_path=public, pg_catalog"],)
    assert owner == (True,), "the attacker may create in public"


def test_what_another_role_made_under_idems_names_is_refused_before_it_runs(owned: dict[str, str]) -> None:
    """The role that owns public may drop any object there and make its own under the name: a view
    named like yoyo's table before the first migrate, a function named like idem's after it.
    `idem migrate` and `idem status` refuse, naming each, before they read or call one of them."""
    url, role = owned["url"], owned["role"]
    with pinned(owned["attacker_url"]) as conn:
        planted.plant(conn, role, planted.Plan())  # pwn() and its log, nothing else
        conn.execute(
            "CREATE VIEW public._yoyo_migration AS SELECT 'x'::text AS migration_hash, 'x'::text AS migration_id,"
            " now()::timestamp AS applied_at_utc WHERE public.pwn('view _yoyo_migration')"
        )
    for verb in ("migrate", "status"):
        done = idem(verb, "--database-url", url)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"view public._yoyo_migration (owned by {role}) not made by the store's owner" in done.stderr
    with pinned(owned["attacker_url"]) as conn:
        conn.execute("DROP VIEW public._yoyo_migration")
    assert idem("migrate", "--database-url", url).returncode == 0
    with pinned(owned["attacker_url"]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege, match="refused"):
        conn.execute("DROP FUNCTION public.idem_cleanup_batch")  # idem's DDL guard
    with pinned(owned["url"]) as conn:  # a superuser dropped the guard
        conn.execute("DROP EVENT TRIGGER idem_guard_drop")
        conn.execute("DROP EVENT TRIGGER idem_guard_routine")  # which refuses any idem_ routine of another role
    with pinned(owned["attacker_url"]) as conn:
        conn.execute("DROP FUNCTION public.idem_cleanup_batch")  # the schema's owner may, now
        conn.execute(
            "CREATE FUNCTION public.idem_cleanup_batch(p_batch_size integer DEFAULT 5000,"
            " p_now timestamptz DEFAULT NULL) RETURNS integer LANGUAGE plpgsql"
            " AS $$ BEGIN PERFORM public.pwn('idem_cleanup_batch'); RETURN 0; END $$"
        )
    done = idem("migrate", "--database-url", url)
    assert done.returncode == 1 and "routine public.idem_cleanup_batch(integer,timestamp with time zone)" in done.stderr
    superuser, log, _ = verdict(owned, [])
    assert not superuser and not log, log
