"""The reference app (Raptor) on the local Citus cluster (contract §8): gunicorn workers
talk to the coordinator, Raptor's business tables are distributed by user and colocated with the
store (examples/raptor/schema_citus.sql), and the e2e race and replay of test_race.py run
unchanged over real processes and connections.

- The race: rounds of 16 simultaneous POSTs of one key: one fill per key, one business audit row,
  cash moved once per round, no 5xx.
- The replay: the same key again answers the first response (contract §4: a JSON object as stored,
  flagged idempotency_replayed), with the same status and Content-Type, and fills nothing; every
  further replay is that stored answer byte for byte.
- No two-phase commit: pg_dist_transaction (the coordinator's record of every 2PC) gains no row
  over the whole race, while one admin transaction writing two users on different workers does
  gain one (the counter counts). The maintenance daemon's 2PC recovery, which deletes those rows,
  is switched off on the coordinator for the test and restored after it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.python.e2e.e2e_harness import PYTHON, ROOT, Database, StartServer, new_key, statements
from tests.python.e2e.test_race import ORDER, race_rounds

import testdb  # isort: skip  (scripts/testdb.py, on sys.path through tests.support)

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)

SCHEMA_CITUS = ROOT / "examples" / "raptor" / "schema_citus.sql"


@dataclass
class CitusCoordinator:
    """What the harness's Database needs of a cluster: URLs and the port, here the coordinator's."""

    base_url: str

    @property
    def port(self) -> int:
        return urlsplit(self.base_url).port or 5432

    def url(self, dbname: str, user: str = "postgres") -> str:
        parts = urlsplit(testdb.url_for(self.base_url, dbname))
        return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def citus_db() -> Iterator[Database]:
    admin = os.environ["DATABASE_URL"]
    name = f"raptor_citus_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin, name)
    try:
        idem = Path(PYTHON).with_name("idem")
        subprocess.run([str(idem), "migrate", "-q", "--database-url", url], cwd=ROOT, check=True, capture_output=True)
        subprocess.run(
            [PYTHON, "-m", "examples.raptor", "init-db", "--database-url", url],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        with psycopg.connect(url) as conn:  # one transaction
            for stmt in statements(SCHEMA_CITUS):
                conn.execute(stmt)  # the file's own statements, no value from outside
        yield Database(CitusCoordinator(admin), name)  # type: ignore[arg-type]
    finally:
        testdb.drop(admin, name)


@pytest.fixture
def no_2pc_recovery() -> Iterator[None]:
    """The coordinator keeps every pg_dist_transaction row while the test counts them."""
    admin = os.environ["DATABASE_URL"]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET citus.recover_2pc_interval = -1")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET citus.recover_2pc_interval")
            conn.execute("SELECT pg_reload_conf()")


def two_phase_commits(db: Database) -> int:
    return int(db.scalar("SELECT count(*) FROM pg_dist_transaction"))


def worker_of(db: Database, user_id: int) -> str:
    return str(
        db.scalar(
            "SELECT nodename || ':' || nodeport FROM pg_dist_shard_placement"
            " WHERE shardid = get_shard_id_for_distribution_column('raptor.paper_orders', %s)",
            (user_id,),
        )
    )


def test_raptor_on_citus_races_and_replays_with_one_fill_and_no_two_phase_commit(
    citus_db: Database, start_server: StartServer, no_2pc_recovery: None
) -> None:
    db = citus_db
    layout = dict(db.query("SELECT logicalrelid::text, colocationid FROM pg_dist_partition WHERE partmethod = 'h'"))
    for table in ("raptor.accounts", "raptor.positions", "raptor.paper_orders", "public.audit_log"):
        assert layout[table.removeprefix("public.")] == layout["idempotency_keys"], f"{table} colocated with the store"

    server = start_server(db.app_url, workers=4)
    user = db.seed_user()
    before = two_phase_commits(db)
    tally = race_rounds(server, db, user, rounds=20)
    assert tally["executed"] == 20
    assert tally["replayed"] + tally["in_flight"] > 0, tally  # duplicates met the layer

    # the replay: the same key, the same response, byte for byte
    key = new_key()
    first = server.order(user, key, ORDER)
    again = server.order(user, key, ORDER)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    # Contract §4: a JSON object comes back as stored, flagged "idempotency_replayed": true (a body
    # that is no JSON object would come back byte for byte); the status and Content-Type too
    assert again.json() == {**first.json(), "idempotency_replayed": True}, (first.content, again.content)
    assert again.headers["Content-Type"] == first.headers["Content-Type"]
    third = server.order(user, key, ORDER)
    assert third.content == again.content, "every replay is the stored answer, byte for byte"
    assert len(db.orders_for_key(key)) == 1
    assert two_phase_commits(db) == before, "every order's writes and its completion committed on one worker"

    # the counter does count: one transaction writing two users on different workers is a 2PC
    other = next(
        u for u in (db.seed_user() for _ in range(16)) if worker_of(db, u.user_id) != worker_of(db, user.user_id)
    )
    counted = two_phase_commits(db)
    with psycopg.connect(db.admin_url) as conn:
        conn.execute(
            "INSERT INTO public.audit_log (user_id, action, context) VALUES (%s, 'probe', '{}'), (%s, 'probe', '{}')",
            (user.user_id, other.user_id),
        )
    assert two_phase_commits(db) > counted, "a transaction across two workers is recorded in pg_dist_transaction"
    assert "Traceback" not in server.log()
