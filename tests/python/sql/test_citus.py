"""
The store on Citus (contract §8), on the local cluster of scripts/citus.sh: a coordinator
and two workers (`make test-citus` sets DATABASE_URL to the coordinator and IDEM_CITUS=1).

- `idem migrate` distributes idempotency_keys and idempotency_events by scope_user_id, colocated
  with users (and audit_log by user_id); `idem status` says so.
- Each call a request makes touches one shard, and the handler's writes plus the completion
  commit on one worker without two-phase commit when the business table is colocated (seen in
  citus.log_remote_commands: the shards named, the workers reached, no PREPARE TRANSACTION);
  a handler that writes another user's shard on the other worker does pay 2PC.
- Races with real connections: 16 users on shards of both workers, two claimants each; 32
  service calls (no user: the reserved scope 0) on one key.
- Cleanup shard by shard in bounded batches; erasure and export on one shard.
- The refusals, each one line naming the statement to run, with nothing changed: a host users
  table that is local or distributed by another column, a worker without the extension, a
  worker that does not answer.
- A single-node store is converted in place by the same `idem migrate`.
- A shard moved (citus_move_shard_placement) under claims: no call fails, no key runs twice.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from idem_shim.schema.apply import take_lock
from tests.python.support import earlier
from tests.python.support.owned import attacker_session
from tests.python.support.roles import login_role
from tests.python.support.sqlapi import claim, complete, connect, new_key, one

import testdb  # isort: skip  (scripts/testdb.py, on sys.path through tests.support)

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)

ROOT = Path(__file__).resolve().parents[3]
SHARD = re.compile(r"\b(idempotency_keys|idempotency_events|audit_log|orders)_(\d+)\b")


def idem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([testdb.idem_command(), *args], capture_output=True, text=True, timeout=120)


def worker_url(url: str, n: int) -> str:
    """The same database on worker n (1 or 2): the ports after the coordinator's."""
    parts = urlsplit(url)
    port = (parts.port or 5432) + n
    return urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{port}"))


