"""sql/README.md's file rules, read from the files (no database).

functions/: `NNN_<routine>.sql`, one number each, one routine (or the view `<name>_view`) per
file, named as the file says, with its `COMMENT ON`, never a `DROP`, and a pgTAP mirror of the
same name in tests/pgtap/ (000, the version, is asserted by 000_schema.sql). migrations/:
`NNNN.<name>.sql` or `.py`, numbered from 0001 without a gap, each naming the one before it in
`-- depends:` (`__depends__` in a `.py` step), each with a `.rollback.sql` twin (a `rollback`
in a `.py` step), and no dollar quote in a `.sql` file (yoyo's statement splitter mangles them).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FUNCTIONS = ROOT / "sql" / "functions"
MIGRATIONS = ROOT / "sql" / "migrations"
PGTAP = ROOT / "tests" / "pgtap"

FUNCTION_FILE = re.compile(r"(\d{3})_([a-z0-9_]+)\.sql")
MIGRATION_FILE = re.compile(r"(\d{4})\.([a-z0-9-]+)(\.rollback)?\.(sql|py)")
NOT_A_ROUTINE = {"privileges"}  # 990: the grants, once every routine exists


def _code(sql: str) -> str:
    """The SQL without its `--` comments (a comment may say DROP or $$; a statement may not)."""
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def function_files() -> list[Path]:
    files = sorted(FUNCTIONS.glob("*.sql"))
    assert files, "no function file found: the scan is broken"
    return files


def migrations() -> list[Path]:
    """The forward migrations, in number order."""
    files = sorted(p for p in MIGRATIONS.iterdir() if p.suffix in {".sql", ".py"} and ".rollback." not in p.name)
    assert files, "no migration found: the scan is broken"
    return files


@pytest.mark.parametrize("path", function_files(), ids=lambda p: p.name)
def test_a_function_file_holds_the_routine_it_is_named_for(path: Path) -> None:
    match = FUNCTION_FILE.fullmatch(path.name)
    assert match, f"{path.name}: name it NNN_<routine>.sql"
    name = match.group(2)
    code = _code(path.read_text())
    assert not re.search(r"\bDROP\s+[A-Z]", code), f"{path.name}: no DROP in functions/ (a migration drops)"
    if name in NOT_A_ROUTINE:
        return
    # public, or the DDL guard's own schema (a superuser's, where no other role may create)
    created = re.findall(r"CREATE OR REPLACE (FUNCTION|PROCEDURE|VIEW) (public|idem_guard)\.(\w+)", code)
    view = name.removesuffix("_view")
    expected = ("VIEW", view) if name.endswith("_view") else None
    assert len(created) == 1, f"{path.name}: one routine per file, found {created}"
    kind, schema, routine = created[0]
    assert (kind, routine) == expected or (kind != "VIEW" and routine == name), (
        f"{path.name} creates {kind.lower()} {routine}: the file is named for what it holds"
    )
    comment = f"COMMENT ON {kind} {schema}.{routine} IS"
    assert comment in code, f"{path.name}: {comment} …"


def _number(path: Path) -> str:
    match = FUNCTION_FILE.fullmatch(path.name)
    return match.group(1) if match else path.name


def test_function_numbers_are_unique() -> None:
    numbers = [_number(p) for p in function_files()]
    assert len(numbers) == len(set(numbers)), f"two function files share a number: {sorted(numbers)}"


def test_every_function_file_has_its_pgtap_mirror() -> None:
    """tests/pgtap/NNN_<routine>.sql, or for 000 (the version) the schema file 000_schema.sql."""
    mirrored = {_number(p) for p in PGTAP.glob("*.sql")}
    missing = [p.name for p in function_files() if _number(p) not in mirrored]
    assert missing == [], f"tests/pgtap/ lacks a mirror (same number) of {missing}"
    for path in function_files():
        if _number(path) != "000":
            assert (PGTAP / path.name).exists(), f"name {path.name}'s pgTAP mirror tests/pgtap/{path.name}"


def test_migrations_are_numbered_from_one_without_a_gap() -> None:
    names = [p.name for p in MIGRATIONS.iterdir() if not p.name.startswith("__")]
    bad = [n for n in names if not MIGRATION_FILE.fullmatch(n) or (".rollback." in n and not n.endswith(".sql"))]
    assert bad == [], f"migrations/: name them NNNN.<name>.sql|.py (+ .rollback.sql): {bad}"
    numbers = [int(MIGRATION_FILE.fullmatch(p.name).group(1)) for p in migrations()]  # type: ignore[union-attr]
    assert numbers == list(range(1, len(numbers) + 1)), f"migration numbers must run 1, 2, 3, … once each: {numbers}"


def _depends(path: Path) -> set[str]:
    text = path.read_text()
    if path.suffix == ".py":
        found = re.search(r"^__depends__\s*=\s*\{([^}]*)\}", text, re.M)
        return set(re.findall(r"[\"']([^\"']+)[\"']", found.group(1))) if found else set()
    return {d.strip() for line in re.findall(r"^-- depends:(.*)$", text, re.M) for d in line.split() if d.strip()}


def test_each_migration_depends_on_the_one_before() -> None:
    ordered = migrations()
    assert _depends(ordered[0]) == set(), f"{ordered[0].name} is the first: it depends on nothing"
    for before, path in itertools.pairwise(ordered):
        stem = before.name.rsplit(".", 1)[0]
        assert _depends(path) == {stem}, f"{path.name} must name the migration before it: -- depends: {stem}"


def test_each_migration_has_its_rollback() -> None:
    for path in migrations():
        if path.suffix == ".py":
            assert re.search(r"^steps\s*=\s*\[step\(\w+,\s*\w+\)\]", path.read_text(), re.M), (
                f"{path.name}: steps = [step(apply, rollback)]"
            )
        else:
            twin = path.with_name(path.name.removesuffix(".sql") + ".rollback.sql")
            assert twin.exists(), f"{path.name} has no rollback twin {twin.name}"


def test_no_dollar_quote_in_a_sql_migration() -> None:
    for path in sorted(MIGRATIONS.glob("*.sql")):
        assert "$$" not in _code(path.read_text()) and not re.search(r"\$\w*\$", _code(path.read_text())), (
            f"{path.name}: a dollar-quoted body in a migration (yoyo splits it): make it a .py step or a function"
        )


def test_the_tools_wait_blocks_show_their_name_in_pg_stat_activity() -> None:
    """pg_stat_activity shows the first 1 kB of a query (track_activity_query_size): a DBA who looks
    at a waiting install, and the tests that wait for one, see the DO block's name there."""
    tool_sql = ROOT / "python" / "idem_shim" / "schema" / "sql"
    for name, tag in (("migrate_lock.sql", "$idem_migrate_lock$"), ("guard_wait.sql", "$idem_guard_wait$")):
        text = (tool_sql / name).read_text(encoding="utf-8").encode()
        assert tag.encode() in text[:1024], f"{name}: {tag} is {text.index(tag.encode())} bytes in"
