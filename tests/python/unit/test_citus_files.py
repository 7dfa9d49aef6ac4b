"""sql/citus/ stays in step with sql/functions/: each file there replaces a hook of the same file
name, a small internal routine that the single-node body calls where the distributed form differs
(the routing, or one step), so every routine of the API has one body, its guards written once."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CITUS = ROOT / "sql" / "citus"
FUNCTIONS = ROOT / "sql" / "functions"
PRIVILEGES = FUNCTIONS / "990_privileges.sql"

CREATED = re.compile(r"CREATE OR REPLACE FUNCTION (public\.\w+)\(")

#: Routines that exist on a distributed store only, each with the reason in its file's header:
#: idem_complete_in_scope is idem_complete delegated to the claim's worker (a SECURITY DEFINER
#: call after the app's own writes would otherwise reach their placements as another role);
#: idem_coordinator_key_id is idem_new_key_id's guard against a worker (a SQL-standard body cannot raise).
CITUS_ONLY = {"002_idem_coordinator_key_id.sql", "021_idem_complete_in_scope.sql"}


def _code(text: str) -> str:
    """The SQL without its `--` comments."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def _signature(text: str) -> str:
    """From CREATE OR REPLACE to the body (arguments, result, language, volatility, security),
    white space folded: what a caller and the lint see of a routine."""
    code = _code(text)
    start = code.index("CREATE OR REPLACE")
    end = min(i for i in (code.find(marker, start) for marker in ("\nAS $$", "\nRETURN ", "\nBEGIN ATOMIC")) if i > 0)
    return " ".join(code[start:end].split())


def _replacements() -> list[Path]:
    return [p for p in sorted(CITUS.glob("*.sql")) if p.name != "000_distribute.sql" and p.name not in CITUS_ONLY]


def _granted() -> set[str]:
    """The routines 990_privileges.sql grants to some role: the API."""
    code = _code(PRIVILEGES.read_text(encoding="utf-8"))
    grants = re.findall(r"GRANT EXECUTE ON (?:FUNCTION|PROCEDURE)\s+(.*?)\s+TO\s", code, re.S)
    return {name.strip() for grant in grants for name in grant.split(",")}


def test_every_citus_routine_replaces_one_of_the_same_file_name_and_signature() -> None:
    assert _replacements(), "no sql/citus/ file found: the scan is broken"
    for path in _replacements():
        original = FUNCTIONS / path.name
        assert original.exists(), f"sql/citus/{path.name} replaces no sql/functions/{path.name}"
        text, original_text = path.read_text(encoding="utf-8"), original.read_text(encoding="utf-8")
        name = CREATED.search(text)
        assert name is not None
        assert f"CREATE OR REPLACE FUNCTION {name.group(1)}(" in original_text
        assert _signature(text) == _signature(original_text), (
            f"sql/citus/{path.name} and sql/functions/{path.name} declare {name.group(1)} differently: "
            "change both (the arguments, result, language, volatility and security)"
        )


def test_sql_citus_replaces_hooks_only_never_a_routine_of_the_api() -> None:
    """A routine some role executes keeps one body (its guards, messages and SQLSTATEs are the
    contract): where its distributed form differs, it calls a hook, and sql/citus/ replaces that."""
    granted = _granted()
    assert "public.idem_claim" in granted and "public.idem_cleanup_batch" in granted, "the grant scan is broken"
    for path in _replacements():
        name = CREATED.search(path.read_text(encoding="utf-8"))
        assert name is not None
        assert name.group(1) not in granted, (
            f"sql/citus/{path.name} replaces {name.group(1)}, which a role executes: move the step that differs "
            "into a hook its body calls, and replace the hook"
        )


def test_a_hook_says_where_its_distributed_form_is() -> None:
    for path in _replacements():
        header = (FUNCTIONS / path.name).read_text(encoding="utf-8").split("CREATE OR REPLACE", 1)[0]
        assert "sql/citus/" in header, f"sql/functions/{path.name}: say in its header that sql/citus/ replaces it"


def test_a_hook_is_called_by_the_single_node_body() -> None:
    bodies = {p.name: p.read_text(encoding="utf-8") for p in FUNCTIONS.glob("*.sql")}
    for path in _replacements():
        name = CREATED.search(path.read_text(encoding="utf-8"))
        assert name is not None
        callers = [f for f, text in bodies.items() if f != path.name and f"{name.group(1)}(" in _code(text)]
        assert callers, f"{name.group(1)} (sql/citus/{path.name}) is called by no routine of sql/functions/"


def test_a_citus_only_routine_has_no_single_node_namesake() -> None:
    for name in CITUS_ONLY:
        assert (CITUS / name).exists(), f"sql/citus/{name} is listed but missing"
        routine = CREATED.search((CITUS / name).read_text(encoding="utf-8"))
        assert routine is not None
        for original in FUNCTIONS.glob("*.sql"):
            assert f"FUNCTION {routine.group(1)}(" not in original.read_text(encoding="utf-8"), original.name
