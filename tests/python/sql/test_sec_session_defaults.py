"""What the database's owner sets for every session of its database (``ALTER DATABASE ... SET``)
against the DBA's other tools there: the ``idem sql`` script through psql and the Flask app's
admin verbs on IDEM_ADMIN_DATABASE_URL (``idem status`` and ``idem migrate``: test_sec_status.py).

Two kinds of setting: the transaction defaults that make a session's first statement wait,
holding no lock, for as long as the owner keeps a serializable transaction open (a deferrable
transaction's safe snapshot: owned.SAFE_SNAPSHOT_TRAP), and the text settings psycopg reads its
answers by (``client_encoding = SQL_ASCII`` returns bytes; another IntervalStyle cannot be read).
Each test asserts the safe outcome, so it fails while the hole is open."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from psycopg import sql

import testdb
from tests.python.support.owned import (
    SAFE_SNAPSHOT_TRAP,
    hold_a_serializable_transaction,
    idem,
    pinned,
    set_database,
)

WAIT_S = 60
SEED = """
INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                                     response_code, response_body, created_at, locked_at, expires_at)
SELECT pg_catalog.gen_random_uuid()::pg_catalog.text, NULL, 'POST /orders', 'h', s.status, s.code,
       s.body::pg_catalog.jsonb, pg_catalog.now() OPERATOR(pg_catalog.-) '2 hours'::pg_catalog.interval,
       pg_catalog.now() OPERATOR(pg_catalog.-) '2 hours'::pg_catalog.interval,
       pg_catalog.now() OPERATOR(pg_catalog.+) '1 hour'::pg_catalog.interval
  FROM (VALUES ('completed', 201, '{"ok": true}'), ('in_flight', NULL, NULL)) AS s (status, code, body)
"""


def _ran(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=WAIT_S, **kwargs)  # type: ignore[call-overload,no-any-return]
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args[:3])} … still ran after {WAIT_S} s: {exc.stdout!r} {exc.stderr!r}")


def test_the_idem_sql_script_never_waits_for_a_safe_snapshot_the_owner_asked_for(owned: dict[str, str]) -> None:
    """The DBA applies ``idem sql`` with psql to the owner's database, whose transactions the owner
    made SERIALIZABLE READ ONLY DEFERRABLE by default: the script's first transaction waited for
    the owner's open one, silently, for as long as the owner liked. Safe: it ends at once, on the
    read-only default (a refusal the DBA can act on), having written nothing."""
    script = idem("sql")
    assert script.returncode == 0, script.stderr
    set_database(owned, **SAFE_SNAPSHOT_TRAP)
    with hold_a_serializable_transaction(owned):
        done = _ran(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]], input=script.stdout)
    assert done.returncode != 0 and "read-only transaction" in done.stderr, done.stderr
    with pinned(owned["url"]) as conn:
        assert conn.execute("SELECT pg_catalog.to_regclass('public.idempotency_keys')").fetchone() == (None,)


def _admin_verb(tmp_path: Path, owned: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``flask idempotency <args>`` of an app that runs as the owner's role, its admin verbs on the
    DBA's URL (IDEM_ADMIN_DATABASE_URL), as a DBA runs them."""
    (tmp_path / "hostapp.py").write_text(
        "from flask import Flask\nfrom idem_shim import Idem\n"
        "app = Flask(__name__)\napp.config.from_prefixed_env('HOST')\nIdem(app)\n"
    )
    flask = str(Path(testdb.idem_command()).with_name("flask"))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOST_IDEM_DATABASE_URL": owned["attacker_url"],
        "HOST_IDEM_ADMIN_DATABASE_URL": owned["url"],
    }
    return _ran([flask, "--app", "hostapp", "idempotency", *args], cwd=tmp_path, env=env)


def test_the_admin_verbs_never_wait_for_a_safe_snapshot_the_owner_asked_for(
    tmp_path: Path, migrated: dict[str, str]
) -> None:
    """``flask idempotency stats`` on the DBA's URL hung at its first statement under the owner's
    SERIALIZABLE READ ONLY DEFERRABLE defaults while the owner held a serializable transaction.
    Safe: it answers (it only reads)."""
    with pinned(migrated["url"]) as conn:  # the owner's app keeps plain defaults for itself
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET default_transaction_read_only = off").format(
                sql.Identifier(migrated["role"]), sql.Identifier(migrated["db"])
            )
        )
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET default_transaction_deferrable = off").format(
                sql.Identifier(migrated["role"]), sql.Identifier(migrated["db"])
            )
        )
    set_database(migrated, **SAFE_SNAPSHOT_TRAP)
    with hold_a_serializable_transaction(migrated):
        done = _admin_verb(tmp_path, migrated, "stats")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize(("setting", "value"), [("client_encoding", "SQL_ASCII"), ("IntervalStyle", "iso_8601")])
def test_the_admin_verbs_read_their_answers_whatever_the_owner_set_for_their_text(
    tmp_path: Path, migrated: dict[str, str], setting: str, value: str
) -> None:
    """``flask idempotency stats`` printed b'...' for every text under the owner's SQL_ASCII, and
    a traceback under an IntervalStyle psycopg cannot read. Safe: the same table as with none."""
    with pinned(migrated["url"]) as conn:  # a held key and a completed one: texts, counts, ages to print
        conn.execute(SEED)
    plain = _admin_verb(tmp_path, migrated, "stats")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    set_database(migrated, **{setting: value})
    done = _admin_verb(tmp_path, migrated, "stats")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert _no_ages(done.stdout) == _no_ages(plain.stdout) and "b'" not in done.stdout, done.stdout


def _no_ages(table: str) -> str:
    """The table without its ages (``2:00:00.418231``), which grow between the two runs."""
    return re.sub(r"\b\d+:\d\d:\d\d\.\d+\b", "AGE", table)


@pytest.mark.parametrize("wait", ["inf", "nan", "1e400"])
@pytest.mark.parametrize("verb", ["migrate", "sql"])
def test_migrate_and_sql_refuse_a_wait_that_is_no_number_of_seconds_in_one_line(verb: str, wait: str) -> None:
    url = [] if verb == "sql" else ["--database-url", "postgresql://x@127.0.0.1:1/x"]
    done = _ran([testdb.idem_command(), verb, "--wait-timeout", wait, *url])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error:") and "is not a number of seconds" in done.stderr, done.stderr