class RemoteLog:
    """What the coordinator sends to the workers while it is on (citus.log_remote_commands)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.lines: list[tuple[str, str]] = []
        conn.add_notice_handler(self._notice)
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")

    def _notice(self, diag: Any) -> None:
        msg = str(diag.message_primary or "")
        if msg.startswith("issuing "):
            self.lines.append((msg, str(diag.message_detail or "")))

    def take(self) -> list[tuple[str, str]]:
        got, self.lines = self.lines, []
        return got

    @staticmethod
    def workers(lines: list[tuple[str, str]]) -> set[str]:
        return {m.group(1) for _, d in lines if (m := re.search(r"on server \S+@(\S+) ", d))}

    @staticmethod
    def shards(lines: list[tuple[str, str]], table: str) -> set[str]:
        return {m.group(2) for c, _ in lines for m in SHARD.finditer(c) if m.group(1) == table}

    @staticmethod
    def two_phase(lines: list[tuple[str, str]]) -> bool:
        return any("PREPARE TRANSACTION" in c for c, _ in lines)


def add_users(url: str, ids: range | list[int]) -> None:
    with connect(url) as conn:
        conn.execute("INSERT INTO users (id) SELECT unnest(%s::int[]) ON CONFLICT DO NOTHING", (list(ids),))


def node_of(conn: psycopg.Connection[Any], user_id: int) -> str:
    row = conn.execute(
        "SELECT nodename || ':' || nodeport AS node FROM pg_dist_shard_placement"
        " WHERE shardid = get_shard_id_for_distribution_column('idempotency_keys', %s)",
        (user_id,),
    ).fetchone()
    assert row is not None
    return str(row["node"])


@pytest.fixture
def orders_url(fresh_admin_url: str) -> str:
    """A business table of the host, colocated with the store (distributed by its user)."""
    with connect(fresh_admin_url) as conn:
        conn.execute(
            "CREATE TABLE orders (user_id integer NOT NULL, key_id bigint NOT NULL, qty integer,"
            " PRIMARY KEY (user_id, key_id))"
        )
        conn.execute("SELECT create_distributed_table('orders', 'user_id', colocate_with => 'users')")
    add_users(fresh_admin_url, range(1, 41))
    return fresh_admin_url


@pytest.fixture
def bare_db(admin_url: str) -> Iterator[str]:
    """A database with the extension on every node and the workers registered, no store."""
    name = f"idem_c_{os.urandom(5).hex()}"
    yield testdb.create(admin_url, name)
    testdb.drop(admin_url, name)


# -- the layout ---------------------------------------------------------------------------------


def test_migrate_distributes_the_store_by_user_colocated_with_users(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        rows = conn.execute(
            "SELECT logicalrelid::text AS t, column_to_column_name(logicalrelid, partkey) AS col,"
            "       colocationid = (SELECT colocationid FROM pg_dist_partition"
            "                        WHERE logicalrelid = 'users'::regclass) AS with_users"
            "  FROM pg_dist_partition ORDER BY 1"
        ).fetchall()
    assert rows == [
        {"t": "audit_log", "col": "user_id", "with_users": True},
        # the claim-token secret, a copy on every node: the delegated completion reads it there
        {"t": "idem_secret", "col": None, "with_users": False},
        {"t": "idempotency_events", "col": "scope_user_id", "with_users": True},
        {"t": "idempotency_keys", "col": "scope_user_id", "with_users": True},
        {"t": "users", "col": "id", "with_users": True},
    ]
    status = idem("status", "--database-url", fresh_admin_url)
    assert "store: distributed on Citus 13." in status.stdout, status.stdout
    assert "idempotency_keys by scope_user_id" in status.stdout


def test_migrate_again_changes_nothing(fresh_admin_url: str) -> None:
    done = idem("migrate", "--database-url", fresh_admin_url)
    assert done.returncode == 0, done.stderr
    assert "0 migration(s) applied" in done.stdout


# -- one shard per call ---------------------------------------------------------------------------


def test_each_call_touches_one_shard_and_the_handler_commits_on_one_worker(orders_url: str) -> None:
    with connect(orders_url) as conn:
        log = RemoteLog(conn)
        for user in (1, 2, 3, 4):
            key = new_key()
            got = claim(conn, key, user_id=user)
            lines = log.take()
            assert got["outcome"] == "claimed"
            assert len(RemoteLog.shards(lines, "idempotency_keys")) == 1, lines
            assert len(RemoteLog.workers(lines)) == 1

            # the handler: a business write and the completion, one transaction
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (%s, %s, 1)", (user, got["key_id"]))
                complete(conn, got["key_id"])
            lines = log.take()
            assert len(RemoteLog.shards(lines, "idempotency_keys")) == 1, lines
            assert len(RemoteLog.workers(lines)) == 1, lines
            assert not RemoteLog.two_phase(lines), lines

            replay = claim(conn, key, user_id=user)
            lines = log.take()
            assert replay["outcome"] == "replay"
            assert len(RemoteLog.workers(lines)) == 1  # the key and its audit row: one worker
            assert not RemoteLog.two_phase(lines), lines

        service = claim(conn, new_key(), user_id=None, endpoint="svc.rebalance")
        conn.execute("SELECT idem_heartbeat(%s)", (service["key_id"],))
        conn.execute("SELECT idem_fail(%s, 503)", (service["key_id"],))
        lines = log.take()
        assert len(RemoteLog.shards(lines, "idempotency_keys")) == 1, lines
        assert not RemoteLog.two_phase(lines)


def test_as_the_app_role_the_completion_is_delegated_to_the_claims_worker(orders_url: str) -> None:
    """The handler's writes are the app's role's, idem_complete is SECURITY DEFINER: in one
    transaction Citus refuses to reach the app's placements as the owner, so the plain call
    fails; idem_complete_in_scope (sql/citus/021, what the shim calls there) is sent to the
    worker over the app's own connection and completes there, one worker, no 2PC."""
    with connect(orders_url) as admin:
        admin.execute("GRANT INSERT ON orders TO idem_app")
    with login_role(orders_url, "idem_app") as (_, app_url), connect(app_url) as conn:  # Citus logs in as it
        got = claim(conn, new_key(), user_id=3)
        key_id, token = got["key_id"], got["claim_token"]
        with pytest.raises(psycopg.Error, match="modified in this transaction by a different user"):
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (3, %s, 1)", (key_id,))
                conn.execute("SELECT idem_complete(%s, 201, '{}', p_claim_token => %s)", (key_id, token))
        with pytest.raises(psycopg.Error, match="p_scope 4 is not the scope of key_id") as wrong:
            conn.execute("SELECT idem_complete_in_scope(4, %s, 201, '{}', p_claim_token => %s)", (key_id, token))
        assert wrong.value.sqlstate == "IDM00"
        log = RemoteLog(conn)
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (3, %s, 1)", (key_id,))
            conn.execute(
                "SELECT idem_complete_in_scope(%s, %s, 201, '{\"ok\": 1}', p_claim_token => %s)",
                (key_id >> 31, key_id, token),
            )
        lines = log.take()
    assert len(RemoteLog.workers(lines)) == 1, lines
    assert not RemoteLog.two_phase(lines), "the handler's write and the completion commit on one worker"
    assert any("idem_complete_in_scope" in c for c, _ in lines), "the call itself went to the worker"
    with connect(orders_url) as admin:
        row = one(admin, "SELECT status, response_body FROM idempotency_keys WHERE id = %s", (key_id,))
        assert row == {"status": "completed", "response_body": {"ok": 1}}
        assert one(admin, "SELECT count(*) AS n FROM orders WHERE key_id = %s", (key_id,)) == {"n": 1}


def test_a_handler_that_writes_another_workers_shard_pays_two_phase_commit(orders_url: str) -> None:
    with connect(orders_url) as conn:
        nodes = {u: node_of(conn, u) for u in range(1, 41)}
        mine = 1
        other = next(u for u, n in nodes.items() if n != nodes[mine])
        log = RemoteLog(conn)
        got = claim(conn, new_key(), user_id=mine)
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (%s, %s, 1)", (other, got["key_id"]))
            complete(conn, got["key_id"])
        lines = log.take()
    assert len(RemoteLog.workers(lines)) == 2
    assert RemoteLog.two_phase(lines), "a transaction over two workers commits in two phases"


