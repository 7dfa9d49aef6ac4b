"""
Databases for the Python tests, on the server DATABASE_URL points at (make sets it).

- `admin_url`: the superuser URL of that server, as given.
- `template_db`: one database per test session, migrated once, used as a template.
- `fresh_db`: a new database cloned from the template for one test, dropped after it;
  tests that commit (all the concurrency ones) get a clean store this way, in ~100 ms.
- `app_url(url)`: the same database seen as the least-privileged `idem_app` role.
"""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "scripts")]  # idem_shim itself is installed in the venv

import testdb  # noqa: E402  (scripts/testdb.py)


@pytest.fixture(scope="session")
def admin_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.exit("DATABASE_URL is not set: run the tests with `make test-py`", returncode=2)
    return url


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    name = f"idem_tpl_{os.getpid()}"
    testdb.fresh(admin_url, name, [])
    yield name
    testdb.drop(admin_url, name)


@pytest.fixture
def fresh_db(admin_url: str, template_db: str) -> Iterator[str]:
    name = f"idem_t_{uuid.uuid4().hex[:10]}"
    url = testdb.create(admin_url, name, template=template_db)
    yield url
    testdb.drop(admin_url, name)


def app_url(url: str) -> str:
    """Connect as the app role: SET ROLE at start-up, so no password is needed."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote('-c role=idem_app')}"


@pytest.fixture
def fresh_app_url(fresh_db: str) -> str:
    return app_url(fresh_db)
