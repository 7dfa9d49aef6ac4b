"""Fixtures of the operations tests (helpers live in tests/python/support/; nothing imports this file).

- ``cron_url``: DATABASE_URL, provided it is pg_cron's database with the extension created (else
  the test is skipped: tests/python/support/databases.py), for the tests of the cleanup's job.
"""

from __future__ import annotations

import pytest

from tests.python.support.databases import cron_database


@pytest.fixture(scope="module")
def cron_url(admin_url: str) -> str:
    return cron_database(admin_url)
