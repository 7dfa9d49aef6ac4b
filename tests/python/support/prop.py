"""Hypothesis settings of the property-based suites (test_prop_*.py), in one place.

Profiles (IDEM_HYPOTHESIS_PROFILE, default "ci"):
  ci   derandomized (the same examples on every run, so `make test` is reproducible), sized so
       the three suites together take a couple of minutes on two cores;
  deep random and ten times larger: for a search on purpose (failures print a reproduce blob).
No example database: a failure found once becomes a named @example or a plain test instead.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

_COMMON: dict[str, Any] = {
    "deadline": None,  # a real database on a loaded machine: time is not the property
    "database": None,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
}
settings.register_profile("ci", derandomize=True, max_examples=150, stateful_step_count=40, **_COMMON)
settings.register_profile("deep", max_examples=1500, stateful_step_count=80, **_COMMON)
settings.load_profile(os.environ.get("IDEM_HYPOTHESIS_PROFILE", "ci"))


def scaled(n: int) -> int:
    """An example count for one test, relative to the profile's (ci: n, deep: 10 n)."""
    if os.environ.get("IDEM_CITUS"):  # make test-citus: every statement is a round trip to a worker
        return max(10, n // 10)
    return n * 10 if os.environ.get("IDEM_HYPOTHESIS_PROFILE") == "deep" else n
