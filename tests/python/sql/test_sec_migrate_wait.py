"""idem's DDL guard, committed first, and what `idem migrate` and the `idem sql` script do after it
(contract §3a): wait for every transaction of the database begun before that commit, then run the
preflight, which sees what they committed; and idem's migration lock, one install at a time.

Before the first migrate no guard exists, and the preflight cannot see what a transaction has not
committed: the database's owner (a plain login role, a member of ``idem_app`` once migrated: the
``owned`` fixture) plants an overload of one of idem's routines in ``public`` in a transaction held
open across the install, or in one that runs its code as it (an index expression analyzed by
another session, a prepared transaction), and commits it after; every claim is then 42725. Each
test asserts the safe outcome (the install fails naming the transaction, the guard refuses the
plant, or a claim after the install is claimed), so it fails while the hole is open.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.python.support.owned import idem, pinned
from tests.python.support.sqlapi import new_key
from tests.python.support.waiting import wait_until

#: One more, defaulted argument on a helper idem_claim calls by name: every claim is then 42725.
PLANT = (
    "CREATE FUNCTION public.idem_token_hash(p_secret bytea, p_key_id bigint, p_claimed_at timestamptz,"
    " p_pad integer DEFAULT 0) RETURNS text LANGUAGE sql RETURN 'x'"
)
#: How a refusal names it.
PLANTED = "public.idem_token_hash(bytea,bigint,timestamp with time zone,integer)"


def _by_migrate(owned: dict[str, str], wait_timeout: float) -> subprocess.CompletedProcess[str]:
    return idem("migrate", "--database-url", owned["url"], "--wait-timeout", str(wait_timeout))


def _by_psql(owned: dict[str, str], wait_timeout: float) -> subprocess.CompletedProcess[str]:
    script = idem("sql", "--wait-timeout", str(wait_timeout))
    assert script.returncode == 0, script.stderr
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]],
        input=script.stdout,
        capture_output=True,
        text=True,
        timeout=300,
    )


INSTALLERS = pytest.mark.parametrize("install", [_by_migrate, _by_psql], ids=["idem-migrate", "idem-sql-psql"])
#: One of the two, given its --wait-timeout.
Install = Callable[[dict[str, str], float], subprocess.CompletedProcess[str]]


def _attacker_session(owned: dict[str, str]) -> psycopg.Connection[Any]:
    return psycopg.connect(owned["attacker_url"], options="-c search_path=pg_catalog,pg_temp")


def _guard_committed(owned: dict[str, str]) -> bool:
    with pinned(owned["url"]) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_event_trigger WHERE evtname LIKE 'idem_guard%'"
        ).fetchone()
    return bool(row and row[0] == 4)


def _when_guard_committed(owned: dict[str, str], then: Callable[[], None]) -> threading.Thread:
    """``then`` in a thread of its own, once idem's DDL guard is committed (or after 60 s)."""

    def run() -> None:
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: _guard_committed(owned), 60, 0.05, what="idem's DDL guard committed")
        then()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _claim_after(owned: dict[str, str], done: subprocess.CompletedProcess[str]) -> str:
    """A claim in a new session of the app's role, after an install that exited 0."""
    with pinned(owned["url"]) as conn:
        conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
    with psycopg.connect(owned["attacker_url"], autocommit=True) as app:
        try:
            row = app.execute(
                "SELECT c.outcome FROM public.idem_claim(p_key => %s, p_user_id => NULL,"
                " p_endpoint => 'POST /orders', p_request => '{}') c",
                (new_key(),),
            ).fetchone()
            return str(row[0]) if row else "no row"
        except psycopg.Error as exc:
            return f"{exc.sqlstate}: {exc.diag.message_primary}"


def _only_the_guard(owned: dict[str, str]) -> dict[str, object]:
    """What an install left that is not the DDL guard, and whether the guard is there."""
    with pinned(owned["url"]) as conn:
        row = conn.execute(
            "SELECT pg_catalog.to_regclass('public.idempotency_keys')::text,"
            " (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc WHERE proname = 'idem_claim'),"
            " pg_catalog.to_regclass('public._yoyo_migration')::text,"
            " (SELECT pg_catalog.count(*) FROM pg_catalog.pg_event_trigger WHERE evtname LIKE 'idem_guard%')"
        ).fetchone()
    assert row is not None
    return {"store": row[0], "idem_claim": row[1], "yoyo": row[2], "guard triggers": row[3]}


def _stops_the_install_naming_it(
    owned: dict[str, str], session: psycopg.Connection[Any], user: str, install: Install
) -> None:
    """The install, while ``session``'s transaction (begun before it) is held open: it commits the
    guard, waits for that transaction, and on its timeout fails naming the session, with nothing
    but the guard made."""
    pid = session.info.backend_pid
    started = time.monotonic()
    done = install(owned, 2)
    took = time.monotonic() - started
    session.rollback()
    said = done.stdout + done.stderr
    assert done.returncode != 0, f"the install went on past a transaction older than the guard: {said}"
    assert f"pid {pid} (user {user}" in said and "nothing else was changed" in said, said
    assert took >= 2, f"it failed after {took:.1f} s, before its 2 s: {said}"
    assert _only_the_guard(owned) == {"store": None, "idem_claim": 0, "yoyo": None, "guard triggers": 4}


@INSTALLERS
def test_a_plant_held_open_across_the_first_install_stops_it_naming_the_session(
    owned: dict[str, str], install: Install
) -> None:
    """The database's owner opens a transaction before idem's first install and makes
    public.idem_token_hash with one more, defaulted argument: no guard exists yet, and the
    preflight does not see a routine not committed. Were the install to go on, the owner would
    commit after it and every claim would be 42725 (idem_claim's call matches both), the plant then
    kept by the drop guard. Safe: the install commits the guard, waits for that transaction, and
    on its timeout fails naming the session, with nothing but the guard made."""
    with _attacker_session(owned) as attacker:
        attacker.execute(PLANT)  # held open across the install
        _stops_the_install_naming_it(owned, attacker, owned["role"], install)


