"""A database at an earlier SQL API, the one way the tests build one.

An older idem is its ``sql/`` at the last commit of that API version (``API_COMMITS``). With
the git history (a clone), the tree comes from that commit; without it (an exported tarball),
from ``tests/python/fixtures/sql-api-N.tar.gz``, which is that same ``git archive``, generated
by ``python -m tests.python.support.earlier --write-fixtures`` and checked against the history by
tests/python/sql/test_earlier_api.py. Either way the database is built the same: that version's
migrations under yoyo, the app role, then every function file of that version in order — what
``idem migrate`` of that time did, minus the cron job. On a database with the citus extension the
version's ``sql/citus/`` files follow, where it has them (SQL API 4, from the Citus branch, was
the first that distributed the store).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import tarfile
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

#: SQL API version -> the last commit at it (the older idem a database was migrated by).
API_COMMITS = {
    1: "a8791e70dbfb48210e70b73c86e1a06d2ff13067",  # migrations 0001-0003
    2: "27d60a218ba4b89cd964fe3e74cb82542ee9c3b0",  # 0001-0005: response encryption, cleanup pause
    # 0001-0007 and sql/citus/ (the Citus branch before it took SQL API 5): no claim tokens yet
    4: "34b59e2add2a4e50039abd199a1196b7bef1343f",
    8: "6f94ecf6a031753084031bd75372c8c2067a29ff",  # 0001-0011: claim tokens of the key_id alone
}
APP_ROLE = "idem_app"  # the role every version's 990_privileges.sql grants to


def fixture(api: int) -> Path:
    return FIXTURES / f"sql-api-{api}.tar.gz"


def has_history(commit: str) -> bool:
    if not (ROOT / ".git").exists():
        return False
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return found.returncode == 0


def archive_from_history(api: int) -> bytes:
    """``git archive`` of that version's sql/, as a gzipped tar."""
    return subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar.gz", API_COMMITS[api], "sql"],
        check=True,
        capture_output=True,
    ).stdout


def files_of(archive: bytes) -> dict[str, bytes]:
    """path -> contents of every file in a gzipped tar."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {
            m.name: extracted.read()
            for m in tar.getmembers()
            if m.isfile() and (extracted := tar.extractfile(m)) is not None
        }


def sql_tree(api: int, dest: Path) -> Path:
    """That version's ``sql/`` extracted under ``dest``; returns the ``sql`` directory."""
    if api not in API_COMMITS:
        raise ValueError(f"no earlier SQL API {api}: known are {sorted(API_COMMITS)}")
    archive = archive_from_history(api) if has_history(API_COMMITS[api]) else fixture(api).read_bytes()
    for name, data in files_of(archive).items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return dest / "sql"


def build(url: str, api: int, workdir: Path) -> None:
    """Migrate the empty database at ``url`` as idem of SQL API ``api`` did."""
    from yoyo import read_migrations

    from idem_shim import schema

    tree = sql_tree(api, workdir)
    backend = schema.backend(url)
    try:
        with backend.lock():
            backend.apply_migrations(backend.to_apply(read_migrations(str(tree / "migrations"))))
    finally:
        backend.connection.close()
    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone():
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(APP_ROLE)))
        distributed = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is not None
        with conn.transaction():
            for path in sorted((tree / "functions").glob("*.sql")):
                conn.execute(path.read_text())
            for path in sorted((tree / "citus").glob("*.sql")) if distributed else ():
                conn.execute(path.read_text())


def write_fixtures() -> None:
    for api in API_COMMITS:
        fixture(api).write_bytes(archive_from_history(api))
        print(f"wrote {fixture(api).relative_to(ROOT)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-fixtures", action="store_true", help="regenerate the fixtures from the git history")
    if parser.parse_args().write_fixtures:
        write_fixtures()
    else:
        parser.print_help()