def test_erase_and_export_touch_one_shard(orders_url: str) -> None:
    with connect(orders_url) as conn:
        for _ in range(3):
            complete(conn, claim(conn, new_key(), user_id=7)["key_id"])
        log = RemoteLog(conn)
        exported = conn.execute("SELECT * FROM public.idem_export_user(p_user_id => 7)").fetchall()
        assert len(exported) == 3
        lines = log.take()
        assert len(RemoteLog.shards(lines, "idempotency_keys")) == 1, lines
        erased = conn.execute("SELECT idem_erase_user(7) AS n").fetchone()
        assert erased == {"n": 3}
        lines = log.take()
        assert len(RemoteLog.shards(lines, "idempotency_keys")) == 1, lines
        assert len(RemoteLog.workers(lines)) == 1, lines


# -- races ----------------------------------------------------------------------------------------


def race(url: str, actions: list[Any]) -> list[Any]:
    conns = [connect(url) for _ in actions]
    barrier = threading.Barrier(len(actions))

    def run(pair: tuple[psycopg.Connection[Any], Any]) -> Any:
        barrier.wait()
        return pair[1](pair[0])

    try:
        with ThreadPoolExecutor(max_workers=len(actions)) as pool:
            return list(pool.map(run, zip(conns, actions, strict=True)))
    finally:
        for c in conns:
            c.close()


