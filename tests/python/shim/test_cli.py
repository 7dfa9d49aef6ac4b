"""``flask idempotency cleanup | erase-user | export-user | stats`` against a real database.

erase-user and export-user run with the app's own role (a member of idem_app only); the admin
verbs, cleanup and stats, with ``IDEM_ADMIN_DATABASE_URL``'s role (a member of idem_admin only,
contract §3a), which defaults to the app's URL.

Cases: cleanup deletes expired keys only and says how many; erase-user deletes one user's keys
and no one else's; export-user prints them as JSON, or writes them to --out; stats prints the
health aggregates; the app's role is refused the admin verbs in one line naming idem_admin, and
changes nothing; IDEM_ADMIN_DATABASE_URL (config or environment) is the admin verbs' connection,
never erase-user's; a database error is a clean CLI error, not a traceback.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from flask import Flask
from psycopg.conninfo import make_conninfo

from idem_shim import Idem
from idem_shim.cli import idempotency_cli
from tests.python.support.roles import login_role
from tests.python.support.shim import (
    APP_ROLE,
    closed_port,
    dba_url,
    dsr_url,
    post,
    running_app,
    scalar,
    shim_db,
    with_host_port,
)


@pytest.fixture
def app(fresh_admin_url: str) -> Iterator[Flask]:
    """The app on its own role, its admin verbs on a DBA's (IDEM_ADMIN_DATABASE_URL)."""
    with running_app(shim_db(fresh_admin_url), IDEM_ADMIN_DATABASE_URL=dba_url(fresh_admin_url)) as app:
        yield app


@pytest.fixture
def app_role_only(fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    """The app with no IDEM_ADMIN_DATABASE_URL: its admin verbs run as the app's role."""
    monkeypatch.delenv("IDEM_ADMIN_DATABASE_URL", raising=False)
    with running_app(shim_db(fresh_admin_url)) as app:
        yield app


def refusal(verb: str, task: str, role: str = "<role>") -> str:
    """The one line of a refused admin verb. On the app's own URL it names no role to grant:
    idem_admin is a DBA's, never the app's role's. ``stats`` needs only idem_monitor (contract §3a:
    it executes idem_health), the least privilege that runs it."""
    if verb == "stats":
        return (
            f"Error: this role may not {task}: it needs idem_monitor (GRANT idem_monitor TO {role}; "
            "idem_admin holds it too), or set IDEM_ADMIN_DATABASE_URL to a DBA's URL"
        )
    return (
        f"Error: this role may not {task}: it needs idem_admin "
        f"(GRANT idem_admin TO {role}), or set IDEM_ADMIN_DATABASE_URL to a DBA's URL"
    )


def expire_three_keys(fresh_admin_url: str) -> None:
    """Three keys that expired a day ago (a moved clock: only the owner may pass p_now)."""
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        for _ in range(3):
            conn.execute(
                "SELECT idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'POST /orders',"
                " p_request => '{}', p_ttl => '1 hour', p_now => now() - interval '2 days')",
                (str(uuid.uuid4()),),
            )


def run(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(idempotency_cli, args)
    return result.exit_code, result.output


def test_cleanup_deletes_expired_keys_only(app: Flask, fresh_admin_url: str) -> None:
    expire_three_keys(fresh_admin_url)
    assert post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "live"}).status_code == 201
    code, output = run(app, "cleanup", "--batch-size", "2")
    assert code == 0, output
    assert "deleted 3 expired idempotency keys" in output
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 1


def test_cleanup_takes_a_pace_refuses_a_bad_one_and_runs_unpaced(app: Flask, fresh_admin_url: str) -> None:
    expire_three_keys(fresh_admin_url)
    code, output = run(app, "cleanup", "--max-rows-per-second", "0")
    assert code != 0
    assert "p_max_rows_per_second must be positive (got 0)" in output, output
    code, output = run(app, "cleanup", "--unpaced", "--max-rows-per-second", "5")
    assert code != 0 and "exclude each other" in output
    code, output = run(app, "cleanup", "--batch-size", "1", "--max-rows-per-second", "20")
    assert code == 0 and "deleted 3 expired idempotency keys" in output, output
    code, output = run(app, "cleanup", "--unpaced")
    assert code == 0 and "deleted 0 expired idempotency keys" in output, output


def test_erase_and_export_user(app: Flask, fresh_admin_url: str, tmp_path: Path) -> None:
    client = app.test_client()
    for user in (1, 1, 2):
        assert post(client, "/orders", str(uuid.uuid4()), {"item": "x"}, user=user).status_code == 201

    code, output = run(app, "export-user", "1")
    assert code == 0, output
    exported = json.loads(output)
    assert len(exported) == 2 and {row["scope_user_id"] for row in exported} == {1}

    out = tmp_path / "user2.json"
    code, output = run(app, "export-user", "2", "--out", str(out))
    assert code == 0, output
    assert len(json.loads(out.read_text())) == 1

    code, output = run(app, "erase-user", "1")
    assert code == 0, output
    assert "erased 2 idempotency keys of user 1" in output
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys WHERE scope_user_id = 1") == 0
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys WHERE scope_user_id = 2") == 1
    assert json.loads(run(app, "export-user", "1")[1]) == []


def test_stats_prints_the_health_aggregates(app: Flask) -> None:
    client = app.test_client()
    key = str(uuid.uuid4())
    post(client, "/orders", key, {"item": "s"})
    post(client, "/orders", key, {"item": "s"})
    code, output = run(app, "stats")
    assert code == 0, output
    header, *rows = output.splitlines()
    assert header.split()[:4] == ["kind", "scope_endpoint", "state", "total"]
    assert any(row.split()[:5] == ["keys", "POST", "/orders", "completed", "1"] for row in rows), output


