"""Where the SQL is: the migrations and function files (the wheel carries them as
``idem_shim/sql/``; a checkout or an editable install reads the repository's ``sql/``), the
schema tool's own SQL beside this module (``schema/sql/*.sql``, package data), and the version."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from ..errors import MigrateError

#: idem's DDL guard (event triggers only a superuser makes): `idem migrate` and the script commit it
#: in a transaction of its own before anything else (schema/sql/guard_wait.sql says why).
GUARD_FILE = "985_idem_ddl_guard.sql"


def package_version() -> str:
    try:
        return metadata.version("idem-shim")
    except metadata.PackageNotFoundError:  # a bare checkout on PYTHONPATH
        return "0+checkout"


@dataclass(frozen=True, slots=True)
class SqlFiles:
    migrations: Path
    functions: Path

    def function_files(self) -> list[Path]:
        return sorted(self.functions.glob("*.sql"))

    def guard_file(self) -> Path:
        return self.functions / GUARD_FILE

    def citus_files(self) -> list[Path]:
        """The distributed form (sql/citus/), applied after the functions where citus exists."""
        return sorted((self.functions.parent / "citus").glob("*.sql"))


def sql_files() -> SqlFiles:
    """The package's SQL: inside the installed package first, else the repository's ``sql/``."""
    candidates: list[Path] = []
    packaged = resources.files("idem_shim") / "sql"
    if isinstance(packaged, Path):
        candidates.append(packaged)
    candidates.append(Path(__file__).resolve().parents[3] / "sql")  # checkout / editable install
    for base in candidates:
        migrations, functions = base / "migrations", base / "functions"
        if any(migrations.glob("0*.*")) and any(functions.glob("*.sql")):
            return SqlFiles(migrations, functions)
    raise MigrateError(
        "idem_shim carries no SQL (sql/migrations and sql/functions are missing from "
        f"{candidates[0]}): this installation of idem-shim is broken; reinstall it"
    )


def tool_sql(name: str) -> str:
    """One of the schema tool's own SQL files (``schema/sql/<name>``), as text."""
    return (resources.files(__package__) / "sql" / name).read_text(encoding="utf-8")


def read_migrations(files: SqlFiles | None = None) -> Any:
    """The migrations, in dependency order (yoyo's own reader)."""
    from yoyo import read_migrations as yoyo_read
    from yoyo.migrations import topological_sort

    files = files or sql_files()
    migrations = yoyo_read(str(files.migrations))
    return migrations.__class__(topological_sort(migrations), migrations.post_apply)
