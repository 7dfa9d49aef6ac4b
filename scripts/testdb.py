"""
Fresh databases for tests, on the server DATABASE_URL points at.

    python scripts/testdb.py fresh NAME [--extensions pgtap]   -> prints NAME's URL
    python scripts/testdb.py empty NAME                                -> prints NAME's URL
    python scripts/testdb.py drop NAME

`fresh` drops NAME if it exists, creates it, migrates it (`idem migrate`, the installed console
script) and creates the extensions asked for; `drop` also removes NAME's pg_cron job (`idem
migrate` schedules one per database). Needs a role with CREATEDB on that server. With IDEM_CITUS
set, DATABASE_URL is the coordinator of scripts/citus.sh's cluster, and each database is made on
every node, with the extension and the workers registered; with IDEM_CITUS_SHARDS set too (make
test-citus sets 8), each of them distributes its tables over that many shards instead of Citus's
32 (citus.shard_count, the database's default).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent


def idem_command() -> str:
    """The `idem` console script of this interpreter's environment (the venv), else on PATH."""
    beside = Path(sys.executable).with_name("idem")
    return str(beside) if beside.exists() else "idem"


def url_for(base_url: str, dbname: str) -> str:
    """The same server, credentials and options as base_url, another database."""
    parts = urlsplit(base_url)
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"testdb: DATABASE_URL must be a postgresql:// URL, got {base_url!r}")
    return urlunsplit(parts._replace(path="/" + quote(dbname)))


def citus(base_url: str, action: str, name: str) -> None:
    """IDEM_CITUS: a database of the local Citus cluster exists on every node (scripts/citus.sh)."""
    port = str(urlsplit(base_url).port or 5432)
    env = {**os.environ, "CITUS_PORT": port}
    subprocess.run(["bash", str(ROOT / "scripts" / "citus.sh"), action, name], check=True, env=env)


def drop(base_url: str, name: str) -> None:
    if os.environ.get("IDEM_CITUS"):
        citus(base_url, "dropdb", name)
        return
    with psycopg.connect(url_for(base_url, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        row = conn.execute("SELECT current_setting('cron.database_name', true)").fetchone()
    if row and row[0]:
        with contextlib.suppress(psycopg.Error), psycopg.connect(url_for(base_url, row[0]), autocommit=True) as conn:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE database = %s", (name,))


def create(base_url: str, name: str, template: str | None = None) -> str:
    drop(base_url, name)
    if os.environ.get("IDEM_CITUS"):
        # No template: Citus's maintenance daemon stays connected to every database with the
        # extension, which CREATE DATABASE ... TEMPLATE refuses. A template here is a migrated store.
        citus(base_url, "createdb", name)
        url = url_for(base_url, name)
        shards = os.environ.get("IDEM_CITUS_SHARDS")
        if shards:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET citus.shard_count = {}").format(
                        sql.Identifier(name), sql.Literal(int(shards))
                    )
                )
        if template:
            migrate(url)
        return url
    with psycopg.connect(url_for(base_url, "postgres"), autocommit=True) as conn:
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt = stmt + sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(stmt)
    return url_for(base_url, name)


def migrate(url: str) -> None:
    subprocess.run([idem_command(), "migrate", "-q", "--database-url", url], check=True)


def fresh(base_url: str, name: str, extensions: list[str]) -> str:
    url = create(base_url, name)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        for ext in extensions:
            conn.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(sql.Identifier(ext)))
    return url


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["fresh", "empty", "drop"])
    parser.add_argument("name")
    parser.add_argument("--extensions", default="")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL")
    if not base:
        parser.error("DATABASE_URL is not set")
    conninfo_to_dict(base)  # fail early on a malformed URL
    if args.action == "drop":
        drop(base, args.name)
    elif args.action == "empty":
        print(create(base, args.name))
    else:
        print(fresh(base, args.name, [e for e in args.extensions.split(",") if e]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