def test_16_users_on_shards_of_both_workers_race_two_claimants_each(orders_url: str) -> None:
    users = list(range(1, 17))
    with connect(orders_url) as conn:
        assert len({node_of(conn, u) for u in users}) == 2, "the 16 users must span both workers"
        shards = conn.execute(
            "SELECT count(DISTINCT get_shard_id_for_distribution_column('idempotency_keys', u)) AS n"
            "  FROM unnest(%s::int[]) u",
            (users,),
        ).fetchone()
        total = conn.execute(
            "SELECT count(*) AS n FROM pg_dist_shard WHERE logicalrelid = 'idempotency_keys'::regclass"
        ).fetchone()
        assert shards is not None and total is not None and shards["n"] >= min(8, total["n"] // 2), (shards, total)
    key = new_key()  # one key string: each user's scope makes it a key of its own
    results = race(orders_url, [lambda c, u=u: (u, claim(c, key, user_id=u)) for u in users for _ in (0, 1)])
    per_user = Counter((u, r["outcome"]) for u, r in results)
    assert per_user == Counter({(u, o): 1 for u in users for o in ("claimed", "in_flight")})
    with connect(orders_url) as conn:
        for u, r in results:
            if r["outcome"] == "claimed":
                complete(conn, r["key_id"], body={"user": u})
        for u in users:
            replay = claim(conn, key, user_id=u)
            assert (replay["outcome"], replay["response_body"]) == ("replay", {"user": u})


def test_32_service_calls_without_a_user_dedupe_in_the_reserved_scope(fresh_admin_url: str) -> None:
    key = new_key()
    results = race(fresh_admin_url, [lambda c: claim(c, key, endpoint="svc.rebalance")] * 32)
    assert Counter(r["outcome"] for r in results) == {"claimed": 1, "in_flight": 31}
    with connect(fresh_admin_url) as conn:
        rows = conn.execute("SELECT scope_user_id, id FROM idempotency_keys WHERE idem_key = %s", (key,)).fetchall()
    assert [r["scope_user_id"] for r in rows] == [0]
    assert rows[0]["id"] == next(r["key_id"] for r in results if r["outcome"] == "claimed")


# -- cleanup --------------------------------------------------------------------------------------


def test_cleanup_deletes_expired_rows_on_every_shard_in_bounded_batches(orders_url: str) -> None:
    users = list(range(1, 25))
    with connect(orders_url) as conn:
        for u in users:
            got = claim(conn, new_key(), user_id=u, now="2000-01-01T00:00:00Z")
            complete(conn, got["key_id"])
        live = claim(conn, new_key(), user_id=1)
        conn.execute("CALL idem_cleanup(p_batch_size => 1)")  # warm: nothing left from here on
        left = conn.execute("SELECT count(*) AS n FROM idempotency_keys").fetchone()
        assert left == {"n": 1}, "every expired row is gone, the live claim is kept"
        assert claim(conn, new_key(), user_id=1)["outcome"] == "claimed"
        assert live["outcome"] == "claimed"
        for u in users:
            claim(conn, new_key(), user_id=u, now="2000-01-01T00:00:00Z")
        batch = conn.execute("SELECT idem_cleanup_batch(1) AS n").fetchone()
        assert batch is not None
        shards = conn.execute(
            "SELECT count(DISTINCT get_shard_id_for_distribution_column('idempotency_keys', u)) AS n"
            "  FROM unnest(%s::int[]) u",
            (users,),
        ).fetchone()
        assert shards is not None
        assert batch["n"] == shards["n"], "one row per shard in a batch of one"
        dbname = conn.execute("SELECT current_database() AS d").fetchone()
        declared = conn.execute("SELECT command FROM public.idem_cleanup_job()").fetchone()
    # pg_cron on the coordinator schedules it (cron.database_name is the cluster's idem database)
    with connect(testdb.url_for(orders_url, "idem")) as cron:
        job = cron.execute("SELECT command FROM cron.job WHERE database = %s", (dbname and dbname["d"],)).fetchall()
    assert job == [declared]  # its command checks it runs in this database (its oid), then CALLs the cleanup


_CLEANUP_FIXTURE = """
CREATE TEMP TABLE fx (name text PRIMARY KEY, id bigint);
DO $$
BEGIN
    INSERT INTO fx SELECT 'C1', key_id FROM idem_claim('10000000-0000-4000-8000-000000000001', NULL, 'ep', '{}',
                                                       p_ttl => '2 hours', p_now => now() - interval '5 hours');
    INSERT INTO fx SELECT 'C2', key_id FROM idem_claim('10000000-0000-4000-8000-000000000002', NULL, 'ep', '{}',
                                                       p_ttl => '2 hours',
                                                       p_now => now() - interval '4 hours 30 minutes');
    INSERT INTO fx SELECT 'F1', key_id FROM idem_claim('10000000-0000-4000-8000-000000000003', NULL, 'ep', '{}',
                                                       p_ttl => '2 hours', p_now => now() - interval '3 hours');
    INSERT INTO fx SELECT 'I1', key_id FROM idem_claim('10000000-0000-4000-8000-000000000004', NULL, 'ep', '{}',
                                                       p_ttl => '1 hour', p_now => now() - interval '3 hours');
    INSERT INTO fx SELECT 'C3', key_id FROM idem_claim('10000000-0000-4000-8000-000000000005', NULL, 'ep', '{}',
                                                       p_now => now() - interval '2 hours');
    INSERT INTO fx SELECT 'F2', key_id FROM idem_claim('10000000-0000-4000-8000-000000000006', NULL, 'ep', '{}',
                                                       p_now => now() - interval '2 hours');
    INSERT INTO fx SELECT 'I2', key_id FROM idem_claim('10000000-0000-4000-8000-000000000007', NULL, 'ep', '{}');
    INSERT INTO fx SELECT 'I3', key_id FROM idem_claim('10000000-0000-4000-8000-000000000008', NULL, 'ep', '{}',
                                                       p_now => now() - interval '10 minutes');
    PERFORM idem_complete(id, 200, '{"c": 1}') FROM fx WHERE name IN ('C1', 'C2', 'C3');
    PERFORM idem_fail(id, 500) FROM fx WHERE name IN ('F1', 'F2');
    INSERT INTO idempotency_events (occurred_at, event, scope_user_id, detail)
    VALUES (now() - interval '8 days', 'erasure', 0, '{"rows": 0, "fixture": "old"}'),
           (now() - interval '6 days', 'erasure', 0, '{"rows": 0, "fixture": "recent"}');
END
$$;
"""


def test_the_cleanup_batch_contract_of_pgtap_070_holds_on_one_shard(fresh_admin_url: str) -> None:
    """tests/pgtap/070 on a coordinator. It cannot run there as a pgTAP file: each shard's batch
    commits on its worker in a transaction of its own (sql/citus/071), which does not see the
    file's uncommitted fixture. So the same fixture is committed here, every row a service call
    (the reserved scope 0: one shard, where a batch's bound per shard is its bound), and the same
    outcomes are asserted, with an empty search_path as tests/pgtap/995 does on a single node."""
    with connect(fresh_admin_url) as conn:
        conn.execute(_CLEANUP_FIXTURE)
        kept_sql = "SELECT k.* FROM idempotency_keys k WHERE k.id = ANY (%s) ORDER BY k.id"
        kept_ids = [r["id"] for r in conn.execute("SELECT id FROM fx WHERE name IN ('C3', 'F2', 'I2', 'I3')")]
        kept_before = conn.execute(kept_sql, (kept_ids,)).fetchall()
        conn.execute("SET search_path = ''")

        def batch(size: str, now: str = "pg_catalog.now()") -> int:
            row = conn.execute(f"SELECT public.idem_cleanup_batch({size}, {now}) AS n").fetchone()  # literals only
            assert row is not None
            return int(row["n"])

        def left_over() -> list[str]:
            ids = {r["id"]: r["name"] for r in conn.execute("SELECT id, name FROM pg_temp.fx")}
            rows = conn.execute("SELECT k.id FROM public.idempotency_keys k WHERE k.id = ANY (%s)", (list(ids),))
            return sorted(ids[r["id"]] for r in rows)

        assert batch("100", "pg_catalog.now() - '4 hours'::pg_catalog.interval") == 0, "judged at p_now"
        assert batch("1") == 1, "a batch of one deletes one row"
        assert left_over() == ["C2", "C3", "F1", "F2", "I1", "I2", "I3"], "the finished row that expired first"
        assert batch("2") == 2
        assert left_over() == ["C3", "F2", "I1", "I2", "I3"], "finished rows before orphaned in-flight ones"
        assert batch("10") == 1, "the orphaned in-flight row fills the batch"
        assert left_over() == ["C3", "F2", "I2", "I3"], "unexpired rows stay: finished, live, stale-but-unexpired"
        assert batch("10") == 0
        assert one(conn, "SELECT public.idem_cleanup_batch() AS n") == {"n": 0}, "with its defaults"
        conn.execute("RESET search_path")
        assert conn.execute(kept_sql, (kept_ids,)).fetchall() == kept_before, "kept rows unchanged"
        fixtures = conn.execute(
            "SELECT detail->>'fixture' AS f FROM idempotency_events WHERE detail ? 'fixture' ORDER BY occurred_at"
        ).fetchall()
        assert fixtures == [{"f": "recent"}], "events past 7 days trimmed, a 6-day-old one kept"
        for bad, shown in (("0", "0"), ("-5", "-5"), ("NULL", ""), ("1000001", "1000001")):
            with pytest.raises(psycopg.Error) as err:
                conn.execute(f"SELECT idem_cleanup_batch({bad})")  # literals only
            assert err.value.sqlstate == "IDM00"
            assert f"p_batch_size must be between 1 and 1000000 (got {shown})" in str(err.value)
        with conn.transaction():
            with pytest.raises(psycopg.errors.InvalidTransactionTermination):
                conn.execute("CALL idem_cleanup()")


def test_key_rotation_rewrites_bodies_on_every_shard_in_batches(orders_url: str) -> None:
    """idem_reencrypt_responses (its rewrite: sql/citus/152): bodies of users on both workers, clear -> K1 ->
    K2 in batches, each replayed with its key; the batches walk key_id order to the end."""
    k1, k2 = "rotate-key-one-0123456789abcdefghijklm", "rotate-key-two-0123456789abcdefghijklm"
    users = list(range(1, 13))
    with connect(orders_url) as conn:
        assert len({node_of(conn, u) for u in users}) == 2, "the users' shards are on both workers"
        made: dict[str, tuple[int, dict[str, int]]] = {}
        for u in users:
            key, body = new_key(), {"order": u}
            got = claim(conn, key, user_id=u)
            conn.execute(
                "SELECT idem_complete(%s, 201, %s::jsonb, p_response_headers => %s::jsonb)",
                (got["key_id"], psycopg.types.json.Jsonb(body), psycopg.types.json.Jsonb({"Location": f"/o/{u}"})),
            )
            made[key] = (u, body)
        live = claim(conn, new_key(), user_id=1)  # in flight: not touched

        def rotate(old: str | None, new: str | None) -> int:
            after, total, batches = 0, 0, 0
            while True:
                row = one(conn, "SELECT * FROM idem_reencrypt_responses(%s, %s, %s, 5)", (old, new, after))
                if row["last_id"] is None:
                    return total
                after, total, batches = row["last_id"], total + row["rewritten"], batches + 1
                assert batches < 10

        def kids() -> set[str | None]:
            rows = conn.execute(
                "SELECT response_body ->> 'kid' AS kid FROM idempotency_keys WHERE status = 'completed'"
            )
            return {r["kid"] for r in rows}

        def replays(response_key: str | None) -> None:
            for key, (u, body) in made.items():
                got = one(
                    conn,
                    "SELECT * FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => 'POST /api/trading/orders',"
                    " p_request => %s, p_response_key => %s)",
                    (key, u, psycopg.types.json.Jsonb({"qty": 1}), response_key),
                )
                assert (got["outcome"], got["response_body"], got["response_headers"]) == (
                    "replay",
                    body,
                    {"Location": f"/o/{u}"},
                ), key

        assert rotate(None, k1) == len(users), "every clear body, on both workers, sealed under K1"
        kid1 = one(conn, "SELECT idem_response_key_id(%s) AS k", (k1,))["k"]
        assert kids() == {kid1}
        replays(k1)
        assert rotate(k1, k2) == len(users)
        assert kids() == {one(conn, "SELECT idem_response_key_id(%s) AS k", (k2,))["k"]}
        replays(k2)
        assert rotate(k2, None) == len(users) and kids() == {None}
        replays(None)
        row = one(conn, "SELECT status, response_body FROM idempotency_keys WHERE id = %s", (live["key_id"],))
        assert row == {"status": "in_flight", "response_body": None}


# -- refusals -------------------------------------------------------------------------------------


def refused(url: str) -> str:
    done = idem("migrate", "--database-url", url)
    assert done.returncode != 0, done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    with connect(url) as conn:
        row = conn.execute("SELECT to_regclass('public.idempotency_keys') IS NULL AS untouched").fetchone()
    assert row == {"untouched": True}, "a refusal changes nothing"
    return lines[0]


def test_a_local_host_users_table_is_refused_with_the_statement_to_distribute_it(bare_db: str) -> None:
    with connect(bare_db) as conn:
        conn.execute("CREATE TABLE users (id integer PRIMARY KEY, name text NOT NULL)")
    line = refused(bare_db)
    assert "public.users is not distributed" in line
    assert "SELECT create_distributed_table('public.users', 'id');" in line


def test_a_host_users_table_distributed_by_another_column_is_refused(bare_db: str) -> None:
    with connect(bare_db) as conn:
        conn.execute("CREATE TABLE users (id integer NOT NULL, email text NOT NULL, PRIMARY KEY (email, id))")
        conn.execute("SELECT create_distributed_table('users', 'email')")
    line = refused(bare_db)
    assert "public.users is distributed by email" in line
    assert "SELECT undistribute_table('public.users'); SELECT create_distributed_table('public.users', 'id');" in line


def test_a_worker_without_the_extension_is_refused(bare_db: str) -> None:
    with psycopg.connect(worker_url(bare_db, 2), autocommit=True) as conn:
        conn.execute("DROP EXTENSION citus CASCADE")
    line = refused(bare_db)
    assert "has no citus extension in database" in line
    assert "run CREATE EXTENSION citus; there" in line


@pytest.mark.alone  # worker 2 stopped is stopped for every database of the cluster
def test_an_unreachable_worker_is_refused_at_once(bare_db: str) -> None:
    env = {**os.environ, "CITUS_PORT": str(urlsplit(bare_db).port)}
    subprocess.run(["bash", str(ROOT / "scripts" / "citus.sh"), "stop", "worker2"], check=True, env=env)
    try:
        line = refused(bare_db)
    finally:
        subprocess.run(["bash", str(ROOT / "scripts" / "citus.sh"), "up"], check=True, env=env, capture_output=True)
    assert re.search(r"Citus worker 127\.0\.0\.1:\d+ is unreachable", line), line
    assert "citus_remove_node" in line


# -- installs at once into two databases of the cluster ------------------------------------------


@pytest.fixture
def two_bare_dbs(admin_url: str) -> Iterator[list[str]]:
    names = [f"idem_c_{os.urandom(5).hex()}" for _ in range(2)]
    yield [testdb.create(admin_url, name) for name in names]
    for name in names:
        testdb.drop(admin_url, name)


def test_two_installs_at_once_into_two_databases_of_the_cluster_both_succeed(two_bare_dbs: list[str]) -> None:
    """990's grants make Citus re-create idem's roles on every worker (an ALTER ROLE each), and
    roles are the cluster's: of two installs at once one failed, 'tuple concurrently updated'.
    Both install now, one after the other."""
    start = threading.Barrier(2)

    def install(url: str) -> subprocess.CompletedProcess[str]:
        start.wait()
        return idem("migrate", "--database-url", url)

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(install, two_bare_dbs))
    for one_install in done:
        assert one_install.returncode == 0, one_install.stderr
        assert "migration(s) applied (0001.host-tables" in one_install.stdout, one_install.stdout


