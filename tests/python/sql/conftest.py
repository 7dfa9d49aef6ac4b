"""Fixtures of the SQL tests (helpers live in tests/python/support/; nothing imports this file).

- ``owned``: a new database owned by a plain login role, the attacker, not migrated yet
  (tests/python/support/owned.py), for test_sec_owned_database.py and test_sec_migrate_wait.py;
- ``migrated``: the same, migrated by the superuser, its owner a member of idem_app;
- ``empty_db``, ``other_empty_db``: a new database with nothing migrated (tests/python/support/databases.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.python.support.databases import empty_database
from tests.python.support.owned import migrated_by_the_dba, owned_database


@pytest.fixture
def owned(admin_url: str) -> Iterator[dict[str, str]]:
    with owned_database(admin_url) as database:
        yield database


@pytest.fixture
def migrated(owned: dict[str, str]) -> dict[str, str]:
    return migrated_by_the_dba(owned)


@pytest.fixture
def empty_db(admin_url: str) -> Iterator[str]:
    with empty_database(admin_url) as url:
        yield url


@pytest.fixture
def other_empty_db(admin_url: str) -> Iterator[str]:
    with empty_database(admin_url) as url:
        yield url
