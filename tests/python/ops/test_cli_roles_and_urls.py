"""What the CLI reads and whom it tells: `idem status` and `idem migrate` take the app's own
variable (IDEM_DATABASE_URL) when DATABASE_URL is unset; run as the app's role they say in one
line which role they need (never a bare `permission denied for table _yoyo_migration`);
`idem openapi` loads an app that has no database URL at all (it never connects); a role that may
not create idem's roles is told every missing one at once.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from idem_shim.errors import MigrateError
from idem_shim.schema import apply
from tests.python.ops.test_cli_config_errors import IDEM_MIGRATE, assert_one_line, run
from tests.python.support.roles import login_role

IDEM = IDEM_MIGRATE[0]


@pytest.fixture
def web_url(fresh_admin_url: str) -> Iterator[str]:
    """The app's login role on a migrated database: a member of idem_app only."""
    with login_role(fresh_admin_url, "idem_app") as (name, _conninfo):
        parts = urlsplit(fresh_admin_url)
        yield urlunsplit(parts._replace(netloc=f"{name}@{parts.hostname}:{parts.port}"))


@pytest.mark.parametrize("verb", ["status", "migrate"])
def test_the_apps_role_is_told_the_owner_in_one_line(web_url: str, verb: str) -> None:
    code, lines = run([IDEM, verb], DATABASE_URL=None, IDEM_DATABASE_URL=web_url)
    assert_one_line(code, lines, "may not read public._yoyo_migration", "a member of idem_app", "--database-url")
    assert "permission denied" not in lines[0] and "InsufficientPrivilege" not in lines[0], lines[0]
    assert "run as the store's owner, " in lines[0], lines[0]
    if verb == "migrate":
        assert lines[0].endswith("nothing was changed"), lines[0]


def test_status_reads_idem_database_url(fresh_admin_url: str) -> None:
    code, lines = run([IDEM, "status"], DATABASE_URL=None, IDEM_DATABASE_URL=fresh_admin_url)
    assert code == 0, lines
    assert any(line.startswith("SQL API: database") and "(current)" in line for line in lines), lines


def test_database_url_comes_before_idem_database_url(fresh_admin_url: str, web_url: str) -> None:
    """Both set: DATABASE_URL, the documented default (often the owner's), wins."""
    code, lines = run([IDEM, "status"], DATABASE_URL=fresh_admin_url, IDEM_DATABASE_URL=web_url)
    assert code == 0, lines


def test_openapi_needs_no_database_url(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text(
        textwrap.dedent(
            """\
            from flask import Flask
            from idem_shim import Idem, idempotency_key

            app = Flask(__name__)

            @app.post("/orders")
            @idempotency_key(service=True)
            def place_order():
                return {}, 201

            Idem(app)
            """
        )
    )
    code, lines = run(
        [IDEM, "openapi", "--app", f"{tmp_path / 'shop.py'}:app"], DATABASE_URL=None, IDEM_DATABASE_URL=None
    )
    assert code == 0, lines
    assert "/orders" in json.loads("\n".join(lines))["paths"]


def test_every_missing_role_is_named_at_once(fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A role without CREATEROLE, three of idem's roles missing: one line names the three."""
    missing = ("idem_zz_missing_a", "idem_zz_missing_b", "idem_zz_missing_c")
    monkeypatch.setattr(apply, "ROLES", ("idem_app", *missing))
    with login_role(fresh_admin_url, "idem_app", prefix="noroles") as (_name, url):
        with psycopg.connect(url) as conn, conn.cursor() as cursor:
            cursor.execute("BEGIN")
            with pytest.raises(MigrateError) as refused:
                apply._ensure_roles(cursor, "nothing was changed")
    text = str(refused.value)
    assert text.startswith(f"roles {', '.join(missing)} do not exist and this role may not create them"), text
    assert all(f"CREATE ROLE {name} NOLOGIN;" in text for name in missing), text
    with psycopg.connect(fresh_admin_url) as admin:
        found = admin.execute(
            sql.SQL("SELECT count(*) FROM pg_catalog.pg_roles WHERE rolname = ANY(%s)"), (list(missing),)
        ).fetchone()
    assert found == (0,)
