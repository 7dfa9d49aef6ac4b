"""The install, written once: the ordered transactions and steps of ``idem migrate``, which
apply.py runs (the migrations through yoyo) and script.py prints as the ``idem sql`` script.

Five transactions, in this order, each opening with idem's migration lock (schema/sql/migrate_lock.sql):

1. **guard**: the preflight (schema/sql/owners.sql, preflight.sql) and idem's DDL guard
   (sql/functions/985, made only where a superuser runs it), committed on its own so that every
   DDL after it is judged;
2. **workers**: the same guard on every Citus worker (a superuser on Citus only);
3. **wait**: the wait for every transaction begun before the guard (schema/sql/guard_wait.sql);
4. **yoyo**: yoyo-migrations' tables, checked (owners.sql) before anything writes or reads them,
   and committed before yoyo's own lock (``idem migrate`` takes it between 4 and 5);
5. **install**: the preflight again, the roles, the pending migrations (applied once and recorded
   in yoyo's tables), the users table's check, every function file, on Citus the distributed
   form, owners.sql once more, the SQL API version, then the cleanup's schedule.

A step is SQL both outputs carry as it is, ``idem.*`` settings (the arguments the SQL reads),
the migrations, or the schedule: the only steps whose two forms differ, because psql cannot run
yoyo and ``idem migrate`` schedules in pg_cron's database itself (schema/cron.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from . import citus
from .files import GUARD_FILE, SqlFiles, tool_sql
from .preflight import GUARD_ONLY, ROLES, UNCHANGED, preflight_settings

#: pg_advisory_xact_lock key shared by `idem migrate` and `idem sql` ("idem" in ASCII).
LOCK_KEY = 0x6964656D
#: How long the install waits, once the DDL guard is committed, for the transactions of the
#: database begun before it, and for any lock (seconds; ``--wait-timeout``).
GUARD_WAIT_TIMEOUT_S = 60.0

#: When a step runs: always, only on a database with the citus extension, and there only where
#: a superuser runs the install (the workers' guard).
ALWAYS: Final = ""
CITUS: Final = "citus"
CITUS_SUPERUSER: Final = "citus_superuser"

SQL: Final = "sql"
SETTINGS: Final = "settings"
MIGRATIONS: Final = "migrations"
SCHEDULE: Final = "schedule"


@dataclass(frozen=True, slots=True)
class Step:
    #: What ``idem migrate`` names in a failure ("sql/functions/985_…"); empty: the error says where.
    label: str
    kind: str = SQL
    sql: str = ""
    #: For SETTINGS: each ``set_config(name, value, true)``, for the transaction.
    settings: Mapping[str, str] = field(default_factory=dict)
    when: str = ALWAYS
    #: Its refusals (RAISE) are whole lines, ending with what was changed: said as they are.
    whole: bool = False


@dataclass(frozen=True, slots=True)
class Transaction:
    name: str
    note: str
    steps: tuple[Step, ...]


def literal(value: str) -> str:
    """A value as a SQL literal, for the script (whose transactions set standard_conforming_strings on)."""
    return "'" + value.replace("'", "''") + "'"


def lock(wait_timeout: float) -> tuple[Step, ...]:
    """idem's migration lock, first in every transaction of the install (migrate_lock.sql)."""
    return (
        Step("", SETTINGS, settings={"idem.lock_key": str(LOCK_KEY), "idem.guard_wait_timeout": str(wait_timeout)}),
        Step("", sql=tool_sql("migrate_lock.sql")),
    )


def arguments(refusing: str, after_guard: bool, users_table: str | None) -> tuple[Step, ...]:
    """The settings owners.sql, preflight.sql, the migrations and host_users.sql read: always
    ``idem.users_table``, '' when none is named, so a default the database's owner gave it (ALTER
    DATABASE ... SET idem.users_table) never picks the table the user scope references."""
    values = {
        **preflight_settings(refusing, GUARD_ONLY if after_guard else UNCHANGED),
        "idem.users_table": users_table or "",
    }
    steps = [Step("", SETTINGS, settings=values)]
    if after_guard:
        steps.append(Step("", sql=tool_sql("guard_made.sql")))
    return tuple(steps)


def probe_timeout(when: str) -> Step:
    """A worker that does not answer holds the install 5 s, not Citus's default 30 s: set with
    set_config, a SETTINGS step, never a SET statement in a step's SQL. Once migrate_lock.sql has
    set citus.propagate_set_commands to 'local', Citus sends each later SET LOCAL to the
    transaction's worker sessions as the text of the query that held it: ``idem migrate`` sends a
    step's SQL as one query, so a SET LOCAL beside a DO block made each worker run that DO block
    too (the readiness check's read of public.users, a distributed query there: "cannot execute a
    distributed query from a query on a shard"). The timeout is the coordinator's own: it is the
    one that connects."""
    return Step("", SETTINGS, settings={"citus.node_connection_timeout": "5000"}, when=when)


def owners() -> tuple[Step, ...]:
    """What the store's owner runs, reads or writes is trusted (schema/sql/owners.sql), and that
    owner is the role installing or a superuser (schema/sql/store_owner.sql)."""
    return (Step("", sql=tool_sql("owners.sql"), whole=True), Step("", sql=tool_sql("store_owner.sql"), whole=True))


