"""
The host's users table (issue 40 item 4, contract §4d), at the SQL level and through `idem migrate`:

- an app whose users are ``app.customers(id uuid)`` installs with ``--users-table app.customers``
  (or IDEM_USERS_TABLE): no public.users is made, the user scope is uuid, a claim deduplicates,
  completes, replays (its audit row holds the uuid), a downstream key and the DSR functions take
  the uuid, and deleting the customer cascades to its keys;
- a user missing there is 23503 whose DETAIL names the user and the table, never a claim;
- `idem migrate` prints each host table it made, one line each, and nothing the second time;
- a store an earlier idem built on ``public.users(id bigint)`` keeps working across the upgrade
  (its foreign key, its integer scope, its downstream keys unchanged), and naming another users
  table on it is refused plainly (not supported yet), as is a name that now means another table;
- a bad name, a missing table, an id of another type are refused with nothing changed;
- a default the database's owner set for idem.users_table never picks the table.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import testdb
from tests.python.support import earlier
from tests.python.support.roles import as_app_role, as_role_option
from tests.python.support.sqlapi import claim, complete, connect, new_key, one

CUSTOMER = uuid.UUID("6f1e7a64-4e8c-4d1a-9b7e-0c3f5d2a1b00")
STRANGER = uuid.UUID("6f1e7a64-4e8c-4d1a-9b7e-0c3f5d2a1bff")
UUID_APP_DDL = """
CREATE SCHEMA app;
CREATE TABLE app.customers (id uuid PRIMARY KEY, name text);
"""


def idem(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [testdb.idem_command(), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture
def blank_url(admin_url: str) -> Iterator[str]:
    name = f"idem_hu_{uuid.uuid4().hex[:10]}"
    url = testdb.create(admin_url, name)
    yield url
    testdb.drop(admin_url, name)


def _uuid_app(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(UUID_APP_DDL)
        conn.execute("INSERT INTO app.customers (id, name) VALUES (%s, 'Ada')", (CUSTOMER,))


def test_a_uuid_customers_app_migrates_and_deduplicates(blank_url: str) -> None:
    _uuid_app(blank_url)
    done = idem("migrate", "--database-url", blank_url, "--users-table", "app.customers")
    assert done.returncode == 0, done.stderr
    assert "made host table public.audit_log" in done.stdout
    assert "public.users" not in done.stdout, "no users table is made where the host names its own"
    with connect(blank_url) as conn:
        assert one(conn, "SELECT to_regclass('public.users') IS NULL AS none")["none"]
        assert one(conn, "SELECT public.idem_user_id_type()::text AS t")["t"] == "uuid"
        fk = one(
            conn,
            "SELECT confrelid::regclass::text AS target, confdeltype FROM pg_constraint "
            "WHERE conrelid = 'public.idempotency_keys'::regclass AND contype = 'f'",
        )
        assert fk == {"target": "app.customers", "confdeltype": "c"}
        assert one(conn, "SELECT users_table::text AS t, id_type::text AS ty FROM public.idem_host_users") == {
            "t": "app.customers",
            "ty": "uuid",
        }

    key = new_key()
    with connect(as_app_role(blank_url)) as app:
        first = claim(app, key, user_id=CUSTOMER)  # a uuid.UUID, as psycopg sends it
        assert first["outcome"] == "claimed"
        again = claim(app, key, user_id=str(CUSTOMER))  # or its text
        assert again["outcome"] == "in_flight", "the same key and customer is one request"
        complete(app, first, 201, {"order_id": 7})
        replay = claim(app, key, user_id=CUSTOMER)
        assert (replay["outcome"], replay["response_body"]) == ("replay", {"order_id": 7})
        other = psycopg.connect(blank_url, autocommit=True)
        with other:
            other.execute("INSERT INTO app.customers (id) VALUES (%s)", (STRANGER,))
        assert claim(app, key, user_id=STRANGER)["outcome"] == "claimed", "another customer's key is its own"
        downstream = one(
            app,
            "SELECT public.idem_downstream_key(p_key => %s, p_user_id => %s, p_endpoint => %s,"
            " p_namespace => 'broker') AS k",
            (key, CUSTOMER, "POST /api/trading/orders"),
        )["k"]
        assert uuid.UUID(downstream).version == 8
    with connect(blank_url) as owner:
        audit = one(owner, "SELECT user_id FROM public.audit_log WHERE action = 'idempotency_replay'")
        assert audit["user_id"] == CUSTOMER, "the replay's audit row names the customer"
        exported = one(owner, "SELECT count(*) AS n FROM public.idem_export_user(p_user_id => %s)", (CUSTOMER,))
        assert exported["n"] == 1
        owner.execute("DELETE FROM app.customers WHERE id = %s", (STRANGER,))
        left = one(owner, "SELECT count(*) AS n FROM public.idempotency_keys WHERE scope_user_id = %s", (STRANGER,))
        assert left["n"] == 0, "a deleted customer's keys go with it (ON DELETE CASCADE)"
        assert one(owner, "SELECT public.idem_erase_user(p_user_id => %s) AS n", (CUSTOMER,))["n"] == 1


def test_a_missing_user_is_23503_naming_the_user_and_the_table(blank_url: str) -> None:
    _uuid_app(blank_url)
    assert idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers").returncode == 0
    with connect(as_app_role(blank_url)) as app, pytest.raises(psycopg.errors.ForeignKeyViolation) as refused:
        claim(app, new_key(), user_id=STRANGER)
    detail = refused.value.diag.message_detail or ""
    assert str(STRANGER) in detail and '"customers"' in detail, detail


def test_the_users_table_from_the_environment(blank_url: str) -> None:
    _uuid_app(blank_url)
    done = idem("migrate", "-q", "--database-url", blank_url, env={"IDEM_USERS_TABLE": "app.customers"})
    assert done.returncode == 0, done.stderr
    with connect(blank_url) as conn:
        assert one(conn, "SELECT users_table::text AS t FROM public.idem_host_users")["t"] == "app.customers"


def test_migrate_prints_each_host_table_it_made(blank_url: str) -> None:
    done = idem("migrate", "--database-url", blank_url)
    assert done.returncode == 0, done.stderr
    made = [line for line in done.stdout.splitlines() if "made host table" in line]
    assert len(made) == 2, done.stdout
    users = next(line for line in made if "public.users" in line)
    assert "--users-table" in users and "empty" in users, "what it is for and how to use yours instead"
    assert any("public.audit_log" in line and "replay" in line for line in made)
    quiet = idem("migrate", "-q", "--database-url", blank_url)
    assert quiet.returncode == 0 and "made host table" not in quiet.stdout + quiet.stderr, "nothing made twice"


def test_quiet_migrate_still_says_what_it_made(blank_url: str) -> None:
    done = idem("migrate", "-q", "--database-url", blank_url)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("made host table") == 2, done.stderr


def test_the_hosts_own_users_table_is_not_announced(blank_url: str) -> None:
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.users (id bigint PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE public.audit_log (id bigserial PRIMARY KEY, user_id bigint, action text, context jsonb)"
        )
    done = idem("migrate", "--database-url", blank_url)
    assert done.returncode == 0, done.stderr
    assert "made host table" not in done.stdout
    with connect(blank_url) as conn:
        assert one(conn, "SELECT public.idem_user_id_type()::text AS t")["t"] == "bigint", "a new store takes its type"
        conn.execute("INSERT INTO public.users (id) VALUES (5000000000)")
        key = new_key()
        assert claim(conn, key, user_id=5000000000)["outcome"] == "claimed", "a bigint id past int4"


@pytest.mark.parametrize(
    ("name", "setup", "said"),
    [
        ("customers", "", "not a name schema.table"),
        ("app.nobody", "CREATE SCHEMA app", "does not exist"),
        (
            "app.customers",
            "CREATE SCHEMA app; CREATE TABLE app.customers (id text PRIMARY KEY)",
            "integer, bigint or uuid",
        ),
        (
            "app.customers",
            "CREATE SCHEMA app; CREATE TABLE app.customers (id uuid)",
            "neither the primary key nor UNIQUE",
        ),
    ],
)
def test_a_users_table_that_cannot_be_referenced_is_refused(blank_url: str, name: str, setup: str, said: str) -> None:
    if setup:
        with psycopg.connect(blank_url, autocommit=True) as conn:
            conn.execute(setup)
    done = idem("migrate", "--database-url", blank_url, "--users-table", name)
    assert done.returncode == 1
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
    with connect(blank_url) as conn:
        assert one(conn, "SELECT to_regclass('public.idempotency_keys') IS NULL AS none")["none"], "nothing changed"


def test_a_database_default_never_picks_the_users_table(blank_url: str) -> None:
    """The database's owner (an idem_app member, in the attack model) sets idem.users_table for
    every session; idem migrate sets its own value in its transaction, so the default is unused."""
    _uuid_app(blank_url)
    with psycopg.connect(blank_url, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(sql.SQL("ALTER DATABASE {} SET idem.users_table = 'app.customers'").format(sql.Identifier(dbname)))
    assert idem("migrate", "-q", "--database-url", blank_url).returncode == 0
    with connect(blank_url) as conn:
        assert one(conn, "SELECT users_table = 'public.users'::regclass AS ok FROM public.idem_host_users")["ok"]


def test_an_installed_store_keeps_its_users_table(blank_url: str) -> None:
    _uuid_app(blank_url)
    assert idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers").returncode == 0
    assert idem("migrate", "-q", "--database-url", blank_url).returncode == 0, "a later migrate keeps it"
    again = idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers")
    assert again.returncode == 0, again.stderr
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.users (id uuid PRIMARY KEY)")
    moved = idem("migrate", "-q", "--database-url", blank_url, "--users-table", "public.users")
    assert moved.returncode == 1 and "not supported yet" in moved.stderr, moved.stderr
    # A rename keeps the key (by OID); a look-alike made under the old name is not followed.
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE app.customers RENAME TO customers_old")
        conn.execute("CREATE TABLE app.customers (id uuid PRIMARY KEY)")
    followed = idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers")
    assert followed.returncode == 1 and "app.customers_old" in followed.stderr, followed.stderr
    with connect(blank_url) as conn:
        target = one(
            conn,
            "SELECT confrelid::regclass::text AS t FROM pg_constraint "
            "WHERE conname = 'idempotency_keys_scope_user_id_fkey'",
        )["t"]
        assert target == "app.customers_old"


def test_a_dropped_foreign_key_is_refused_not_repointed(blank_url: str) -> None:
    """Where no DDL guard stands (a non-superuser install) the host could drop its users table with
    CASCADE, taking the key with it: the next migrate says so rather than re-point by name."""
    _uuid_app(blank_url)
    assert idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers").returncode == 0
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute("DROP TABLE app.customers CASCADE")  # the superuser: the guard lets it
        conn.execute("CREATE TABLE app.customers (id uuid PRIMARY KEY)")
    done = idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers")
    assert done.returncode == 1 and "foreign key" in done.stderr and "is gone" in done.stderr, done.stderr


def test_the_app_role_cannot_drop_the_users_table_under_the_key(blank_url: str) -> None:
    """The attack model: a member of idem_app that owns the host's users table (and the database)
    drops it with CASCADE to take the store's foreign key down, then makes its own: the DDL guard
    (a superuser migrated) refuses dropping the key of idem's table."""
    _uuid_app(blank_url)
    assert idem("migrate", "-q", "--database-url", blank_url, "--users-table", "app.customers").returncode == 0
    role = f"idem_hu_owner_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE idem_app").format(sql.Identifier(role)))
        conn.execute(sql.SQL("ALTER TABLE app.customers OWNER TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("ALTER SCHEMA app OWNER TO {}").format(sql.Identifier(role)))
    try:
        with psycopg.connect(as_role_option(blank_url, role), autocommit=True) as host:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard"):
                host.execute("DROP TABLE app.customers CASCADE")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard"):
                host.execute("ALTER TABLE app.customers DROP CONSTRAINT customers_pkey CASCADE")
    finally:
        with psycopg.connect(blank_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SCHEMA app OWNER TO CURRENT_USER"))
            conn.execute(sql.SQL("ALTER TABLE app.customers OWNER TO CURRENT_USER"))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_an_earlier_store_on_bigint_users_keeps_working(blank_url: str, tmp_path: Path) -> None:
    """SQL API 8 (migrations 0001-0011) over the host's public.users(id bigint): the upgrade keeps
    its foreign key and integer scope, and a downstream key is the same before and after."""
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.users (id bigint PRIMARY KEY, email text)")
        conn.execute("INSERT INTO public.users (id) VALUES (41), (42)")
    earlier.build(blank_url, 8, tmp_path)
    key = new_key()
    downstream = (
        "SELECT public.idem_downstream_key(p_key => %s, p_user_id => 42, p_endpoint => 'POST /o', "
        "p_namespace => 'broker') AS k"
    )
    with connect(blank_url) as conn:
        before = one(conn, downstream, (key,))["k"]
        kept = claim(conn, key, user_id=41)
        assert kept["outcome"] == "claimed"
    done = idem("migrate", "--database-url", blank_url)
    assert done.returncode == 0, done.stderr
    assert "made host table" not in done.stdout
    with connect(blank_url) as conn:
        assert one(conn, downstream, (key,))["k"] == before, "downstream keys do not change with the upgrade"
        assert one(conn, "SELECT public.idem_user_id_type()::text AS t")["t"] == "integer"
        assert one(conn, "SELECT users_table = 'public.users'::regclass AS ok FROM public.idem_host_users")["ok"]
        assert claim(conn, key, user_id=41)["outcome"] == "in_flight", "the claim made before the upgrade holds"
        assert claim(conn, new_key(), user_id=42)["outcome"] == "claimed"
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            claim(conn, new_key(), user_id=43)
    with psycopg.connect(blank_url, autocommit=True) as conn:
        conn.execute(UUID_APP_DDL)
    moved = idem("migrate", "--database-url", blank_url, "--users-table", "app.customers")
    assert moved.returncode == 1 and "not supported yet" in moved.stderr, moved.stderr


def test_the_sql_script_takes_the_users_table(blank_url: str) -> None:
    """`idem sql --users-table` is the same install for psql; a later `idem migrate` keeps it."""
    _uuid_app(blank_url)
    script = idem("sql", "--users-table", "app.customers")
    assert script.returncode == 0, script.stderr
    applied = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", blank_url],
        input=script.stdout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert applied.returncode == 0, applied.stderr
    with connect(blank_url) as conn:
        assert one(conn, "SELECT users_table::text AS t, id_type::text AS ty FROM public.idem_host_users") == {
            "t": "app.customers",
            "ty": "uuid",
        }
    assert idem("migrate", "-q", "--database-url", blank_url).returncode == 0
