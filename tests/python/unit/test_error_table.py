"""sql/README.md's error table is the one list of SQLSTATEs, and it matches the functions.

Read from the files, no database: every ``ERRCODE`` raised in ``sql/functions/*.sql`` (and in
``sql/citus/*.sql``, the distributed store's routines) has a row
naming its routine; every row is raised by some function, or is one of the few codes PostgreSQL
itself raises at the API's boundary (marked "PostgreSQL"); each code has one row, and no other
document carries a copy of the table. Also the rules the shim relies on: ``22023`` is raised for
nothing but the contract's malformed key, and every other message starts with its routine's name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FUNCTIONS = ROOT / "sql" / "functions"
#: Every file that defines a routine: the functions, and their distributed forms on Citus.
ROUTINE_FILES = [*sorted(FUNCTIONS.glob("*.sql")), *sorted((ROOT / "sql" / "citus").glob("*.sql"))]

#: Codes PostgreSQL raises itself when the API is called wrongly; the table may list only these.
POSTGRES_RAISED = {
    "23503",  # idem_claim: p_user_id names no users row (the foreign key)
    "42501",  # a role calls a routine it was not granted
    "42883",  # no routine matches the call (a misspelt argument name, a wrong type)
    "22P05",  # jsonb input refuses \u0000, before any function runs
    "57014",  # statement_timeout (IDEM_STATEMENT_TIMEOUT_MS) cancels a call
}
MALFORMED_KEY_MESSAGE = "Idempotency-Key must be a UUID string"  # contract §3, code 22023
#: Internal fences that raise in the name of the routine that called them (p_routine).
SPEAKS_FOR_ITS_CALLER = {
    "idem_check_token",
    "idem_raise_claim_lost",
    "idem_coordinator_key_id",
    "idem_refuse_collation",
    "idem_refuse_endpoint",
}
#: Hooks whose distributed form (sql/citus/) raises in the name of the one API routine whose step
#: it is: its row and its messages are that routine's.
STEP_OF = {"idem_delete_expired": "idem_cleanup_batch"}

ROUTINE = re.compile(r"CREATE OR REPLACE (?:FUNCTION|PROCEDURE) (?:public|idem_guard)\.(idem_\w+)")
#: A doubled quote too: the pg_cron job's command (090) is a literal that holds a DO block.
ERRCODE = re.compile(r"ERRCODE\s*=\s*''?([0-9A-Z]{5})''?")
RAISE = re.compile(r"RAISE\s+(?:EXCEPTION|WARNING|NOTICE)\s+USING\s+(.*?);", re.S)
MESSAGE = re.compile(r"MESSAGE\s*=\s*(?:pg_catalog\.format\(\s*)?''?([^']*)")


def raised_codes() -> dict[str, set[str]]:
    """SQLSTATE -> the routines whose files raise it."""
    codes: dict[str, set[str]] = {}
    for path in ROUTINE_FILES:
        text = path.read_text()
        for code in ERRCODE.findall(text):
            match = ROUTINE.search(text)
            assert match, f"{path.name} raises {code} but defines no idem_* routine"
            codes.setdefault(code, set()).add(STEP_OF.get(match.group(1), match.group(1)))
    return codes


def table_rows() -> dict[str, list[str]]:
    """SQLSTATE -> the cells of its row in sql/README.md's "## Errors" table."""
    readme = (ROOT / "sql" / "README.md").read_text()
    section = readme.split("\n## Errors\n", 1)[1].split("\n#", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        code = re.fullmatch(r"\**`([0-9A-Z]{5})`\**", cells[0]) if line.startswith("|") else None
        if code:
            assert code.group(1) not in rows, f"{code.group(1)} has two rows in sql/README.md's error table"
            rows[code.group(1)] = cells
    return rows


def test_every_raised_code_has_a_row_naming_its_routines() -> None:
    rows = table_rows()
    for code, routines in raised_codes().items():
        assert code in rows, f"{code} (raised by {sorted(routines)}) is missing from sql/README.md's error table"
        raised_by = rows[code][1]
        assert "PostgreSQL" not in raised_by, f"{code} is raised by idem's own functions, not PostgreSQL"
        missing = [r for r in sorted(routines) if f"`{r}`" not in raised_by]
        assert not missing, f"sql/README.md's row for {code} does not name {missing}"


def test_the_table_lists_no_code_that_nothing_raises() -> None:
    raised = raised_codes()
    for code, cells in table_rows().items():
        if "PostgreSQL" in cells[1]:
            assert code in POSTGRES_RAISED, f"{code} is not a code PostgreSQL raises at the API's boundary"
            assert code not in raised, f"{code} is raised by idem's functions: name them, not PostgreSQL"
        else:
            assert code in raised, f"sql/README.md lists {code}, which no function in sql/ raises"


def test_no_other_document_repeats_the_table() -> None:
    copies = [
        str(path.relative_to(ROOT))
        for path in ROOT.glob("**/*.md")
        if path != ROOT / "sql" / "README.md"
        and not {".venv", ".pg", "node_modules"} & set(path.parts)
        and re.search(r"^\|\s*SQLSTATE\s*\|", path.read_text(), re.M)
    ]
    assert copies == [], "link to sql/README.md's error table instead of copying it"


def test_22023_means_a_malformed_key_and_nothing_else() -> None:
    """The shim answers 400 on 22023 without reading the message, so nothing else may raise it."""
    for path in ROUTINE_FILES:
        for clause in RAISE.findall(path.read_text()):
            if "'22023'" in clause:
                assert MESSAGE.findall(clause) == [MALFORMED_KEY_MESSAGE], f"{path.name}: 22023 for another case"


def test_every_message_starts_with_its_routines_name() -> None:
    for path in ROUTINE_FILES:
        text = path.read_text()
        match = ROUTINE.search(text)
        if match is None:
            continue
        for clause in RAISE.findall(text):
            for message in MESSAGE.findall(clause):
                if message == MALFORMED_KEY_MESSAGE:
                    continue
                if match.group(1) in SPEAKS_FOR_ITS_CALLER:
                    # the routine's first argument is its caller's name: "idem_complete: ..."
                    assert message.startswith("%s: ") and "p_routine" in text, f"{path.name}: {message!r}"
                else:
                    routine = STEP_OF.get(match.group(1), match.group(1))
                    assert message.startswith(f"{routine}: "), f"{path.name}: {message!r}"