def _worker_guard(files: SqlFiles) -> str:
    """The guard on every Citus worker once it is committed here; a worker that refuses it
    refuses the install (its reply's control characters as '?': a worker's message may hold names
    their makers picked)."""
    return "\n".join(
        [
            "CREATE TEMPORARY TABLE idem_worker_guard ON COMMIT DROP AS",
            citus.worker_guard_statement(files.guard_file().read_text(encoding="utf-8")) + ";",
            "DO $idem_worker_guard_check$",
            "BEGIN",
            "    IF EXISTS (SELECT 1 FROM pg_temp.idem_worker_guard) THEN",
            f"        RAISE EXCEPTION 'sql/functions/% on the Citus workers: %; %', {literal(GUARD_FILE)},",
            "            (SELECT pg_catalog.regexp_replace(pg_catalog.string_agg(g.node || ': ' || g.result, '; '),",
            "                                              '[[:cntrl:]]', '?', 'g')",
            "               FROM pg_temp.idem_worker_guard g),",
            f"            {literal(GUARD_ONLY)};",
            "    END IF;",
            "END",
            "$idem_worker_guard_check$;",
        ]
    )


#: What the host must fix before the store distributes, asked again inside the install (the
#: preflight asked before the guard): refused naming the statements to run.
_CITUS_READY: Final = "\n".join(
    [
        "DO $idem_citus_guard$",
        "DECLARE",
        "    v_todo text;",
        "    v_line text;",
        "    v_host_users boolean;",
        "BEGIN",
        "    SELECT too_old.line INTO v_todo FROM (",
        citus.TOO_OLD,
        "    ) AS too_old;",
        "    IF v_todo IS NULL THEN",
        "    SELECT pg_catalog.string_agg(line, '; ') INTO v_todo FROM (",
        citus.PROBLEMS,
        "    ) AS problems;",
        "    EXECUTE 'SELECT (' || $q$" + citus.HOST_USERS + "$q$ || ')' INTO v_host_users;",
        "    END IF;",
        "    IF v_host_users THEN",
        "        EXECUTE $q$" + citus.RESERVED_USER + "$q$ INTO v_line;",
        "        v_todo := concat_ws('; ', v_todo, v_line);",
        "    END IF;",
        "    IF v_todo IS NOT NULL AND v_todo <> '' THEN",
        "        RAISE EXCEPTION 'database % has the citus extension, and the store cannot be distributed "
        "yet: %; % (see docs/scaling.md)', pg_catalog.current_database(), v_todo, "
        "pg_catalog.current_setting('idem.unchanged');",
        "    END IF;",
        "END",
        "$idem_citus_guard$;",
    ]
)


def install_plan(
    files: SqlFiles,
    *,
    refusing: str,
    wait_timeout: float = GUARD_WAIT_TIMEOUT_S,
    users_table: str | None = None,
) -> tuple[Transaction, ...]:
    """The whole install or upgrade; ``refusing``: who says no in a refusal ('this package',
    'this script')."""
    guard = files.guard_file().read_text(encoding="utf-8")
    return (
        Transaction(
            "guard",
            "1. idem's DDL guard, committed on its own (made only where a superuser runs this), so that "
            "every DDL after it is judged; the preflight first (schema/sql/preflight.sql).",
            (
                *lock(wait_timeout),
                *arguments(refusing, False, users_table),
                *owners(),
                Step("", sql=tool_sql("preflight.sql"), whole=True),
                Step(f"sql/functions/{GUARD_FILE}", sql=guard),
            ),
        ),
        Transaction(
            "workers",
            "2. The same guard on every Citus worker, once committed here (made only where a superuser "
            "runs this on Citus).",
            (
                probe_timeout(CITUS_SUPERUSER),
                Step(
                    f"sql/functions/{GUARD_FILE} on the Citus workers",
                    sql=_worker_guard(files),
                    when=CITUS_SUPERUSER,
                    whole=True,
                ),
            ),
        ),
        Transaction(
            "wait",
            "3. The wait for every transaction begun before the guard (schema/sql/guard_wait.sql), bounded "
            "by its own timeout, not by the database's statement_timeout.",
            (
                Step("", SETTINGS, settings={"idem.guard_wait_timeout": str(wait_timeout), "statement_timeout": "0"}),
                Step("", sql=tool_sql("guard_wait.sql"), whole=True),
            ),
        ),
        Transaction(
            "yoyo",
            "4. yoyo-migrations' tables, as yoyo makes them, committed before yoyo's own lock.",
            (
                *lock(wait_timeout),
                *arguments(refusing, True, users_table),
                Step("", sql=tool_sql("yoyo_tables.sql")),
                *owners(),
                Step("", sql=tool_sql("yoyo_version.sql")),
            ),
        ),
        Transaction(
            "install",
            "5. The install or upgrade, in one transaction: the preflight again (it now sees what a "
            "transaction older than the guard made), then the rest.",
            (
                *lock(wait_timeout),
                *arguments(refusing, True, users_table),
                *owners(),
                Step("(preflight)", sql=tool_sql("preflight.sql"), whole=True),
                # on Citus, what the host must fix first: before anything is written as the owner
                probe_timeout(CITUS),
                Step("", sql=_CITUS_READY, when=CITUS, whole=True),
                Step(f"roles {', '.join(ROLES)}", sql=tool_sql("roles.sql"), whole=True),
                Step("", MIGRATIONS),
                Step("the users table (schema/sql/host_users.sql)", sql=tool_sql("host_users.sql")),
                *(
                    Step(f"sql/functions/{path.name}", sql=path.read_text(encoding="utf-8"))
                    for path in files.function_files()
                ),
                *(
                    Step(f"sql/citus/{path.name}", sql=path.read_text(encoding="utf-8"), when=CITUS)
                    for path in files.citus_files()
                ),
                *owners(),
                Step("the SQL API version check", sql=tool_sql("version_check.sql"), whole=True),
                Step("", SCHEDULE),
            ),
        ),
    )