def test_database_errors_are_clean_cli_errors() -> None:
    app = Flask("unreachable")
    app.config.update(
        IDEM_DATABASE_URL=with_host_port("postgresql://nobody@localhost/none", "127.0.0.1", closed_port()),
        IDEM_CHECK_SCHEMA=False,
    )
    Idem(app)
    code, output = run(app, "cleanup")
    assert code == 1
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert output.startswith("Error: cannot connect to the idempotency store at 127.0.0.1:"), output
    assert "Connection refused" in output


def test_the_app_role_is_refused_the_admin_verbs_in_one_line(app_role_only: Flask, fresh_admin_url: str) -> None:
    """Without IDEM_ADMIN_DATABASE_URL the admin verbs run as the app's role, a member of idem_app
    only: each is refused (42501) in one line that names idem_admin, exits 1, and changes nothing."""
    expire_three_keys(fresh_admin_url)
    post(app_role_only.test_client(), "/orders", str(uuid.uuid4()), {"item": "live"})
    for verb, task, args in (
        ("cleanup", "run the cleanup", ()),
        ("stats", "read the store's health", ()),
    ):
        code, output = run(app_role_only, verb, *args)
        assert code == 1, output
        assert output.strip() == refusal(verb, task), output
        assert "Traceback" not in output and "InsufficientPrivilege" not in output
    # the data-subject verbs too: the request path may not read or free another user's keys
    for verb, task in (("erase-user", "erase a user's keys"), ("export-user", "export a user's keys")):
        code, output = run(app_role_only, verb, "1")
        assert code == 1, output
        assert output.strip() == (
            f"Error: this role may not {task}: it needs idem_dsr (GRANT idem_dsr TO <role>), "
            "or set IDEM_DSR_DATABASE_URL to the GDPR job's URL"
        ), output
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 4  # nothing deleted


def test_the_admin_url_comes_from_the_environment(fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """IDEM_ADMIN_DATABASE_URL from the environment (not in the app's config) is the admin verbs'
    connection: the DBA's role runs cleanup and stats, which the app's role may not."""
    monkeypatch.setenv("IDEM_ADMIN_DATABASE_URL", dba_url(fresh_admin_url))
    with running_app(shim_db(fresh_admin_url)) as app:
        expire_three_keys(fresh_admin_url)
        code, output = run(app, "cleanup")
        assert code == 0 and "deleted 3 expired idempotency keys" in output, output
        assert post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "live"}).status_code == 201
        code, output = run(app, "stats")
        assert code == 0 and output.startswith("kind"), output


def test_the_admin_url_serves_the_admin_verbs_only(fresh_admin_url: str) -> None:
    """An IDEM_ADMIN_DATABASE_URL where nothing listens: the admin verbs fail on it (and say which
    setting to check), while erase-user and export-user run on IDEM_DSR_DATABASE_URL (a GDPR
    job's role, a member of idem_dsr only)."""
    port = closed_port()
    dead = with_host_port(dba_url(fresh_admin_url), "127.0.0.1", port)
    web = shim_db(fresh_admin_url)
    with running_app(web, IDEM_ADMIN_DATABASE_URL=dead, IDEM_DSR_DATABASE_URL=dsr_url(fresh_admin_url)) as app:
        assert post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "x"}).status_code == 201
        for verb in ("cleanup", "stats"):
            code, output = run(app, verb)
            assert code == 1 and len(output.strip().splitlines()) == 1, output
            assert output.startswith(f"Error: cannot connect to the idempotency store at 127.0.0.1:{port}/"), output
            assert "IDEM_ADMIN_DATABASE_URL" in output
        code, output = run(app, "export-user", "1")
        assert code == 0 and len(json.loads(output)) == 1, output
        code, output = run(app, "erase-user", "1")
        assert code == 0 and "erased 1 idempotency keys of user 1" in output, output
    # and a dead IDEM_DSR_DATABASE_URL names itself first
    with running_app(web, IDEM_DSR_DATABASE_URL=dead) as app:
        code, output = run(app, "export-user", "1")
        assert code == 1 and "(check IDEM_DSR_DATABASE_URL / IDEM_ADMIN_DATABASE_URL" in output, output


def test_an_admin_url_without_the_grant_is_named_in_the_refusal(fresh_admin_url: str) -> None:
    """IDEM_ADMIN_DATABASE_URL set to a role that is not (yet) in idem_admin, here the app's own
    login role through a URL of its own: the line names that role in the GRANT it needs."""
    web = shim_db(fresh_admin_url)
    admin = make_conninfo(fresh_admin_url, user=APP_ROLE, application_name="idem_admin_verbs")  # not web's URL
    assert admin != web
    with running_app(web, IDEM_ADMIN_DATABASE_URL=admin) as app:
        code, output = run(app, "cleanup")
    assert code == 1, output
    assert output.strip() == refusal("cleanup", "run the cleanup", APP_ROLE), output


def test_stats_runs_as_a_member_of_idem_monitor_only(fresh_admin_url: str) -> None:
    """Contract §3a: idem_monitor executes idem_health, which is all `stats` reads: an exporter's role
    (or the app's, joined to idem_monitor for the store gauges) runs it without idem_admin."""
    with login_role(fresh_admin_url, "idem_monitor", prefix="mon") as (_name, url):
        with running_app(shim_db(fresh_admin_url), IDEM_ADMIN_DATABASE_URL=url) as app:
            assert post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "m"}).status_code == 201
            code, output = run(app, "stats")
            assert code == 0 and output.startswith("kind"), output
            code, output = run(app, "cleanup")  # the monitor's role is no DBA
            assert code == 1 and "it needs idem_admin" in output, output