@INSTALLERS
def test_a_superusers_idle_transaction_begun_before_the_guard_stops_the_install_naming_it(
    owned: dict[str, str], install: Install
) -> None:
    """A DBA's psql left in a transaction (a superuser's session, idle in transaction) from before
    idem's first install. A superuser's transaction may hold what the database owner's code made
    in it, unjudged (an index expression its ANALYZE ran as that owner: the tests below), and
    nothing another session can read tells the two apart. Safe: the install waits for it as for
    any other, and on its timeout fails naming it, with nothing but the guard made."""
    with psycopg.connect(owned["url"]) as dba:
        dba.execute("SELECT 1")  # its transaction begins, and stays open
        _stops_the_install_naming_it(owned, dba, owned["dba"], install)


def _committed_during_the_wait(owned: dict[str, str], install: Install) -> tuple[str, subprocess.CompletedProcess[str]]:
    """The install, while the database owner's transaction holding PLANT commits once the guard is."""
    with _attacker_session(owned) as attacker:
        attacker.execute(PLANT)
        committer = _when_guard_committed(owned, attacker.commit)
        done = install(owned, 60)
        committer.join()
    return done.stdout + done.stderr, done


@INSTALLERS
def test_a_plant_committed_while_the_first_install_waits_is_refused_by_name(
    owned: dict[str, str], install: Install
) -> None:
    """The same plant, committed once the install has committed its guard (the moment the owner
    would pick: before, the preflight sees it; after the whole install, the guard refuses it).
    Safe: the install waited for it and fails naming idem_token_hash, or a claim after it is
    claimed."""
    said, done = _committed_during_the_wait(owned, install)
    claimed = _claim_after(owned, done) if done.returncode == 0 else "not run"
    named = done.returncode != 0 and PLANTED in said
    assert named or claimed == "claimed", f"install: {done.returncode} {said}; a claim after it: {claimed}"


@pytest.mark.parametrize("warm", [False, True], ids=["first-ddl-of-the-session", "session-did-ddl-before"])
def test_a_transaction_begun_before_the_guard_that_plants_after_its_commit_never_stops_claims(
    owned: dict[str, str], warm: bool
) -> None:
    """A transaction of the database's owner begins before idem's first migrate, holding no
    transaction id (a SELECT), and makes the plant only once the guard is committed. A session
    learns of new event triggers when it next takes a lock, and PostgreSQL decides whether a DDL
    command fires ddl_command_end before the command takes one: a session whose cache of event
    triggers was filled before (it ran DDL earlier: ``warm``) may make its plant unjudged. Safe:
    the guard refuses the plant, or migrate (which waits for that transaction) fails naming it, or
    a claim after migrate is claimed."""
    planted: list[str] = []
    with _attacker_session(owned) as attacker:
        if warm:
            attacker.autocommit = True
            attacker.execute("CREATE TABLE public.warm_up (x integer)")  # fills the session's cache
            attacker.autocommit = False
        attacker.execute("SELECT 1")  # the transaction begins: no transaction id

        def plant_then_commit() -> None:
            try:
                attacker.execute(PLANT)
                planted.append("made")
                time.sleep(0.5)  # the attacker keeps its plant open a while: its timing is the attack's
                attacker.commit()
            except psycopg.Error as exc:
                planted.append(f"{exc.sqlstate}: {exc.diag.message_primary}")
                attacker.rollback()

        planter = _when_guard_committed(owned, plant_then_commit)
        done = _by_migrate(owned, 60)
        planter.join()
    said = done.stdout + done.stderr
    claimed = _claim_after(owned, done) if done.returncode == 0 else "not run"
    refused = bool(planted) and planted[0].startswith("42501: idem_ddl_guard: CREATE FUNCTION refused")
    named = done.returncode != 0 and PLANTED in said
    assert refused or named or claimed == "claimed", (
        f"the plant: {planted}; migrate: {done.returncode} {said}; a claim after it: {claimed}"
    )
    if not warm:  # the session's first DDL reads the event triggers anew: the guard judges it
        assert refused, f"the plant: {planted}; migrate: {done.returncode} {said}"


def _install_past_prepared(
    owned: dict[str, str], statement: str, gid: str, install: Install, wait_timeout: float, as_url: str = ""
) -> subprocess.CompletedProcess[str]:
    """The install run while the transaction of ``statement`` is prepared as ``gid``, by the
    database's owner (or the role of ``as_url``); rolled back after."""
    with psycopg.connect(as_url or owned["attacker_url"], options="-c search_path=pg_catalog,pg_temp") as preparer:
        preparer.execute(statement)
        preparer.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    try:
        return install(owned, wait_timeout)
    finally:
        with pinned(owned["url"]) as conn:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def _skip_unless_prepared_transactions(owned: dict[str, str]) -> None:
    with pinned(owned["url"]) as conn:
        row = conn.execute("SELECT pg_catalog.current_setting('max_prepared_transactions')::int").fetchone()
    if not row or row[0] == 0:
        pytest.skip("max_prepared_transactions = 0 on this server: no transaction can be prepared")


def test_a_prepared_transaction_holding_a_plant_stops_the_first_migrate_naming_its_gid(owned: dict[str, str]) -> None:
    """A prepared transaction keeps what it made, uncommitted, with no session: the database's
    owner prepares one with the plant before idem's first migrate and commits it after. Safe:
    migrate waits for it and fails, naming its gid, with nothing but the guard made."""
    _skip_unless_prepared_transactions(owned)
    gid = f"plant_{uuid.uuid4().hex[:8]}"
    done = _install_past_prepared(owned, PLANT, gid, _by_migrate, 2)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and f"prepared transaction '{gid}' (owner {owned['role']}" in said, said
    assert _only_the_guard(owned) == {"store": None, "idem_claim": 0, "yoyo": None, "guard triggers": 4}