def _install_within(url: str, how: str, seconds: str) -> subprocess.CompletedProcess[str]:
    """``idem migrate``, or the ``idem sql`` script applied by psql, waiting up to ``seconds``."""
    if how == "migrate":
        return idem("migrate", "--database-url", url, "--wait-timeout", seconds)
    script = idem("sql", "--wait-timeout", seconds)
    assert script.returncode == 0, script.stderr
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", url],
        input=script.stdout,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("how", ["migrate", "sql"])
def test_an_install_waits_for_another_databases_within_its_timeout_naming_who_holds_it(
    admin_url: str, bare_db: str, how: str
) -> None:
    """The cluster-wide lock is waited for as idem's own is: --wait-timeout, then a refusal naming
    the session (in another database) that holds it, and nothing changed. The holder is another
    install's first step: migrate_lock.sql, the same lock every install takes."""
    with psycopg.connect(admin_url, options="-c search_path=pg_catalog,pg_temp") as holder:  # not bare_db
        take_lock(holder, 10.0)  # in holder's transaction, open until the end of the block
        pid = holder.info.backend_pid
        done = _install_within(bare_db, how, "1")
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode != 0 and lines, done.stderr
    assert "these sessions still hold idem's lock of the Citus cluster" in lines[0], lines[0]
    assert f"pid {pid} (user " in lines[0], lines[0]
    if how == "migrate":  # one line; psql adds the DO block's CONTEXT after it
        assert len(lines) == 1 and lines[0].endswith("nothing was changed"), done.stderr
    with connect(bare_db) as conn:
        row = conn.execute(
            "SELECT to_regclass('public.idempotency_keys') IS NULL AS untouched,"
            "       to_regnamespace('idem_guard') IS NULL AS no_guard"
        ).fetchone()
    assert row == {"untouched": True, "no_guard": True}
    again = _install_within(bare_db, how, "10")  # the holder gone, it installs
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("how", ["migrate", "sql"])
def test_a_login_role_queued_for_pg_authid_blocks_no_install_of_another_database(
    owned: dict[str, str], two_bare_dbs: list[str], how: str
) -> None:
    """Any login role, in a database of its own, can queue for a lock on pg_authid it may never
    take: CREATE TRIGGER ON pg_catalog.pg_authid waits for SHARE ROW EXCLUSIVE before it checks
    privileges, behind the ROW EXCLUSIVE lock the role's own ALTER ROLE ... PASSWORD holds in an
    open transaction. A queued request conflicts with every later one it conflicts with, so the
    LOCK TABLE pg_authid IN SHARE UPDATE EXCLUSIVE MODE NOWAIT of every install in the cluster
    failed until the role let go, refused after --wait-timeout naming 'none left'. The cluster's
    lock is one no such request conflicts with: both installs succeed."""
    first = idem("migrate", "--database-url", two_bare_dbs[0])  # idem's roles exist: no CREATE ROLE
    assert first.returncode == 0, first.stderr
    with attacker_session(owned) as holder, attacker_session(owned) as queued:
        holder.execute("BEGIN")
        holder.execute(f"ALTER ROLE \"{owned['role']}\" PASSWORD 'not-a-secret'")
        pid = queued.info.backend_pid
        refused: list[str] = []

        def queue() -> None:
            try:
                queued.execute(
                    "CREATE TRIGGER t AFTER INSERT ON pg_catalog.pg_authid"
                    " FOR EACH ROW EXECUTE FUNCTION pg_catalog.now()"
                )
            except psycopg.Error as exc:
                refused.append(str(exc))

        waiting = threading.Thread(target=queue)
        waiting.start()
        try:
            with connect(two_bare_dbs[0]) as conn:  # queued: not granted, in the cluster's lock table
                for _ in range(100):
                    row = conn.execute(
                        "SELECT count(*) AS n FROM pg_catalog.pg_locks WHERE pid = %s AND NOT granted"
                        " AND database = 0 AND relation = 'pg_catalog.pg_authid'::pg_catalog.regclass",
                        (pid,),
                    ).fetchone()
                    if row and row["n"]:
                        break
                    time.sleep(0.1)
                else:
                    pytest.fail("the role's CREATE TRIGGER never queued for pg_authid")
            done = _install_within(two_bare_dbs[1], how, "3")
        finally:
            holder.execute("ROLLBACK")
            waiting.join(30)
    assert refused and "system catalog" in refused[0], refused  # the role itself was refused
    assert done.returncode == 0, done.stderr


