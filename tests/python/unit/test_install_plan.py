"""The install plan (python/idem_shim/schema/plan.py), read as data: every transaction opens with
idem's migration lock; nothing is written before the DDL guard's transaction; yoyo's tables are
checked (owners.sql) before their first write; the install's preflight comes before the roles and
the migrations, and owners.sql once more after the last function file; every SQL step that runs
off Citus is a file that tests/python/support/planted.py derives its look-alikes from and
scripts/lint_sql.py runs; and ``idem sql`` prints every step of the plan, in its order."""

from __future__ import annotations

import re

import pytest

from idem_shim.schema import install_plan, render_sql, sql_files, tool_sql
from idem_shim.schema.files import GUARD_FILE
from idem_shim.schema.plan import ALWAYS, MIGRATIONS, SCHEDULE, SETTINGS, SQL, Step, Transaction
from idem_shim.schema.preflight import UNCHANGED
from tests.python.support import planted

PLAN = install_plan(sql_files(), refusing="this package")
LOCK, OWNERS, PREFLIGHT = tool_sql("migrate_lock.sql"), tool_sql("owners.sql"), tool_sql("preflight.sql")
STORE_OWNER = tool_sql("store_owner.sql")


def named(txn: str) -> Transaction:
    return next(t for t in PLAN if t.name == txn)


def index(steps: tuple[Step, ...], text: str, start: int = 0) -> int:
    return next(i for i, s in enumerate(steps) if i >= start and s.kind == SQL and s.sql == text)


def test_the_transactions_come_in_their_order() -> None:
    assert [t.name for t in PLAN] == ["guard", "workers", "wait", "yoyo", "install"]


@pytest.mark.parametrize("txn", [t.name for t in PLAN if t.name not in ("workers", "wait")])
def test_every_transaction_that_writes_opens_with_idems_migration_lock(txn: str) -> None:
    first, second = named(txn).steps[:2]
    assert first.kind == SETTINGS and set(first.settings) == {"idem.lock_key", "idem.guard_wait_timeout"}
    assert second.kind == SQL and second.sql == LOCK


def test_the_guard_is_the_first_transactions_last_step_after_its_preflight() -> None:
    steps = named("guard").steps
    assert steps[-1].sql == (sql_files().functions / GUARD_FILE).read_text(encoding="utf-8")
    assert index(steps, OWNERS) < index(steps, PREFLIGHT) < len(steps) - 1
    # before it, nothing but the lock, the settings and the three checks
    assert all(s.kind == SETTINGS or s.sql in (LOCK, OWNERS, STORE_OWNER, PREFLIGHT) for s in steps[:-1])


@pytest.mark.parametrize("txn", [t.name for t in PLAN if t.name not in ("workers", "wait")])
def test_every_owners_check_is_followed_by_the_store_owners(txn: str) -> None:
    """store_owner.sql: the store's owner is the installing role or a superuser, where owners.sql
    trusts what it made (tests/python/sql/test_sec_owner_installed_store.py)."""
    sqls = [s.sql for s in named(txn).steps]
    at = [i for i, text in enumerate(sqls) if text == OWNERS]
    assert at and all(sqls[i + 1] == STORE_OWNER for i in at), txn


def test_the_wait_and_the_workers_guard_write_nothing_of_idems_before_the_guard() -> None:
    assert [s.kind for s in named("wait").steps] == [SETTINGS, SQL]
    assert named("wait").steps[1].sql == tool_sql("guard_wait.sql")
    assert all(s.when != ALWAYS for s in named("workers").steps)


def test_yoyos_tables_are_checked_before_their_first_write() -> None:
    steps = named("yoyo").steps
    made = index(steps, tool_sql("yoyo_tables.sql"))
    assert made < index(steps, OWNERS, made) < index(steps, tool_sql("yoyo_version.sql"))


