"""The store's shape as the migrations declare it, read from their files: the columns of
``public.idempotency_keys`` (name, type, NOT NULL) after every migration's CREATE TABLE, ADD
COLUMN, DROP COLUMN and (in a Python migration) ALTER COLUMN ... TYPE, its UNIQUE NULLS NOT
DISTINCT key and its named CHECKs. The preflight compares a table idem did not create against
it, so a migration that adds a column needs no second edit here; tests/python/sql/test_schema_shape.py
holds it to a freshly migrated database.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..errors import MigrateError
from .files import SqlFiles, sql_files

TABLE = "public.idempotency_keys"
_NAME = re.escape(TABLE)
_CREATE = re.compile(rf"CREATE TABLE {_NAME}\s*\((.*?)\n\);", re.S | re.I)
_ALTER = re.compile(rf"ALTER TABLE {_NAME}\s+(ADD|DROP) COLUMN\s+(?:IF (?:NOT )?EXISTS\s+)?(\w+)([^;]*);", re.I)
#: a column's new type (migration 0017's, in its Python module's SQL: the user scope's domain)
_RETYPE = re.compile(rf"ALTER TABLE {_NAME}\s+ALTER COLUMN\s+(\w+)\s+TYPE\s+([\w.]+)", re.I)
_CHECK = re.compile(r"CONSTRAINT\s+(\w+)\s+CHECK\b", re.I)
_UNIQUE = re.compile(r"UNIQUE NULLS NOT DISTINCT\s*\(([^)]*)\)", re.I)
#: serial types are not types: what the column really is
_SERIALS = {"smallserial": "smallint", "serial": "integer", "bigserial": "bigint"}


@dataclass(slots=True)
class StoreShape:
    columns: dict[str, tuple[str, bool]] = field(default_factory=dict)  # name -> (type as written, NOT NULL)
    unique: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    def as_json(self) -> str:
        """What the preflight reads (``idem.store_shape``): types are resolved there (::regtype)."""
        return json.dumps(
            {
                "columns": [[name, kind, not_null] for name, (kind, not_null) in self.columns.items()],
                "unique": self.unique,
                "checks": self.checks,
            }
        )


def _without_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def _items(body: str) -> list[str]:
    """A CREATE TABLE body split at its top-level commas."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    return [item.strip() for item in [*items, body[start:]] if item.strip()]


def _column(definition: str) -> tuple[str, tuple[str, bool]]:
    name, kind, *_rest = definition.split()
    upper = definition.upper()
    return name.lower(), (_SERIALS.get(kind.lower(), kind.lower()), "NOT NULL" in upper or "PRIMARY KEY" in upper)


def store_shape(files: SqlFiles | None = None) -> StoreShape:
    shape = StoreShape()
    for path in sorted((files or sql_files()).migrations.glob("*.[sp][qy]*")):
        if ".rollback." in path.name or path.suffix not in (".sql", ".py"):
            continue
        sql = _without_comments(path.read_text(encoding="utf-8"))
        if path.suffix == ".py":  # only a column's new type, from its SQL before its ROLLBACK_SQL
            for name, kind in _RETYPE.findall(sql.split("ROLLBACK_SQL", 1)[0]):
                shape.columns[name.lower()] = (kind.lower(), shape.columns[name.lower()][1])
            continue
        if created := _CREATE.search(sql):
            for item in _items(created.group(1)):
                shape.checks += _CHECK.findall(item)
                if unique := _UNIQUE.search(item):
                    shape.unique = [c.strip().lower() for c in unique.group(1).split(",")]
                if not item.upper().startswith(("CONSTRAINT", "UNIQUE", "CHECK", "PRIMARY KEY", "FOREIGN KEY")):
                    name, column = _column(item)
                    shape.columns[name] = column
        for action, name, rest in _ALTER.findall(sql):
            if action.upper() == "ADD":
                shape.columns[name.lower()] = _column(f"{name} {rest}")[1]
            else:
                shape.columns.pop(name.lower(), None)
    if not shape.columns:
        raise MigrateError(f"no migration creates {TABLE}: this installation of idem-shim is broken; reinstall it")
    return shape
