"""The schema of a database as text (pg_dump --schema-only, noise removed), to compare two, and
the way back to an empty database (every rollback)."""

from __future__ import annotations

import re
import shutil
import subprocess

PG_DUMP = next((p for p in ("/usr/lib/postgresql/15/bin/pg_dump", shutil.which("pg_dump")) if p), "pg_dump")


def schema(url: str) -> str:
    dump = subprocess.run(
        [PG_DUMP, "--schema-only", "--no-owner", "-d", url], check=True, capture_output=True, text=True
    ).stdout
    lines = [
        ln
        for ln in dump.splitlines()
        if ln.strip()
        and not ln.startswith("--")
        and not ln.startswith("SET ")
        and not ln.startswith("SELECT pg_catalog.set_config")
        and not ln.startswith("\\restrict")
        and not ln.startswith("\\unrestrict")
    ]
    return re.sub(r"\n{2,}", "\n", "\n".join(lines))


def rollback_all(url: str) -> None:
    """Every migration's rollback, newest first: the database back to zero (a test's down step;
    the shipped CLI has no such verb)."""
    from idem_shim import schema as tool

    with tool.connect(url) as conn:
        conn.execute(tool.YOYO_LOCK_DDL)
    backend = tool.backend(url)
    try:
        with backend.lock():
            backend.rollback_migrations(backend.to_rollback(tool.read_migrations()))
    finally:
        backend.connection.close()
