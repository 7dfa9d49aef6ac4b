"""The store on a Citus formation under pg_auto_failover, under load (contract §8 and §9): a worker
joins and the store is rebalanced onto it, a worker's primary dies, its standby is lost, the
coordinator is cut off from a worker, a worker's primary dies while one of its shards moves.

One formation for the module (tests/python/e2e/citus_ha_harness.py: a monitor, a coordinator, two
worker groups of a primary and its synchronous standby; `make test-chaos-citus` hands the same one
to the chaos soak afterwards), Raptor under gunicorn on the coordinator with its tables colocated
with the store, the broker simulator, retrying clients on the paper and live routes, and after
each run the soak's checkers over the run's own users (tests/python/chaos/soak_citus.py):
0 double executions, 0 lost acknowledged writes, 0 double fills, no 5xx but the documented 503,
and every request in flight while a shard moved answered. Each test starts from a whole formation.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.python.chaos.checker import INVARIANTS, history
from tests.python.chaos.soak_citus import CitusLoad, FormationFaults, MoveWatch, Verdict
from tests.python.e2e.citus_ha_harness import CITUS_LIB, DB, CitusFormation, prepare_raptor
from tests.python.e2e.e2e_harness import ROOT, Database
from tests.python.support import docrunner
from tests.python.support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CITUS_LIB.exists(), reason="Citus is not installed (make citus)"),
]

CLIENTS = 8
RESCHEDULE = "SELECT cron.alter_job(jobid, schedule := %s) FROM cron.job WHERE jobname = 'idem-cleanup:idem'"
#: When the nodes changed, for the cleanup's test (server time, seconds since the epoch).
EVENTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def formation() -> Iterator[CitusFormation]:
    f = CitusFormation()
    try:
        prepare_raptor(f)
        # the cleanup job every minute while the module runs (idem migrate scheduled it daily)
        f.cron(RESCHEDULE, ("* * * * *",))
        yield f
    finally:
        try:
            f.cron(RESCHEDULE, ("0 4 * * *",))
        finally:
            f.destroy()


@pytest.fixture
def db(formation: CitusFormation) -> Database:
    formation.wait_whole()
    return Database(formation, DB)  # type: ignore[arg-type]  # stands in for a Cluster


class Run:
    """The load of one test, its formation faults and the watch on its moves."""

    def __init__(self, formation: CitusFormation, db: Database, out: Path, seed: int) -> None:
        self.formation, self.db = formation, db
        self.load = CitusLoad(db, out, seed, CLIENTS)
        self.env = self.load.start(600)  # ended by stop() once the test's faults are done
        self.watch = MoveWatch(formation.url(DB), self.env.t0)
        self.log = (out / "faults.log").open("w")
        self.faults = FormationFaults(formation, self.env, self.watch, seed, self.log)
        self.verdict: Verdict | None = None

    def acknowledged(self, after: float = 0.0, before: float = float("inf"), users: set[int] | None = None) -> int:
        return sum(
            1
            for a in self.env.records.attempts
            if a.status is not None
            and 200 <= a.status < 300
            and after <= a.started < before
            and (users is None or a.user_id in users)
        )

    def users_on(self, group: int) -> set[int]:
        rows = self.db.query(
            "SELECT u FROM unnest(%s::int[]) u JOIN pg_dist_placement p"
            "  ON p.shardid = get_shard_id_for_distribution_column('public.idempotency_keys', u)"
            " WHERE p.groupid = %s",
            ([u.user_id for u in self.load.users], group),
        )
        return {int(r[0]) for r in rows}


@contextmanager
def under_load(formation: CitusFormation, db: Database, tmp_path: Path, seed: int) -> Iterator[Run]:
    run = Run(formation, db, tmp_path, seed)
    try:
        time.sleep(4.0)  # orders flowing before anything happens
        yield run
        time.sleep(4.0)  # and after
    finally:
        try:
            run.load.stop()
            run.verdict = run.load.judge()
        finally:
            run.load.close()
            run.log.close()
    report = run.verdict.report
    lines = [f"{v.invariant} ({INVARIANTS[v.invariant]}) {v.kind}: {v.key}: {v.detail}" for v in report.violations]
    details = "\n".join(history(k, run.env.records.attempts, run.verdict.snap) for k in report.keys[:5])
    assert run.verdict.violations == 0, "\n".join([*lines[:30], details, f"counters: {dict(report.counters)}"])
    assert run.verdict.live.counters["double fills"] == 0
    gunicorn = (tmp_path / "gunicorn.log").read_text()
    assert "Traceback" not in gunicorn, gunicorn[gunicorn.index("Traceback") - 2000 :][:6000]


def server_epoch(db: Database) -> float:
    return float(db.scalar("SELECT extract(epoch FROM now())"))


def worker_sequences(db: Database) -> list[str]:
    """Each worker's copy of idempotency_keys_id_seq: untouched while no key_id is made there."""
    rows = db.query(
        "SELECT result FROM run_command_on_workers("
        "$$SELECT last_value || ':' || is_called FROM public.idempotency_keys_id_seq$$) ORDER BY nodeport"
    )
    return [str(r[0]) for r in rows]


