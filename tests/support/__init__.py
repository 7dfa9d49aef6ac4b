"""Helpers the Python tests share. Nothing here is collected by pytest and nothing imports conftest.

- ``tests.support.roles``: which role a URL connects as (``as_app_role``);
- ``tests.support.sqlapi``: one call of one SQL function, as a DBA would type it;
- ``tests.support.races``: waiting until a backend is blocked on a lock (no sleeps);
- ``tests.support.shim``: the shim tests' app factory, their database and a TCP proxy;
- ``tests.support.docrunner``: runs the fenced blocks of docs/.

Importing this package puts scripts/ on ``sys.path`` so ``import testdb`` (scripts/testdb.py, also
a command of the Makefile) works in every test; ``idem_shim`` itself is installed in the venv.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
