"""The schema tool: bring a database to this package's SQL API (``idem migrate``), print the same
as one psql script (``idem sql``), report on it (``idem status``). Only the CLI imports it, and
only when one of those verbs runs: the request path never loads it (nor yoyo).

- ``files``: where the SQL is (the checkout's or the wheel's ``sql/``, this package's ``sql/``);
- ``connection``: URLs and connections, refused or failed in one line;
- ``shape``: the store's columns, UNIQUE key and CHECKs as the migrations declare them;
- ``preflight``: what the database holds, and ``sql/preflight.sql``, the one preflight;
- ``plan``: the install, written once: its ordered transactions and steps (the DDL guard committed
  first, the wait for older transactions, yoyo's tables, then roles, migrations and functions in
  one transaction), which ``apply`` runs and ``script`` prints;
- ``apply``: ``idem migrate``: the plan run, its migrations applied and recorded by yoyo;
- ``script``: ``idem sql``: the plan printed as one psql script;
- ``cron``: the cleanup's pg_cron job, named by ``public.idem_cleanup_job()`` in SQL;
- ``status``: ``idem status``.
"""

from .apply import YOYO_LOCK_DDL, MigrateResult, backend, migrate
from .connection import connect, redact, url_for
from .files import SqlFiles, package_version, read_migrations, sql_files, tool_sql
from .plan import GUARD_WAIT_TIMEOUT_S, LOCK_KEY, Step, Transaction, install_plan
from .preflight import ADMIN_ROLE, APP_ROLE, ROLES, STORE_MIGRATION, DatabaseState, preflight, read_state
from .script import render_sql
from .shape import store_shape
from .status import status

__all__ = [
    "ADMIN_ROLE",
    "APP_ROLE",
    "GUARD_WAIT_TIMEOUT_S",
    "LOCK_KEY",
    "ROLES",
    "STORE_MIGRATION",
    "YOYO_LOCK_DDL",
    "DatabaseState",
    "MigrateResult",
    "SqlFiles",
    "Step",
    "Transaction",
    "backend",
    "connect",
    "install_plan",
    "migrate",
    "package_version",
    "preflight",
    "read_migrations",
    "read_state",
    "redact",
    "render_sql",
    "sql_files",
    "status",
    "store_shape",
    "tool_sql",
    "url_for",
]