def test_a_node_whose_port_another_program_holds_is_refused_before_anything_is_created(
    formation: CitusFormation,
) -> None:
    free = next(g for g in (1, 2, 3) if g not in formation.groups())
    port = formation.node_port(f"worker{free}a")
    nodes = formation.nodes()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        out = formation.run("add-worker", str(free))
    assert out.returncode == 1, out.stderr
    assert f"port {port} for worker{free}a is in use by another program" in out.stderr, out.stderr
    assert formation.nodes() == nodes


def runbook(formation: CitusFormation, heading: str) -> list[docrunner.Result]:
    """The console blocks of one section of docs/operations.md, run as written on this formation
    (the docs test skips them on its single node, naming this module)."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    blocks = [b for b in docrunner.parse(docrunner.section(text, heading)) if b.kind == "console"]
    assert blocks, f"no console block under ## {heading}"
    env = docrunner.base_env(formation.url(DB))
    env.update({k: formation.env[k] for k in ("IDEM_HA_CITUS_DIR", "IDEM_HA_CITUS_PORT")})
    runner = docrunner.Runner(env)
    results = []
    for block in blocks:
        assert block.skipped and "test_citus_ha.py" in block.skipped, block.skipped
        block.skipped = None
        result = runner.run(block)
        assert result is not None
        results.append(result)
    return results


def assert_ran_as_written(results: list[docrunner.Result]) -> None:
    assert all(r.ok for r in results), docrunner.report("docs/operations.md", results)


def test_a_third_worker_joins_under_load_and_the_store_moves_onto_it_without_a_violation(
    formation: CitusFormation, db: Database, tmp_path: Path
) -> None:
    """docs/operations.md "10. Citus: add a worker", run as written while the load runs."""
    assert formation.groups() == [1, 2], formation.state()
    before = formation.shards_per_group()
    sequences = worker_sequences(db)
    with under_load(formation, db, tmp_path, seed=31) as run:
        joined = run.env.now()
        ran: list[docrunner.Result] = []
        with run.watch.moving("join and rebalance"):
            book = threading.Thread(target=lambda: ran.extend(runbook(formation, "10. Citus: add a worker")))
            book.start()
            # a second rebalance while the runbook's runs: refused in one line, nothing started
            wait_until(
                lambda: (
                    db.scalar("SELECT count(*) FROM pg_dist_background_job WHERE state = 'running'")
                    or not book.is_alive()
                ),
                600,
                0.2,
                what="the runbook's rebalance job running",
            )
            twice = formation.run("rebalance")
            book.join()
        EVENTS["joined"] = server_epoch(db)
        moved = run.env.now()
        assert sequences[:2] == worker_sequences(db)[:2], "a key_id was made on a worker"
    assert_ran_as_written(ran)
    assert twice.returncode == 1, (twice.stdout, twice.stderr)
    assert "a rebalance is already running (job" in twice.stderr and "nothing started" in twice.stderr, twice.stderr
    after = formation.shards_per_group()
    assert after.get(3, 0) > 0 and sum(after.values()) == sum(before.values()), (before, after)
    assert run.acknowledged(before=joined) > 0 and run.acknowledged(after=moved) > 0
    in_moves = run.watch.in_flight(run.env)
    unanswered = [a for a in in_moves if a.status is None]
    print(
        f"join: shards {before} -> {after}; {len(in_moves)} requests during the join and the rebalance,"
        f" {len(unanswered)} unanswered; {len(run.watch.claims)} claims seen waiting on a moving shard"
        f" (longest {max(run.watch.waits.values(), default=0):.2f} s); users now on the new worker"
        f" {sorted(run.users_on(3))}"
    )
    assert in_moves and not unanswered, [(a.key, a.started, a.error) for a in unanswered]
    # key_ids stay unique across the move, each carrying its scope
    n, distinct, scoped = db.query(
        "SELECT count(*), count(DISTINCT id), bool_and(id >> 31 = scope_user_id) FROM public.idempotency_keys"
        " WHERE scope_user_id = ANY(%s)",
        (run.load.user_ids,),
    )[0]
    assert n > 0 and n == distinct and scoped, (n, distinct, scoped)


def test_a_workers_primary_dies_under_load_and_its_standby_takes_over_without_a_violation(
    formation: CitusFormation, db: Database, tmp_path: Path
) -> None:
    """The primary's machine lost under load; then docs/operations.md "11. Citus: a worker failed",
    run as written: what failed, idem status, the lost node started again, the formation whole."""
    with under_load(formation, db, tmp_path, seed=32) as run:
        group = max(formation.groups(), key=lambda g: len(run.users_on(g)))
        victims = run.users_on(group)
        old = formation.primary(group)
        assert old is not None
        killed = run.env.now()
        formation.kill(old)
        new = formation.wait_promoted(group, other_than=old)
        promoted = run.env.now()
        EVENTS["promoted"] = server_epoch(db)
        ran = runbook(formation, "11. Citus: a worker failed")
        whole = run.env.now()
        assert formation.primary(group) == new and formation.standby(group) == old
    assert_ran_as_written(ran)
    assert victims, "no user of this run on the worker that died"
    assert run.acknowledged(before=killed, users=victims) > 0
    assert run.acknowledged(after=whole, users=victims) > 0, "the promoted worker serves the users of the dead one"
    print(
        f"failover: group {group}: {promoted - killed:.1f} s without a primary, whole again {whole - promoted:.1f} s"
        f" later; {run.verdict.report.counters['503'] if run.verdict else '?'} answers 503"
    )


def test_a_lost_standby_a_cut_from_the_coordinator_and_a_promotion_during_a_move_lose_nothing(
    formation: CitusFormation, db: Database, tmp_path: Path
) -> None:
    with under_load(formation, db, tmp_path, seed=33) as run:
        groups = formation.groups()
        run.faults.worker_standby_lost(groups[0])
        cut = run.env.now()
        run.faults.coordinator_worker_cut(groups[-1], seconds=4.0)
        healed = run.env.now()
        failed = run.faults.promotion_during_move()
        formation.wait_whole()
        status = idem_status(formation)
        again = formation.run("rebalance", timeout=900)
    assert run.faults.stalls and run.faults.stalls[0] < 30, run.faults.stalls
    assert run.acknowledged(after=healed) > 0 and run.acknowledged(before=cut) > 0
    print(f"move during a promotion: {failed}")
    assert lost_the_source(failed), failed
    assert again.returncode == 0, again.stderr  # the shards balance again (or already were)
    assert any(ln.startswith("store: distributed on Citus") for ln in status), status


#: How Citus words a move whose source was killed, by where the kill met it: the copy's open
#: connection cut, the next connection to the node refused, or the move's logical replication
#: subscription unable to reach its publisher (the source).
LOST_SOURCE = (
    "connection to the remote node",
    "server closed the connection unexpectedly",
    "could not connect to the publisher",
    "unexpected postmaster exit",
    "postmaster was shut down",
)


def lost_the_source(error: str) -> bool:
    """The move failed because its source died (a connection error, XX000, class 08, or 57P01:
    the source's postmaster exited under the move's connection)."""
    sqlstate = error.split(":", 1)[0]
    return (sqlstate in ("XX000", "57P01") or sqlstate.startswith("08")) and any(
        words in error for words in LOST_SOURCE
    )


def idem_status(formation: CitusFormation) -> list[str]:
    idem = Path(sys.executable).with_name("idem")
    out = subprocess.run(
        [str(idem), "status", "--database-url", formation.url(DB)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_cleanup_job_runs_once_for_the_store_after_the_join_and_the_promotion(
    formation: CitusFormation, db: Database
) -> None:
    """pg_cron lives on the coordinator; its one job per store runs the cleanup shard by shard,
    on whichever node is each shard's primary now, the new worker included."""
    assert {"joined", "promoted"} <= set(EVENTS), "runs after the join and failover tests"
    users = list(range(900, 906))
    db.query("INSERT INTO public.users (id) SELECT unnest(%s::int[]) ON CONFLICT DO NOTHING", (users,))
    groups = {
        int(r[0])
        for r in db.query(
            "SELECT DISTINCT p.groupid FROM unnest(%s::int[]) u JOIN pg_dist_placement p"
            "  ON p.shardid = get_shard_id_for_distribution_column('public.idempotency_keys', u)",
            (users,),
        )
    }
    for u in users:  # a completed key of each user, expired two days ago
        db.query(
            "SELECT idem_complete(c.key_id, 201, '{}') FROM idem_claim(p_key => gen_random_uuid()::text,"
            " p_user_id => %s, p_endpoint => 'POST /cleanup-probe', p_request => '{}',"
            " p_now => now() - interval '2 days') c",
            (u,),
        )
    since = server_epoch(db)

    def expired_left() -> int:
        return int(
            db.scalar("SELECT count(*) FROM public.idempotency_keys WHERE scope_endpoint = 'POST /cleanup-probe'")
        )

    assert expired_left() == len(users)
    job = "idem-cleanup:idem"
    assert formation.cron("SELECT count(*) FROM cron.job WHERE jobname = %s", (job,)) == [(1,)]

    def ran() -> int:
        return int(
            formation.cron(
                "SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)"
                " WHERE j.jobname = %s AND d.status = 'succeeded' AND d.start_time > to_timestamp(%s)",
                (job, since),
            )[0][0]
        )

    wait_until(ran, 130, 1.0, what=f"a run of {job} after the join and the promotion")
    assert expired_left() == 0, f"the cleanup deleted the expired keys on every worker ({len(groups)} groups)"
    assert len(groups) >= 2
    status = idem_status(formation)
    assert any("shards on 3 workers" in ln for ln in status), status
    assert any(ln.startswith(f"pg_cron: job '{job}'") for ln in status), status
    assert any("succeeded" in ln for ln in status), status


def test_a_worker_group_the_formation_cannot_take_is_refused_with_the_reason_and_nothing_changes(
    formation: CitusFormation,
) -> None:
    nodes = formation.nodes()
    taken = formation.run("add-worker", "1")
    assert taken.returncode == 1 and "worker group 1 is already in the formation" in taken.stderr, taken.stderr
    beyond = formation.run("add-worker", "4")
    assert beyond.returncode == 1 and "room for worker groups 1 to 3" in beyond.stderr, beyond.stderr
    dropped = formation.run("drop-worker", "7")
    assert dropped.returncode == 1 and "worker group 7 is not in the formation" in dropped.stderr, dropped.stderr
    assert formation.nodes() == nodes, "a refusal changes nothing"