# -- a single-node store converted in place ----------------------------------------------------------


def test_a_citus_older_than_13_is_refused_in_one_line_before_anything_else(bare_db: str) -> None:
    """No Citus 12 can be installed beside 13.2.2, so the database's own record of its extension
    is made to say 12.1-1 (UPDATE pg_extension, as the superuser, in this throwaway database): the
    version idem reads (schema/citus.py TOO_OLD: pg_extension.extversion, the one place it asks).
    This proves that `idem migrate` refuses on that version in one line, before it asks Citus
    anything else (no worker probe, no Citus function, so a mismatched library cannot fail first),
    and changes nothing. It does not prove how a real Citus 12 library would answer the rest of
    the preflight (never asked) or the store (never built): the library loaded is still 13.2.2."""
    with connect(bare_db) as conn:
        conn.execute("UPDATE pg_extension SET extversion = '12.1-1' WHERE extname = 'citus'")
    try:
        line = refused(bare_db)
        assert "Citus 12.1-1 is older than 13: idem needs Citus 13 or later" in line, line
        assert line.endswith("nothing was changed (see docs/scaling.md)"), line
        with connect(bare_db) as conn:
            row = one(
                conn,
                "SELECT to_regclass('public._yoyo_migration') IS NULL AS no_yoyo,"
                "       to_regclass('public.users') IS NULL AS no_users,"
                "       (SELECT count(*) FROM pg_dist_partition) AS distributed",
            )
        assert row == {"no_yoyo": True, "no_users": True, "distributed": 0}, "nothing was written"
    finally:
        with connect(bare_db) as conn:
            conn.execute("UPDATE pg_extension SET extversion = '13.2-1' WHERE extname = 'citus'")
    done = idem("migrate", "--database-url", bare_db)
    assert done.returncode == 0, done.stderr  # the same database, its version restored, migrates


