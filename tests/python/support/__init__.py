"""Helpers the Python tests share. Nothing here is collected by pytest and nothing imports conftest.

- ``tests.python.support.roles``: which role a URL connects as (``as_app_role``);
- ``tests.python.support.sqlapi``: one call of one SQL function, as a DBA would type it;
- ``tests.python.support.waiting``: ``wait_until(predicate, timeout=..., what=...)``, the one way a
  test waits: for a condition, never for a time;
- ``tests.python.support.races``: waiting until a backend is blocked on a lock or a key's claim is
  in flight, and which gunicorn worker is serving a test-delayed order (pg_stat_activity);
- ``tests.python.support.databases``: an empty database, pg_cron's database (or a skip), and a
  database made afresh on an e2e harness's own cluster;
- ``tests.python.support.earlier``: a database at an earlier SQL API (from git history or its
  generated fixture);
- ``tests.python.support.shim``: the shim tests' app factory, their database and a TCP proxy;
- ``tests.python.support.docrunner``: runs the fenced blocks of docs/;
- ``tests.python.support.groups``: the server lock that keeps apart the tests of one ``xdist_group``
  (conftest's hooks take and release it);
- ``tests.python.support.owned``: a database the app's login role owns, not migrated yet (the
  attacker's set-up of the ``test_sec_*`` tests of an owned database), and the DBA's tools on it.
- ``tests.python.support.planted``: the look-alike objects an attacker plants for the owner's
  sessions, derived from what idem's SQL names, and which of them ran;
- ``tests.python.support.schema``: a database's schema as text (to compare two), and every
  rollback back to an empty database;
- ``tests.python.support.prop``: the hypothesis profiles of the property-based suites;
- ``tests.python.support.in_transaction``: the ``claim="in_transaction"`` tests' polling wait, views
  that name a lease accessor, and a POST to a worker process;
- ``tests.python.support.exported_metrics``: the metric names the shim exports, and those a PromQL
  expression names (what the alert rules and the dashboard may refer to).

Importing this package puts scripts/ on ``sys.path`` so ``import testdb`` (scripts/testdb.py, also
a command of the Makefile) works in every test; ``idem_shim`` itself is installed in the venv.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