def test_a_transaction_begun_before_the_guard_and_prepared_after_it_is_still_waited_for(owned: dict[str, str]) -> None:
    """The database's owner's session (its cache of event triggers filled by earlier DDL) begins a
    transaction before idem's first migrate, makes the plant once the guard is committed, and
    prepares it: its session's transaction ends, but what it made lives on, uncommitted. Safe:
    migrate waits for the prepared transaction too and fails naming its gid (or the guard refused
    the plant and migrate goes on: a claim after it is claimed)."""
    _skip_unless_prepared_transactions(owned)
    gid = f"plant_{uuid.uuid4().hex[:8]}"
    planted: list[str] = []
    with _attacker_session(owned) as attacker:
        attacker.autocommit = True
        attacker.execute("CREATE TABLE public.warm_up (x integer)")
        attacker.autocommit = False
        attacker.execute("SELECT 1")

        def plant_then_prepare() -> None:
            try:
                attacker.execute(PLANT)
                attacker.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
                planted.append("prepared")
            except psycopg.Error as exc:
                planted.append(f"{exc.sqlstate}: {exc.diag.message_primary}")
                attacker.rollback()

        planter = _when_guard_committed(owned, plant_then_prepare)
        try:
            done = _by_migrate(owned, 3)
        finally:
            planter.join()
            with pinned(owned["url"]) as conn:
                if conn.execute("SELECT 1 FROM pg_catalog.pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone():
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    said = done.stdout + done.stderr
    if planted != ["prepared"]:
        assert planted[0].startswith("42501: idem_ddl_guard"), planted
        assert done.returncode == 0 and _claim_after(owned, done) == "claimed", said
        return
    assert done.returncode != 0 and f"prepared transaction '{gid}' (owner {owned['role']}" in said, said
    assert _only_the_guard(owned) == {"store": None, "idem_claim": 0, "yoyo": None, "guard triggers": 4}


#: Run by the index of the database owner's table below, so by an autovacuum worker's ANALYZE: as
#: the table's owner, in a process whose session is the bootstrap superuser's and that no client
#: began. Once its cache of event triggers is filled (none yet), it waits for idem's guard, makes
#: the plant (unjudged: the cache is not read anew before the command), and ends once the install
#: has committed (ANALYZE then commits the plant).
AUTOVACUUM_PLANT = """
CREATE FUNCTION public.av_plant() RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    IF session_user = current_user OR pg_catalog.to_regprocedure({planted}) IS NOT NULL THEN
        RETURN;  -- the owner's own session (CREATE INDEX, INSERT), or planted already
    END IF;
    CREATE TABLE public.av_warm (x integer);
    PERFORM pg_catalog.count(*) FROM pg_catalog.pg_event_trigger;  -- its lock taken, before the guard
    PERFORM pg_catalog.pg_advisory_xact_lock({key});  -- tells the test it waits
    {warm}
    WHILE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname = 'idem_guard_routine') LOOP
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
    {hold}
    EXECUTE {plant};
    {release}
    WHILE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.proname = 'idem_claim')
          AND pg_catalog.clock_timestamp() < pg_catalog.statement_timestamp() + interval '2 min' LOOP
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
END $f$"""
AUTOVACUUM_KEY = 0x61765F70
#: The same index's function, planting at once in whichever session analyzes the table, as its owner.
PLANT_AT_ONCE = """
CREATE FUNCTION public.av_plant() RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    IF session_user <> current_user AND pg_catalog.to_regprocedure({planted}) IS NULL THEN
        EXECUTE {plant};
    END IF;
END $f$"""


def _planter(text: str = AUTOVACUUM_PLANT, holding: int | None = None) -> sql.Composed:
    """An index's function (AUTOVACUUM_PLANT, PLANT_AT_ONCE); ``holding``: an advisory lock it takes,
    session level, once the guard is committed, and lets go a second after the plant. The lock
    functions are called once before the guard (another key): a call's first planning reads the
    catalog, which takes a lock, which reads the new event triggers in before the plant."""
    warm: sql.Composable = sql.SQL("")
    hold: sql.Composable = sql.SQL("")
    release: sql.Composable = sql.SQL("")
    if holding is not None:
        warm = sql.SQL("PERFORM pg_catalog.pg_advisory_lock({0}), pg_catalog.pg_advisory_unlock({0});").format(
            sql.Literal(AUTOVACUUM_KEY + 1)
        )
        hold = sql.SQL("PERFORM pg_catalog.pg_advisory_lock({});").format(sql.Literal(holding))
        release = sql.SQL("PERFORM pg_catalog.pg_sleep(1.0); PERFORM pg_catalog.pg_advisory_unlock({});").format(
            sql.Literal(holding)
        )
    return sql.SQL(text).format(
        planted=sql.Literal(PLANTED),
        key=sql.Literal(AUTOVACUUM_KEY),
        plant=sql.Literal(PLANT),
        warm=warm,
        hold=hold,
        release=release,
    )


def _autovacuum_planter(owned: dict[str, str]) -> int | None:
    """The pid of the process that holds AUTOVACUUM_KEY, if one does."""
    with pinned(owned["url"]) as conn:
        row = conn.execute(
            "SELECT l.pid FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())"
            " AND ((l.classid::bigint << 32) | l.objid::bigint) = %s",
            (AUTOVACUUM_KEY,),
        ).fetchone()
    return int(row[0]) if row else None


def _wait_for(what: Callable[[], bool], seconds: float) -> bool:
    """Whether ``what`` came true within ``seconds`` (the callers then say what did not happen)."""
    try:
        return wait_until(what, seconds, 0.1, what="the race's next step")
    except TimeoutError:
        return False


def _plant_by_index(owned: dict[str, str], autovacuum: bool, planter: sql.Composed | None = None) -> None:
    """The database owner's table av_t, its index on av_key (which calls ``planter``, by default
    AUTOVACUUM_PLANT) and ten rows; its ANALYZE left to autovacuum, or not."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute(planter or _planter())
        conn.execute(
            "CREATE FUNCTION public.av_key(integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE"
            " AS $f$ BEGIN PERFORM public.av_plant(); RETURN $1; END $f$"
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE public.av_t (x integer) WITH (autovacuum_enabled = {},"
                " autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0)"
            ).format(sql.Literal(autovacuum))
        )
        conn.execute("CREATE INDEX ON public.av_t (public.av_key(x))")
        conn.execute("INSERT INTO public.av_t SELECT pg_catalog.generate_series(1, 10)")


def _install_past_planter(
    owned: dict[str, str], pid: int, install: Install = _by_migrate
) -> tuple[subprocess.CompletedProcess[str], str]:
    """The install while the index's function waits in pid; then a claim, if the install exited 0."""
    done = install(owned, 5)
    if done.returncode != 0:  # the function waits for an install that did not come
        with pinned(owned["url"]) as conn:
            conn.execute("SELECT pg_catalog.pg_cancel_backend(%s)", (pid,))
    assert _wait_for(lambda: _autovacuum_planter(owned) is None, 60), "the index's function never ended"
    return done, _claim_after(owned, done) if done.returncode == 0 else "not run"


def test_a_plant_made_by_an_autovacuum_worker_begun_before_the_guard_never_stops_claims(owned: dict[str, str]) -> None:
    """An autovacuum worker's session is the bootstrap superuser's (the wait once skipped
    superusers' sessions), and its ANALYZE runs the index expressions of the database owner's table as that
    owner, DDL included. Before idem's first migrate, the owner's table gets an index whose
    function, in such a worker, fills its cache of event triggers, waits for the guard, makes the
    plant unjudged and lets ANALYZE commit it once the install has committed: every claim after
    is 42725. No session of the owner is open. Safe: migrate waits for that worker's transaction
    (it began before the guard) and fails naming it, or a claim after migrate is claimed."""
    with pinned(owned["url"]) as conn:
        row = conn.execute("SELECT pg_catalog.current_setting('autovacuum')::bool").fetchone()
    if not row or not row[0]:
        pytest.skip("autovacuum is off on this server")
    _plant_by_index(owned, autovacuum=True)
    # the launcher visits the database once per autovacuum_naptime
    assert _wait_for(lambda: _autovacuum_planter(owned) is not None, 180), "no autovacuum worker analyzed av_t"
    pid = _autovacuum_planter(owned)
    assert pid is not None
    done, claimed = _install_past_planter(owned, pid)
    named = done.returncode != 0 and f"pid {pid} " in done.stdout + done.stderr
    assert named or claimed == "claimed", f"migrate: {done.returncode} {done.stdout + done.stderr}; a claim: {claimed}"


@INSTALLERS
@pytest.mark.parametrize("holding", [False, True], ids=["plain", "holding-idems-migration-lock"])
def test_a_plant_made_by_a_superusers_analyze_begun_before_the_guard_never_stops_claims(
    owned: dict[str, str], install: Install, holding: bool
) -> None:
    """The same index, analyzed by a superuser's own session (a maintenance job's ANALYZE; VACUUM,
    REINDEX, CLUSTER, CREATE INDEX and REFRESH MATERIALIZED VIEW run index expressions too) in a
    transaction begun before idem's first install: the function runs as the database's owner,
    fills its cache, waits for the guard, plants unjudged, and the superuser's transaction commits
    it after the install. ``holding``: the function also holds idem's migration lock from the
    guard's commit until just after the plant, in the superuser's session (any session may take an
    advisory lock, at session level, and let it go before its transaction ends), so a wait that took
    a superuser holding that lock for another install would skip it. Safe: the install waits for
    that transaction and fails naming it, or a claim after it is claimed."""
    from idem_shim.schema import LOCK_KEY

    _plant_by_index(owned, autovacuum=False, planter=_planter(holding=LOCK_KEY if holding else None))
    with pinned(owned["url"]) as dba:
        pid = dba.info.backend_pid

        def run_analyze() -> None:
            with contextlib.suppress(psycopg.errors.QueryCanceled):  # once the install failed naming it
                dba.execute("ANALYZE public.av_t")

        analyze = threading.Thread(target=run_analyze)
        analyze.start()
        try:
            assert _wait_for(lambda: _autovacuum_planter(owned) == pid, 60), "the DBA's ANALYZE never ran av_key"
            done, claimed = _install_past_planter(owned, pid, install)
        finally:
            analyze.join()
    named = done.returncode != 0 and f"pid {pid} " in done.stdout + done.stderr
    assert named or claimed == "claimed", f"install: {done.returncode} {done.stdout + done.stderr}; a claim: {claimed}"


@INSTALLERS
def test_a_superusers_prepared_transaction_holding_a_plant_made_as_the_owner_stops_the_first_install(
    owned: dict[str, str], install: Install
) -> None:
    """A superuser's transaction runs the database owner's code (its ANALYZE of the owner's table,
    whose index makes the plant as that owner: no guard yet) and is prepared before idem's first
    install, to be committed after it by the DBA's transaction manager. Safe: the install waits for
    it and fails naming its gid, with nothing but the guard made."""
    _skip_unless_prepared_transactions(owned)
    _plant_by_index(owned, autovacuum=False, planter=_planter(PLANT_AT_ONCE))
    gid = f"maintenance_{uuid.uuid4().hex[:8]}"
    done = _install_past_prepared(owned, "ANALYZE public.av_t", gid, install, 2, as_url=owned["url"])
    said = done.stdout + done.stderr
    assert done.returncode != 0 and f"prepared transaction '{gid}' (owner {owned['dba']}" in said, said
    assert _only_the_guard(owned) == {"store": None, "idem_claim": 0, "yoyo": None, "guard triggers": 4}


@INSTALLERS
def test_a_prepared_transactions_gid_never_writes_a_line_of_its_own_into_the_installs_error(
    owned: dict[str, str], install: Install
) -> None:
    """A gid is any text the database's owner picks, newlines included, and the install's error
    names each prepared transaction it waited for by its gid: a gid can end the line and write one
    that reads as the install's own (psql prints every line), or cut the error there (idem migrate
    says its first line), the other transactions and what to do with them unsaid. Safe: the
    install fails naming it and saying what to do, and no line of its output is the owner's."""
    _skip_unless_prepared_transactions(owned)
    forged = "idem migrate: nothing to do; the store is up to date"
    gid = f"tx_{uuid.uuid4().hex[:8]}\n{forged}\n"
    done = _install_past_prepared(owned, "SELECT 1", gid, install, 1)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "prepared transaction 'tx_" in said and "end them" in said, said
    assert forged not in [line.strip() for line in said.splitlines()], said


@INSTALLERS
def test_a_session_holding_idems_migration_lock_never_hangs_the_install_past_its_timeout(
    owned: dict[str, str], install: Install
) -> None:
    """Any role may take an advisory lock under any key, and hold it, idle, for as long as its
    session lives: the database's owner takes the one each of the install's transactions takes
    first (one migrate at a time). Safe: the install, bounded by its --wait-timeout, fails after
    it naming the session that holds the lock."""
    from idem_shim.schema import LOCK_KEY

    with pinned(owned["attacker_url"]) as attacker:
        attacker.execute("SELECT pg_catalog.pg_advisory_lock(%s)", (LOCK_KEY,))
        pid = attacker.info.backend_pid
        result: list[subprocess.CompletedProcess[str]] = []
        installer = threading.Thread(target=lambda: result.append(install(owned, 2)))
        installer.start()
        installer.join(60)
        hung = installer.is_alive()
        attacker.execute("SELECT pg_catalog.pg_advisory_unlock_all()")  # lets a hung install go on
        installer.join()
    said = result[0].stdout + result[0].stderr
    assert not hung, f"the install still waited for the lock after 60 s (its --wait-timeout: 2 s): {said}"
    assert result[0].returncode != 0 and f"pid {pid} (user {owned['role']}" in said, said


def _waiting_for_idems_lock(owned: dict[str, str]) -> int:
    """How many other sessions run migrate_lock.sql's wait for idem's migration lock."""
    with pinned(owned["url"]) as conn:
        running = conn.execute(
            "SELECT a.query FROM pg_catalog.pg_stat_activity a WHERE a.datname = pg_catalog.current_database()"
            " AND a.state = 'active' AND a.pid <> pg_catalog.pg_backend_pid()"
        ).fetchall()
    return sum("$idem_migrate_lock$" in str(query) for (query,) in running)


@pytest.mark.parametrize(
    "installs",
    [(_by_migrate, _by_migrate), (_by_psql, _by_psql), (_by_migrate, _by_psql)],
    ids=["idem-migrate-twice", "idem-sql-psql-twice", "idem-migrate-and-idem-sql-psql"],
)
def test_two_installs_begun_together_both_finish(owned: dict[str, str], installs: tuple[Install, Install]) -> None:
    """Two installs of one database at once (two deploys, or a deploy and a DBA's script). A
    session holds idem's migration lock until both wait for it, so each one's guard transaction
    begins before the other's guard is committed: each install's wait then meets the other's
    transactions (the guard's, waiting for the lock; its wait), which a superuser's as they are it
    does not skip. Safe: neither waits for the other until its timeout (30 s): both exit 0, well
    before it, and a claim after them is claimed."""
    from idem_shim.schema import LOCK_KEY

    done: list[subprocess.CompletedProcess[str] | None] = [None, None]

    def run(i: int) -> None:
        done[i] = installs[i](owned, 30)

    with pinned(owned["url"]) as holder:  # a session-level lock: no transaction left open
        holder.execute("SELECT pg_catalog.pg_advisory_lock(%s)", (LOCK_KEY,))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        both = _wait_for(lambda: _waiting_for_idems_lock(owned) == 2, 60)
        holder.execute("SELECT pg_catalog.pg_advisory_unlock(%s)", (LOCK_KEY,))
        for thread in threads:
            thread.join()
    took = time.monotonic() - started
    said = "\n".join(f"exit {d.returncode}: {d.stdout + d.stderr}" if d else "not run" for d in done)
    assert both, f"the two installs never waited for idem's lock together: {said}"
    assert all(d and d.returncode == 0 for d in done), said
    assert took < 30, f"the two took {took:.1f} s, as long as their --wait-timeout: {said}"
    assert done[0] is not None and _claim_after(owned, done[0]) == "claimed"


@INSTALLERS
def test_a_refusal_after_the_guard_is_committed_never_says_nothing_was_changed(
    owned: dict[str, str], install: Install
) -> None:
    """The plant committed while the first install waits is refused by the second preflight, once
    the install has committed idem's guard (a schema, a table, a function, four event triggers).
    Safe: the refusal says the guard was made, not that nothing was changed."""
    said, done = _committed_during_the_wait(owned, install)
    assert done.returncode != 0 and PLANTED in said, said
    assert _only_the_guard(owned)["guard triggers"] == 4
    assert "nothing was changed" not in said and "guard" in said, said


def test_a_procedure_begun_before_the_guard_that_commits_then_plants_is_refused(owned: dict[str, str]) -> None:
    """A CALL of the database owner begun before idem's first migrate, its cache of event triggers
    filled, waits for the guard and COMMITs inside the procedure: the transaction it then plants in
    began after the guard (the wait does not cover it), in a session that has not run a new
    statement. Safe: the guard refuses the plant (a transaction's start reads the invalidations),
    or migrate fails naming it, or a claim after migrate is claimed."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute(
            sql.SQL(
                "CREATE PROCEDURE public.av_call() LANGUAGE plpgsql AS $f$ BEGIN"
                " CREATE TABLE public.av_warm (x integer);"
                " WHILE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e"
                "                    WHERE e.evtname = 'idem_guard_routine') LOOP"
                "     PERFORM pg_catalog.pg_sleep(0.01);"
                " END LOOP;"
                " COMMIT;"
                " EXECUTE {plant};"
                " END $f$"
            ).format(plant=sql.Literal(PLANT))
        )
    planted: list[str] = []

    def call() -> None:
        with pinned(owned["attacker_url"]) as attacker:
            try:
                attacker.execute("CALL public.av_call()")
                planted.append("made")
            except psycopg.Error as exc:
                planted.append(f"{exc.sqlstate}: {exc.diag.message_primary}")

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    done = _by_migrate(owned, 10)
    caller.join()
    said = done.stdout + done.stderr
    claimed = _claim_after(owned, done) if done.returncode == 0 else "not run"
    refused = bool(planted) and planted[0].startswith("42501: idem_ddl_guard: CREATE FUNCTION refused")
    assert refused or (done.returncode != 0 and PLANTED in said) or claimed == "claimed", (
        f"the plant: {planted}; migrate: {done.returncode} {said}; a claim after it: {claimed}"
    )


#: What the database owner's yoyo look-alikes run: run by a superuser, it makes the owner one, and
#: counts the run in a sequence (which no rollback undoes: a superuser's code has ways out of a
#: transaction that fails after it, COPY TO PROGRAM among them).
ESCALATE = """
CREATE SEQUENCE public.yoyo_ran_as_superuser;
CREATE FUNCTION public.yoyo_escalate() RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        PERFORM pg_catalog.nextval('public.yoyo_ran_as_superuser');
        EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', {role});
    END IF;
END $f$;
CREATE FUNCTION public.yoyo_escalate_row() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.yoyo_escalate();
    RETURN NEW;
END $f$"""
#: One of yoyo's tables, made by the database's owner as yoyo makes it, with its code in it: a
#: trigger on the tables yoyo and idem write (its version's row, its lock's), and for the table of
#: applied migrations a view over a function (yoyo reads it, where no version table exists yet, to
#: upgrade an older yoyo's tables).
YOYO_PLANTS = {
    "_yoyo_version": (
        'CREATE TABLE public."_yoyo_version" ("version" INT NOT NULL PRIMARY KEY, "installed_at_utc" TIMESTAMP);'
        ' CREATE TRIGGER t BEFORE INSERT ON public."_yoyo_version"'
        " FOR EACH ROW EXECUTE FUNCTION public.yoyo_escalate_row()"
    ),
    "yoyo_lock": (
        'CREATE TABLE public."yoyo_lock" ("locked" INT DEFAULT 1, "ctime" TIMESTAMP, "pid" INT NOT NULL,'
        ' PRIMARY KEY ("locked"));'
        ' CREATE TRIGGER t BEFORE INSERT ON public."yoyo_lock" FOR EACH ROW EXECUTE FUNCTION public.yoyo_escalate_row()'
    ),
    "_yoyo_migration": (
        "CREATE FUNCTION public.yoyo_applied() RETURNS TABLE (id varchar, ctime timestamp) LANGUAGE plpgsql AS $f$"
        " BEGIN PERFORM public.yoyo_escalate(); RETURN; END $f$;"
        ' CREATE VIEW public."_yoyo_migration" AS SELECT a.id, a.ctime FROM public.yoyo_applied() a'
    ),
}


def _ran_as_superuser(owned: dict[str, str]) -> tuple[bool, bool]:
    """Whether ESCALATE ran as a superuser (its sequence moved), and whether the owner is one now."""
    with pinned(owned["url"]) as conn:
        row = conn.execute(
            "SELECT s.is_called, r.rolsuper FROM public.yoyo_ran_as_superuser s, pg_catalog.pg_roles r"
            " WHERE r.rolname = %s",
            (owned["role"],),
        ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


@INSTALLERS
@pytest.mark.parametrize("table", sorted(YOYO_PLANTS))
def test_a_yoyo_table_planted_while_the_first_install_waits_never_runs_as_the_superuser(
    owned: dict[str, str], install: Install, table: str
) -> None:
    """The guard judges routines and drops, not a new table: the database's owner makes one of
    yoyo's tables (its own, with a trigger, or a view over its function) in a transaction begun
    before idem's first install and commits it once the guard is, while the install waits for that
    transaction. The first preflight, before the guard, saw nothing; were yoyo's tables made,
    written or read before the second (CREATE TABLE IF NOT EXISTS keeps the owner's, the version's
    row is inserted there, yoyo's lock inserts its row, yoyo reads its applied migrations), the
    owner's code would run as the migrating superuser and make the owner one. Safe: the install
    refuses the table by name, before anything reads or writes it, and the owner stays what it
    was."""
    with _attacker_session(owned) as attacker:
        attacker.execute(sql.SQL(ESCALATE).format(role=sql.Literal(owned["role"])))
        attacker.execute(YOYO_PLANTS[table])  # held open across the guard's commit
        committer = _when_guard_committed(owned, attacker.commit)
        done = install(owned, 60)
        committer.join()
    said = done.stdout + done.stderr
    ran, superuser = _ran_as_superuser(owned)
    assert not ran and not superuser, f"the owner's {table} ran as the superuser: {done.returncode} {said}"
    assert done.returncode != 0 and f"public.{table} (owned by {owned['role']})" in said, said


@INSTALLERS
def test_a_plant_held_open_by_a_role_whose_activity_is_not_tracked_stops_the_first_install(
    owned: dict[str, str], install: Install
) -> None:
    """A DBA may keep a role's sessions out of pg_stat_activity (ALTER ROLE web SET
    track_activities = off: its statements may carry personal data; or the whole server's, for the
    small cost it saves): such a session shows no query, no state and no xact_start, whatever
    transaction it is in. The database's owner, so set up, holds the plant open across idem's first
    install: a wait that read when each transaction began would see none, go on, and let the owner
    commit it after (every claim 42725). Safe: the install waits for that transaction as for any
    other and fails naming its session, with nothing but the guard made."""
    with pinned(owned["url"]) as dba:
        dba.execute(sql.SQL("ALTER ROLE {} SET track_activities = off").format(sql.Identifier(owned["role"])))
    with _attacker_session(owned) as attacker:
        tracked = attacker.execute("SELECT pg_catalog.current_setting('track_activities')").fetchone()
        assert tracked == ("off",)
        attacker.execute(PLANT)  # held open across the install
        _stops_the_install_naming_it(owned, attacker, owned["role"], install)


def _hangs(install: Callable[[], subprocess.CompletedProcess[str]], release: Callable[[], None]) -> tuple[bool, str]:
    """Whether ``install`` still ran 60 s after it began (then ``release`` lets it go on), and what it said."""
    result: list[subprocess.CompletedProcess[str]] = []
    installer = threading.Thread(target=lambda: result.append(install()))
    installer.start()
    installer.join(60)
    hung = installer.is_alive()
    release()
    installer.join()
    return hung, result[0].stdout + result[0].stderr if result else "no result"


@INSTALLERS
def test_a_schema_idem_guard_held_uncommitted_never_hangs_the_install_past_its_timeout(
    owned: dict[str, str], install: Install
) -> None:
    """The database's owner may create schemas: it begins making idem_guard, the schema of idem's
    DDL guard, before idem's first install, and holds it uncommitted. The guard's CREATE SCHEMA IF
    NOT EXISTS waits for that transaction to end (it may commit, and the name be taken), and
    nothing bounded that wait. Safe: the install, bounded by its --wait-timeout, fails after it
    saying that nothing was changed (its guard's transaction is what waited)."""
    with _attacker_session(owned) as attacker:
        attacker.execute("CREATE SCHEMA idem_guard")  # held open
        hung, said = _hangs(lambda: install(owned, 2), attacker.rollback)
    assert not hung, f"the install still waited after 60 s (its --wait-timeout: 2 s): {said}"
    assert "lock timeout" in said, said
    assert _only_the_guard(owned) == {"store": None, "idem_claim": 0, "yoyo": None, "guard triggers": 0}


def _guard_wait_running(owned: dict[str, str], *, polling: bool = False) -> bool:
    """Whether another session runs guard_wait.sql (psql sends it from its DO; idem migrate with its
    comment first, and pg_stat_activity keeps a query's first kilobyte); ``polling``: and is in its
    loop's pg_sleep, so it has taken its list of the transactions it waits for."""
    from idem_shim.schema.files import tool_sql

    with pinned(owned["url"]) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity a WHERE a.datname = pg_catalog.current_database()"
            " AND a.state = 'active' AND a.pid <> pg_catalog.pg_backend_pid()"
            " AND (pg_catalog.strpos(a.query, '$idem_guard_wait$') > 0 OR pg_catalog.starts_with(a.query, %s))"
            " AND (NOT %s OR a.wait_event = 'PgSleep')",
            (tool_sql("guard_wait.sql")[:200], polling),
        ).fetchone()
    return bool(row and row[0])


@INSTALLERS
def test_a_yoyo_table_held_uncommitted_after_the_guard_never_hangs_the_install_past_its_timeout(
    owned: dict[str, str], install: Install
) -> None:
    """The wait covers the transactions begun before the guard; one begun after it is judged by
    the guard, which judges no new table. The database's owner holds a transaction open across the
    guard's commit so that the install waits, begins making yoyo_lock in another session once the
    wait runs, and then ends the first: the install's CREATE TABLE IF NOT EXISTS yoyo_lock waits
    for the second to end, and nothing bounded that wait. Safe: the install, bounded by its
    --wait-timeout, fails after it saying that only the guard was changed."""
    with _attacker_session(owned) as holder, _attacker_session(owned) as maker:
        holder.execute("SELECT 1")  # begun before the guard: the install waits for it

        def make_then_release_the_wait() -> None:
            # once the wait polls, it has taken its list of transactions
            if _wait_for(lambda: _guard_wait_running(owned, polling=True), 60):
                maker.execute('CREATE TABLE public."yoyo_lock" (x integer)')  # held open
            holder.rollback()

        def run() -> subprocess.CompletedProcess[str]:
            thread = threading.Thread(target=make_then_release_the_wait)
            thread.start()
            try:
                return install(owned, 5)
            finally:
                thread.join()

        hung, said = _hangs(run, maker.rollback)
    assert not hung, f"the install still waited after 60 s (its --wait-timeout: 5 s): {said}"
    assert "lock timeout" in said and "nothing was changed" not in said, said


@INSTALLERS
def test_idems_tables_locked_by_the_database_owners_stalled_drop_never_hang_an_upgrade_past_its_timeout(
    owned: dict[str, str], install: Install
) -> None:
    """The owner of schema public may drop it with all it holds: its DROP SCHEMA public CASCADE
    takes an ACCESS EXCLUSIVE lock on each object there, idem's tables among them, and the guard
    refuses it only once all are taken. The database's owner makes it wait for a lock on a table of
    its own that another of its sessions holds, so it holds idem's tables for as long as it likes;
    an upgrade then reads yoyo's table of applied migrations, which it locks. Safe: the upgrade,
    bounded by its --wait-timeout, fails after it with a lock timeout, nothing changed."""
    first = _by_migrate(owned, 60)
    assert first.returncode == 0, first.stdout + first.stderr
    with pinned(owned["attacker_url"]) as conn:
        conn.execute("CREATE TABLE public.av_last (x integer)")  # made after idem's: locked after them
    with _attacker_session(owned) as holder, pinned(owned["attacker_url"]) as dropper:
        holder.execute("LOCK TABLE public.av_last IN ACCESS SHARE MODE")
        dropped: list[str] = []

        def drop() -> None:
            try:
                dropper.execute("DROP SCHEMA public CASCADE")
                dropped.append("dropped")
            except psycopg.Error as exc:
                dropped.append(f"{exc.sqlstate}: {exc.diag.message_primary}")

        dropping = threading.Thread(target=drop)
        dropping.start()
        try:

            def holds_idems_tables() -> bool:
                with pinned(owned["url"]) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_catalog.pg_locks l WHERE l.pid = %s AND l.granted"
                        " AND l.mode = 'AccessExclusiveLock'"
                        " AND l.relation IN ('public._yoyo_migration'::regclass, 'public.idempotency_keys'::regclass)",
                        (dropper.info.backend_pid,),
                    ).fetchone()
                return bool(row and row[0] == 2)

            assert _wait_for(holds_idems_tables, 30), f"the owner's DROP never locked idem's tables: {dropped}"
            hung, said = _hangs(lambda: install(owned, 2), holder.rollback)
        finally:
            holder.rollback()
            dropping.join()
    assert dropped and dropped[0].startswith("42501: idem_ddl_guard: DROP SCHEMA refused"), dropped
    assert not hung, f"the upgrade still waited after 60 s (its --wait-timeout: 2 s): {said}"
    assert "lock timeout" in said, said