def test_a_single_node_store_is_distributed_in_place_by_the_same_command(admin_url: str) -> None:
    name = f"idem_c_{os.urandom(5).hex()}"
    url = testdb.url_for(admin_url, name)
    testdb.drop(admin_url, name)
    with psycopg.connect(testdb.url_for(admin_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # the coordinator only: no citus, one node
    try:
        assert idem("migrate", "-q", "--database-url", url).returncode == 0
        with connect(url) as conn:
            conn.execute("INSERT INTO users (id) VALUES (5)")
            user_key, service_key, held_key = new_key(), new_key(), new_key()
            complete(conn, claim(conn, user_key, user_id=5)["key_id"], body={"was": "user"})
            complete(conn, claim(conn, service_key, endpoint="svc")["key_id"], body={"was": "service"})
            held = claim(conn, held_key, user_id=5)
        testdb.citus(admin_url, "createdb", name)  # the extension everywhere, the workers added
        done = idem("migrate", "--database-url", url)
        assert done.returncode == 0, done.stderr
        with connect(url) as conn:
            assert claim(conn, user_key, user_id=5)["response_body"] == {"was": "user"}
            assert claim(conn, service_key, endpoint="svc")["response_body"] == {"was": "service"}
            # a token handed out before the conversion no longer routes: the claim is lost, cleanly
            with pytest.raises(psycopg.Error) as lost:
                complete(conn, held["key_id"])
            assert lost.value.sqlstate == "IDM01"
            assert "store: distributed" in idem("status", "--database-url", url).stdout
    finally:
        testdb.drop(admin_url, name)


# -- a shard on the move ----------------------------------------------------------------------------


def test_claims_while_their_shard_moves_wait_and_never_run_twice(orders_url: str) -> None:
    with connect(orders_url) as conn:
        shard = conn.execute(
            "SELECT s.shardid, p.nodename, p.nodeport FROM pg_dist_shard s JOIN pg_dist_shard_placement p"
            " USING (shardid) WHERE s.shardid = get_shard_id_for_distribution_column('idempotency_keys', 3)"
        ).fetchone()
        assert shard is not None
        target = conn.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND nodeport <> %s",
            (shard["nodeport"],),
        ).fetchone()
        assert target is not None
    keys = [new_key() for _ in range(40)]
    stop = threading.Event()
    results: list[tuple[str, str]] = []
    errors: list[str] = []

    def client() -> None:
        with connect(orders_url) as c:
            i = 0
            while not stop.is_set():
                key = keys[i % len(keys)]
                i += 1
                try:
                    got = claim(c, key, user_id=3)
                    if got["outcome"] == "claimed":
                        complete(c, got["key_id"], body={"key": key})
                    results.append((key, got["outcome"]))
                except psycopg.Error as exc:  # a 503 for the shim (Tier 1); never a second execution
                    errors.append(f"{exc.sqlstate}: {exc}")

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        with connect(orders_url) as conn:
            conn.execute(
                "SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => 'block_writes')",
                (shard["shardid"], shard["nodename"], shard["nodeport"], target["nodename"], target["nodeport"]),
            )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    claimed = Counter(k for k, o in results if o == "claimed")
    assert claimed and max(claimed.values()) == 1, "no key is claimed (executed) twice"
    assert not errors, errors[:3]
    with connect(orders_url) as conn:
        assert node_of(conn, 3) == f"{target['nodename']}:{target['nodeport']}"
        for key in keys:
            if key in claimed:
                assert claim(conn, key, user_id=3)["response_body"] == {"key": key}


# -- tokens on a distributed store ------------------------------------------------------------------


def test_a_store_distributed_at_sql_api_4_refuses_a_tokenless_completion_after_the_upgrade(
    admin_url: str, tmp_path: Path
) -> None:
    """Before claim tokens, a distributed store's key_ids were already scope * 2^31 + sequence:
    the largest of them is the largest user's. The upgrade must know the claims taken before
    tokens by a mark of their own, so that a later claim of a smaller user is not tokenless."""
    name = f"idem_c_{os.urandom(5).hex()}"
    url = testdb.create(admin_url, name)
    try:
        earlier.build(url, 4, tmp_path)
        add_users(url, [1, 5])
        with connect(url) as conn:  # SQL API 4's claim: no p_now => NULL yet
            old = {
                user: one(
                    conn,
                    "SELECT * FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => 'POST /x',"
                    " p_request => '{}')",
                    (new_key(), user),
                )
                for user in (1, 5)
            }
        done = idem("migrate", "--database-url", url)
        assert done.returncode == 0, done.stderr
        with login_role(url, "idem_app") as (_, web), connect(web) as app, connect(url) as admin:
            fresh = claim(app, new_key(), user_id=1)
            assert fresh["key_id"] < old[5]["key_id"]  # what made it tokenless before
            before = admin.execute("SELECT * FROM idempotency_keys ORDER BY id").fetchall()
            for forged in (
                "SELECT idem_complete(%s, 201, '{\"forged\": true}')",
                "SELECT idem_fail(%s)",
                "SELECT idem_heartbeat(%s)",
            ):
                with pytest.raises(psycopg.Error) as refused:
                    app.execute(forged, (fresh["key_id"],))
                assert refused.value.sqlstate == "IDM00", refused.value
            assert admin.execute("SELECT * FROM idempotency_keys ORDER BY id").fetchall() == before
            # the claims taken before tokens existed still finish without one (an old shim, mid-upgrade)
            app.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}')",
                (old[1]["key_id"],),
            )
            app.execute("SELECT idem_fail(p_key_id => %s)", (old[5]["key_id"],))
            complete(app, fresh, body={"order": 1})  # and the new claim with its own token
    finally:
        testdb.drop(admin_url, name)


