"""scripts/lint_qualified.py: what a person, a scheduler or a tool types names idem's objects as
``public.*`` (contract §3a), in the docs, the SQL's messages, the shim's strings and the dashboard.
The tree passes, and each kind of unqualified reference in each kind of file is a finding."""

from __future__ import annotations

import lint_qualified  # scripts/, on sys.path through tests.python.support (tests/python/conftest.py)
import pytest


def test_the_tree_names_idems_objects_qualified() -> None:
    findings = lint_qualified.lint_tree()
    assert not findings, "\n".join(map(str, findings))


def test_the_names_come_from_the_sql() -> None:
    routines, relations = lint_qualified.idem_names()
    assert {"idem_claim", "idem_health", "idem_cleanup", "idem_erase_user", "idem_complete_in_scope"} <= routines
    assert {"idempotency_keys", "idempotency_events", "audit_log", "users", "idem_health"} <= relations


@pytest.mark.parametrize(
    ("kind", "text", "found"),
    [
        ("markdown", "Run `SELECT * FROM idem_health()` once a minute.\n", ["idem_health"]),
        ("markdown", "In psql:\n\n```psql\nidem=# CALL idem_cleanup();\n```\n", ["CALL idem_cleanup"]),
        ("markdown", "```sql\nSELECT count(*)\n  FROM idempotency_keys;\n```\n", ["FROM idempotency_keys"]),
        ("markdown", "`CALL idem_cleanup` outside a transaction block\n", ["CALL idem_cleanup"]),
        ("markdown", "```console\n$ psql -c 'INSERT INTO audit_log VALUES (1)'\n```\n", ["INTO audit_log"]),
        ("sql", "RAISE NOTICE USING MESSAGE = 'x', HINT = 'run CALL idem_cleanup()';", ["CALL idem_cleanup"]),
        ("sql", "RAISE WARNING 'see SELECT * FROM idem_health(); %', v;", ["idem_health"]),
        ("python", 'HINT = "check with SELECT idem_erase_user(p_user_id => 7)"\n', ["idem_erase_user"]),
        ("python", 'Q = f"SELECT * FROM idempotency_keys WHERE id = {n}"\n', ["FROM idempotency_keys"]),
        ("json", '{"panels": [{"rawSql": "SELECT * FROM idem_health"}]}', ["FROM idem_health"]),
        (
            "text",
            'psql "$URL" -c "SELECT idem_complete(c.key_id, 201) FROM idem_claim(k) c"\n',
            ["idem_complete", "idem_claim"],
        ),
    ],
)
def test_an_unqualified_reference_is_a_finding(kind: str, text: str, found: list[str]) -> None:
    findings = lint_qualified.lint_text(text, kind)
    assert sorted(f.name for f in findings) == sorted(n.split()[-1] for n in found), findings


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        # qualified, by public or by another schema
        ("markdown", "`SELECT * FROM public.idem_health()` and `CALL public.idem_cleanup()`\n"),
        ("markdown", "```sql\nSELECT idem_guard.idem_ddl_guard();\nSELECT * FROM public.idempotency_keys;\n```\n"),
        # prose naming a routine or a role, not calling it, and text outside code
        ("markdown", "idem_claim returns a row; `idem_claim` heals; `idem_admin (GRANT ...)`\n"),
        ("python", 'X = "the headers stored by idem_complete (NULL before)"\n'),
        ("markdown", "Call idem_health() from prose: not a command block, not a span.\n"),
        ("markdown", "`idem_health` is a view; `SELECT FROM x` reads `users` and `audit_log`\n"),
        # in SQL, only what RAISE prints is read (bodies pin their path), not comments
        ("sql", "-- RAISE NOTICE 'CALL idem_cleanup()';\nSELECT idem_cleanup_batch(1);\n"),
        ("sql", "RAISE NOTICE 'idem_cleanup: % rows', v_rows;"),
        ("python", "# SELECT idem_health()\nX = 'idem_health could not be read'\n"),
    ],
)
def test_no_finding(kind: str, text: str) -> None:
    assert lint_qualified.lint_text(text, kind) == []


def test_a_finding_names_its_line() -> None:
    text = "# Title\n\nsome prose\n\n```psql\nidem=# SELECT 1;\nidem=# SELECT idem_erase_user(p_user_id => 7);\n```\n"
    (finding,) = lint_qualified.lint_text(text, "markdown", "doc.md")
    assert (finding.path, finding.line) == ("doc.md", 7)
    assert "public.idem_erase_user" in str(finding)
