"""What the database's owner can make ``idem status`` do when a DBA runs it (contract §3a): hang past
its --wait-timeout, print a verdict or a line the database never said, or fail with a traceback.

The attacker is a plain login role, a member of ``idem_app``, that owns its database (so it may
``ALTER DATABASE ... SET`` what every session there starts with, create tables in ``public``, hold
locks); a superuser ran ``idem migrate`` into it and runs ``idem status`` on it. Each test asserts
the safe outcome, so it fails while the hole is open."""

from __future__ import annotations

import subprocess

import pytest
from psycopg import sql

import testdb
from idem_shim.queries import EXPECTED_SCHEMA_VERSION
from tests.python.support.owned import (
    SAFE_SNAPSHOT_TRAP,
    attacker_session,
    hold_a_serializable_transaction,
    pinned,
    prints_bytes,
    set_database,
)

CURRENT = f"SQL API: database {EXPECTED_SCHEMA_VERSION}, package {EXPECTED_SCHEMA_VERSION} (current)"


def _status(url: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [testdb.idem_command(), "status", "--database-url", url, "--wait-timeout", "1"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"idem status --wait-timeout 1 still ran after {timeout} s: {exc.stdout!r}")


def test_idem_status_never_waits_for_a_safe_snapshot_the_database_owner_asked_for(migrated: dict[str, str]) -> None:
    """The owner makes its database's transactions SERIALIZABLE READ ONLY DEFERRABLE by default and
    keeps a serializable read-write transaction of its own open: a deferrable transaction waits,
    holding no lock (so lock_timeout does not bound it), until every serializable transaction
    open when it began has ended, and idem status hung at its first statement, silently, for as
    long as the owner liked. Safe: it answers within its wait, and says the store is current."""
    set_database(migrated, **SAFE_SNAPSHOT_TRAP)
    with hold_a_serializable_transaction(migrated):
        done = _status(migrated["url"])
    assert done.returncode == 0 and CURRENT in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("setting", "value"),
    [("client_encoding", "SQL_ASCII"), ("IntervalStyle", "iso_8601")],
)
def test_idem_status_reads_its_answers_whatever_the_database_owner_set_for_their_text(
    migrated: dict[str, str], setting: str, value: str
) -> None:
    """client_encoding SQL_ASCII made psycopg return bytes: every applied migration's id read
    as b'0001...', so all of them pending and the verdict 'behind: run idem migrate' (exit 1) on a
    current store, and pg_cron's database looked for as "b'idem'"; an IntervalStyle other than
    postgres made the cleanup pace's intervals unreadable: a traceback. Safe: current, in full."""
    set_database(migrated, **{setting: value})
    done = _status(migrated["url"])
    assert done.returncode == 0 and CURRENT in done.stdout, done.stdout + done.stderr
    assert not prints_bytes(done.stdout) and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert any(line.startswith("cleanup pace: 2,500 rows/s;") for line in done.stdout.splitlines()), done.stdout


def test_idem_status_shows_no_control_character_of_a_lock_holders_name(migrated: dict[str, str]) -> None:
    """While a DBA's LOCK TABLE holds the store, idem status names every session holding an
    ACCESS EXCLUSIVE lock in the database: the owner's too, with its tables' names, which are its
    text. Only C0 controls and DEL were shown as '?': a C1 control (NEL, U+0085, ends a line for
    whatever splits the report; CSI, U+009B, is a terminal's escape) or U+2028 passed, and started
    a cleanup pace line of the owner's. Safe: one cleanup pace line, with no such character."""
    forged = "cleanup pace: 2,500 rows/s; 0 expired: fits"
    name = f"x\u0085{forged}\u2028\u009b2K"
    with attacker_session(migrated) as attacker:
        attacker.execute(sql.SQL("CREATE TABLE public.{} ()").format(sql.Identifier(name)))
        attacker.execute("BEGIN")
        attacker.execute(sql.SQL("LOCK TABLE public.{} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(name)))
        with pinned(migrated["url"]) as dba:
            dba.execute("BEGIN")
            dba.execute("LOCK TABLE public.idempotency_keys IN ACCESS EXCLUSIVE MODE")
            done = _status(migrated["url"])
            dba.execute("ROLLBACK")
        attacker.execute("ROLLBACK")
    paces = [line for line in done.stdout.splitlines() if line.startswith("cleanup pace:")]
    assert len(paces) == 1 and "waited 1 s for a lock" in paces[0] and forged in paces[0], done.stdout
    assert not any(c in done.stdout for c in "\u0085\u2028\u009b"), repr(paces)


def test_the_bytes_check_tells_a_bytes_repr_from_a_name_ending_in_b() -> None:
    """CI failed a current, correct status on its pg_cron line: the random database name ended
    in 'b' before its closing quote, and the check looked for "b'" anywhere."""
    line = "pg_cron: job 'idem-cleanup:idem_own_2dc384db' (jobid 56) in database idem"
    assert not prints_bytes(line)
    assert prints_bytes("applied b'0001.host-tables'") and prints_bytes("in database b'idem'")