def test_a_token_never_fits_the_claim_that_gets_its_key_id_when_the_low_bits_wrap(fresh_admin_url: str) -> None:
    """key_id = scope * 2^31 + (sequence mod 2^31): after 2^31 claims a scope's key_id comes round
    again. The token an attacker kept from its own claim in that scope must not fit the new one."""
    add_users(fresh_admin_url, [1])
    with (
        login_role(fresh_admin_url, "idem_app") as (_, web),
        connect(web) as attacker,
        connect(fresh_admin_url) as admin,
    ):
        kept = claim(attacker, new_key(), user_id=1)
        admin.execute("DELETE FROM idempotency_keys WHERE scope_user_id = 1 AND id = %s", (kept["key_id"],))
        low = kept["key_id"] & (2**31 - 1)
        admin.execute("SELECT setval('idempotency_keys_id_seq', %s)", (low - 1 + 2**31,))
        theirs = claim(admin, new_key(), user_id=1)
        assert theirs["key_id"] == kept["key_id"]
        with pytest.raises(psycopg.Error) as refused:
            attacker.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{\"forged\": true}',"
                " p_claim_token => %s)",
                (theirs["key_id"], kept["claim_token"]),
            )
        assert refused.value.sqlstate == "IDM01"
        assert one(
            admin, "SELECT status FROM idempotency_keys WHERE scope_user_id = 1 AND id = %s", (theirs["key_id"],)
        ) == {"status": "in_flight"}
