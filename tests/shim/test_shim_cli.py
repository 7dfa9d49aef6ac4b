"""``flask idempotency cleanup | erase-user | export-user | stats`` against a real database,
run with the app's own role (a member of idem_app only).

Cases: cleanup deletes expired keys only and says how many; erase-user deletes one user's keys
and no one else's; export-user prints them as JSON, or writes them to --out; stats prints the
health aggregates; a database error is a clean CLI error, not a traceback.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from flask import Flask

from idem_shim import Idem
from tests.support.shim import closed_port, post, running_app, scalar, shim_db, with_host_port


@pytest.fixture
def app(fresh_admin_url: str) -> Iterator[Flask]:
    with running_app(shim_db(fresh_admin_url)) as app:
        yield app


@pytest.fixture
def admin_app(fresh_admin_url: str) -> Iterator[Flask]:
    """The CLI's admin verbs (cleanup, stats) need idem_admin (SPEC §3a): the app as the owner."""
    shim_db(fresh_admin_url)
    with running_app(fresh_admin_url) as app:
        yield app


def run(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=["idempotency", *args])
    return result.exit_code, result.output


def test_cleanup_deletes_expired_keys_only(admin_app: Flask, fresh_admin_url: str) -> None:
    app = admin_app
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        for _ in range(3):  # expired a day ago
            conn.execute(
                "SELECT idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'POST /orders',"
                " p_request => '{}', p_ttl => '1 hour', p_now => now() - interval '2 days')",
                (str(uuid.uuid4()),),
            )
    assert post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "live"}).status_code == 201
    code, output = run(app, "cleanup", "--batch-size", "2")
    assert code == 0, output
    assert "deleted 3 expired idempotency keys" in output
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 1


def test_cleanup_takes_a_pace_refuses_a_bad_one_and_runs_unpaced(admin_app: Flask, fresh_admin_url: str) -> None:
    app = admin_app
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        for _ in range(4):
            conn.execute(
                "SELECT idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'POST /orders',"
                " p_request => '{}', p_ttl => '1 hour', p_now => now() - interval '2 days')",
                (str(uuid.uuid4()),),
            )
    code, output = run(app, "cleanup", "--max-rows-per-second", "0")
    assert code != 0
    assert "p_max_rows_per_second must be positive (got 0)" in output, output
    code, output = run(app, "cleanup", "--unpaced", "--max-rows-per-second", "5")
    assert code != 0 and "exclude each other" in output
    code, output = run(app, "cleanup", "--batch-size", "1", "--max-rows-per-second", "20")
    assert code == 0 and "deleted 4 expired idempotency keys" in output, output
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


def test_stats_prints_the_health_aggregates(admin_app: Flask) -> None:
    app = admin_app
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
