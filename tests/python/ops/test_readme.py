"""The README's first screen works pasted: its "Wiring a Flask route" block, written to
`shop.py` byte for byte and served by `flask --app shop run` as the text says (a migrated
database, an `orders` table, `IDEM_DATABASE_URL` for the app's role), deduplicates its first
request: 201, then the same request replayed, one row. The example it replaced answered 500
`idempotency_user_scope_unset` to every request (it leaned on an unseen `@require_session`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import requests

from tests.python.support import docrunner
from tests.python.support.roles import login_role
from tests.python.support.shim import closed_port
from tests.python.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]


def readme_example() -> str:
    """The one python block of the README's "Wiring a Flask route", as printed."""
    section = docrunner.section((ROOT / "README.md").read_text(), "Wiring a Flask route")
    blocks = [b for b in docrunner.parse(section) if b.kind == "python"]
    assert len(blocks) == 1, f"expected one python block in the README's wiring section, found {len(blocks)}"
    return "\n".join(blocks[0].lines) + "\n"


@pytest.fixture
def shop_url(fresh_admin_url: str) -> Iterator[str]:
    """What the README's sentence after the block asks for: a migrated database with an
    `orders (id serial PRIMARY KEY, qty integer)` table, and the app's login role on it."""
    with login_role(fresh_admin_url, "idem_app", prefix="shop") as (name, _conninfo):
        with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
            admin.execute("CREATE TABLE orders (id serial PRIMARY KEY, qty integer)")
            admin.execute(f'GRANT SELECT, INSERT ON orders TO "{name}"')
            admin.execute(f'GRANT USAGE ON SEQUENCE orders_id_seq TO "{name}"')
        parts = urlsplit(fresh_admin_url)
        yield urlunsplit(parts._replace(netloc=f"{name}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def served(shop_url: str, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "shop.py").write_text(readme_example())
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDEM_", "FLASK_")) and k != "DATABASE_URL"}
    env.update(IDEM_DATABASE_URL=shop_url, PYTHONPATH=str(ROOT / "python"))
    server = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "shop", "run", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def serving() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"flask run exited serving the README's example:\n{server.communicate()[0]}")
            try:
                requests.get(base + "/", timeout=1)
            except requests.ConnectionError:
                return False
            return True

        wait_until(serving, timeout=30, what="flask run to serve the README's example")
        yield base
    finally:
        server.terminate()
        output = server.communicate(timeout=10)[0]
        assert "Traceback" not in output, output


def test_the_readme_example_pasted_deduplicates_its_first_request(served: str, fresh_admin_url: str) -> None:
    key = str(uuid.uuid4())
    first = requests.post(served + "/orders", json={"qty": 1}, headers={"Idempotency-Key": key}, timeout=10)
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    again = requests.post(served + "/orders", json={"qty": 1}, headers={"Idempotency-Key": key}, timeout=10)
    assert again.status_code == 201, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == {**first.json(), "idempotency_replayed": True}
    with psycopg.connect(fresh_admin_url) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