@INSTALLERS
def test_the_database_owners_statement_timeout_never_cuts_the_wait_short(
    owned: dict[str, str], install: Install
) -> None:
    """The database's owner may set its database's statement_timeout (ALTER DATABASE … SET), which
    every session there starts with, the migrating superuser's too: the wait, one statement, was
    cancelled when it ran out, and idem migrate said that nothing was changed, its guard committed.
    Safe: the wait runs to its own --wait-timeout, then fails naming the transaction it waited for,
    saying that nothing else than the guard was changed."""
    with pinned(owned["attacker_url"]) as conn:
        # Below the install's 2 s wait, above what its other statements take on a loaded machine
        # (500 ms cut the preflight's catalog query short under CI's load: a loud refusal, no hole).
        conn.execute(sql.SQL("ALTER DATABASE {} SET statement_timeout = '1500ms'").format(sql.Identifier(owned["db"])))
    with _attacker_session(owned) as attacker:
        attacker.execute("SELECT 1")  # its transaction begins, and stays open
        _stops_the_install_naming_it(owned, attacker, owned["role"], install)


def test_a_wait_ended_by_the_server_never_says_nothing_was_changed(owned: dict[str, str]) -> None:
    """idem migrate's session ends during its wait (a DBA's pg_terminate_backend, a restart), once
    the guard is committed: an error that is not the wait's own refusal said that nothing was
    changed. Safe: it says that nothing but the guard was."""
    with _attacker_session(owned) as attacker:
        attacker.execute("SELECT 1")  # the install waits for it

        def terminate() -> None:
            if _wait_for(lambda: _guard_wait_running(owned), 60):
                with pinned(owned["url"]) as dba:
                    dba.execute(
                        "SELECT pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a"
                        " WHERE a.datname = pg_catalog.current_database() AND a.state = 'active'"
                        " AND a.wait_event = 'PgSleep' AND a.pid <> pg_catalog.pg_backend_pid()"
                    )

        terminator = threading.Thread(target=terminate)
        terminator.start()
        done = _by_migrate(owned, 30)
        terminator.join()
        attacker.rollback()
    said = done.stdout + done.stderr
    assert done.returncode != 0 and _only_the_guard(owned)["guard triggers"] == 4, said
    assert "nothing was changed" not in said and "guard" in said, said


