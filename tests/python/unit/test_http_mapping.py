"""The shim's error answers as data, without a database: every error has its own stable problem
type, and an unknown IDEM_ERROR_FORMAT stops the app at start-up (the answers themselves, against
a database, are in tests/python/shim/test_problem.py)."""

from __future__ import annotations

import pytest

from idem_shim.config import ConfigVars, Settings
from idem_shim.http import PROBLEMS


def test_every_error_has_its_own_stable_type() -> None:
    slugs = [problem.slug for problem in PROBLEMS.values()]
    assert len(set(slugs)) == len(slugs) == 11


def test_an_unknown_format_stops_the_app() -> None:
    with pytest.raises(ValueError, match="IDEM_ERROR_FORMAT"):
        Settings.from_mapping({ConfigVars.DATABASE_URL: "postgresql://a@b/c", ConfigVars.ERROR_FORMAT: "xml"})
