"""Fixtures of the shim tests (helpers live in tests/python/support/shim.py; nothing imports this file).

- ``shim_web_url``: a fresh migrated database prepared for the shim tests (business tables), seen
  as the app's login role ``idem_shim_web`` (a member of ``idem_app`` plus its own tables);
- ``make_app(handler=..., **config)``: the test app on that database with the test's own handler
  behind its order routes; ``url=`` and ``business_url=`` point it elsewhere (a stopped proxy, a
  hung server). Every app made is closed after the test.

And after every test, the kill switch read once more (autouse).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from idem_shim.config import middleware_enabled
from tests.python.support import shim


@pytest.fixture(autouse=True)
def kill_switch_read_after_the_test() -> Iterator[None]:
    """The kill switch's last state is the process's (one line per change, not per request): a test
    that turned it on through the environment leaves it on until a request reads it again, and
    the next test in that process would log its change. Read again once the environment is
    restored (autouse: torn down after monkeypatch), so each test starts from the environment's."""
    yield
    middleware_enabled()


@pytest.fixture
def shim_web_url(fresh_admin_url: str) -> str:
    return shim.shim_db(fresh_admin_url)


@pytest.fixture
def make_app(shim_web_url: str) -> Iterator[shim.AppFactory]:
    apps: list[Flask] = []

    def make(
        handler: shim.Handler = shim.places_order,
        *,
        url: str | None = None,
        business_url: str | None = None,
        **config: Any,
    ) -> Flask:
        app = shim.make_app(url or shim_web_url, business_url, handler=handler, **config)
        apps.append(app)
        return app

    yield make
    for app in apps:
        shim.state_of(app).store.close()