@INSTALLERS
def test_a_pgcrypto_the_database_owner_makes_while_the_install_runs_is_never_adopted(
    owned: dict[str, str], install: Install
) -> None:
    """The install's preflight refuses a pgcrypto the database's owner made (the extension's owner
    may drop it, and then plant public.pgp_sym_encrypt & co., which idem's definers call as the
    store's owner: the guard refuses a routine under pgcrypto's names only while pgcrypto holds
    them); migration 0004 makes pgcrypto where none exists, and adopts one that does. The owner
    holds the install up: its own host table users, which the user scope's foreign key locks, is
    locked by a transaction of its own begun once the wait runs (the wait does not cover it), and
    while the install waits there the owner creates pgcrypto (a trusted extension) and lets the
    lock go. Since SQL API 15 that key is made by migration 0017, after 0004: the install's own
    pgcrypto exists by then, and the owner's CREATE EXTENSION waits for the install (refused by
    its lock_timeout). Safe either way: the install refuses that pgcrypto by name, or it is not
    the owner's after an install that exited 0."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute("CREATE TABLE public.users (id integer PRIMARY KEY)")  # the host's own
    events: list[str] = []
    with (
        _attacker_session(owned) as holder,
        _attacker_session(owned) as locker,
        pinned(owned["attacker_url"]) as maker,
    ):
        holder.execute("SELECT 1")  # begun before the guard: the install waits for it

        def install_waits_for_users() -> bool:
            with pinned(owned["url"]) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_catalog.pg_locks l WHERE NOT l.granted"
                    " AND l.relation = pg_catalog.to_regclass('public.users')"
                ).fetchone()
            return bool(row and row[0])

        def stall_then_plant() -> None:
            # once the wait polls, it has taken its list of transactions
            if not _wait_for(lambda: _guard_wait_running(owned, polling=True), 60):
                events.append("the wait never ran")
                holder.rollback()
                return
            locker.execute("LOCK TABLE public.users IN ACCESS EXCLUSIVE MODE")
            holder.rollback()
            if _wait_for(install_waits_for_users, 30):
                maker.execute("SET lock_timeout = '2s'")
                try:
                    maker.execute("CREATE EXTENSION pgcrypto WITH SCHEMA public")
                    events.append("pgcrypto made")
                except psycopg.errors.LockNotAvailable:  # the install's own, not yet committed
                    events.append("pgcrypto waited for the install's")
            locker.rollback()

        thread = threading.Thread(target=stall_then_plant)
        thread.start()
        done = install(owned, 20)
        thread.join()
    said = done.stdout + done.stderr
    with pinned(owned["url"]) as conn:
        row = conn.execute(
            "SELECT pg_catalog.pg_get_userbyid(e.extowner) FROM pg_catalog.pg_extension e WHERE e.extname = 'pgcrypto'"
        ).fetchone()
    owner = row[0] if row else None
    assert events in (["pgcrypto made"], ["pgcrypto waited for the install's"]), f"{events}: {done.returncode} {said}"
    if done.returncode == 0:
        assert owner != owned["role"], f"the install exited 0 with the database owner's pgcrypto: {said}"
    else:
        assert f"extension pgcrypto (owned by {owned['role']})" in said, said