def test_the_install_checks_before_it_writes_and_once_more_after_the_last_file() -> None:
    steps = named("install").steps
    kinds = [s.kind for s in steps]
    first_write = min(kinds.index(MIGRATIONS), next(i for i, s in enumerate(steps) if s.label.startswith("roles ")))
    assert index(steps, OWNERS) < index(steps, PREFLIGHT) < first_write
    last_file = max(i for i, s in enumerate(steps) if s.label.startswith(("sql/functions/", "sql/citus/")))
    assert last_file < index(steps, OWNERS, last_file + 1) < len(steps) - 1
    assert kinds[-1] == SCHEDULE


def test_every_sql_step_off_citus_is_a_file_the_plants_and_the_lint_read() -> None:
    """What the owner's look-alikes are derived from (planted.SQL_TEXT) and what lint_sql.py
    plpgsql_checks is files: SQL written inside plan.py would be planted against by no test."""
    texts = {path.read_text(encoding="utf-8") for path in planted.SQL_TEXT if path.suffix == ".sql"}
    loose = [
        s.label or s.sql[:60]
        for t in PLAN
        for s in t.steps
        if s.kind == SQL and s.when == ALWAYS and s.sql not in texts
    ]
    assert not loose, f"SQL of the plan in no file of sql/ or schema/sql/: {loose}"


def test_idem_sql_prints_every_step_of_the_plan_in_its_order() -> None:
    script = render_sql()
    at = 0
    for txn in install_plan(sql_files(), refusing="this script"):
        for step in txn.steps:
            if step.kind == SQL:
                found = script.find(step.sql.rstrip(), at)
                assert found >= 0, f"{txn.name}: {step.label or step.sql[:60]} missing or out of order"
                at = found
            elif step.kind == SETTINGS:
                name = next(iter(step.settings))
                found = script.find(f"PERFORM pg_catalog.set_config('{name}'", at)
                assert found >= 0, f"{txn.name}: the settings {sorted(step.settings)} missing or out of order"
                at = found
    assert script.rstrip().endswith("COMMIT;")


def test_before_the_guard_a_refusal_says_nothing_was_changed_as_the_package_says_it() -> None:
    assert f"'{UNCHANGED}'" in tool_sql("guard_made.sql")


def test_a_users_table_named_with_the_settings_dollar_quote_never_ends_it() -> None:
    """--users-table is the DBA's text: the script's DO block of settings is quoted with a tag it
    does not hold, so the name stays one literal, never SQL of its own."""
    name = 'app."x$idem_arguments$; DROP TABLE app.users; --"'
    script = render_sql(users_table=name)
    for block in re.findall(r"^DO (\$idem_arguments\d*\$)\n(.*?)^\1;", script, re.M | re.S):
        assert block[0] not in block[1]
    assert "PERFORM pg_catalog.set_config('idem.users_table', " + "'" + name.replace("'", "''") + "'" in script


def _top_level_statements(sql: str) -> list[str]:
    """A step's SQL split into its statements, dollar-quoted bodies and line comments taken out."""
    bare = re.sub(r"--[^\n]*", "", re.sub(r"\$(\w*)\$.*?\$\1\$", "$$", sql, flags=re.S))
    return [s.strip() for s in bare.split(";") if s.strip()]


def test_no_sql_step_sends_a_set_beside_other_statements() -> None:
    """``idem migrate`` sends a step's SQL as one query; once migrate_lock.sql has set
    citus.propagate_set_commands to 'local', Citus sends a SET LOCAL on to the workers as the whole
    text of that query, so the statements beside it ran on every worker as well (the readiness
    check's DO block there: "cannot execute a distributed query from a query on a shard"). A
    setting is a SETTINGS step (set_config), or a SET inside a DO block, never a statement of
    its own in a step's SQL."""
    mixed = [
        f"{t.name}: {s.label or s.sql[:60]}"
        for t in PLAN
        for s in t.steps
        if s.kind == SQL
        and len(statements := _top_level_statements(s.sql)) > 1
        and any(re.match(r"SET\b", statement, re.I) for statement in statements)
    ]
    assert not mixed, f"a SET sent with other statements in one query: {mixed}"
