"""A Citus formation under pg_auto_failover for the tests and the soak: scripts/ha-citus.sh (a
monitor, a coordinator, worker groups of a primary and its synchronous standby), driven from
Python.

`CitusFormation()` attaches to a formation that is already up when ``IDEM_HA_CITUS_REUSE=1``
(``IDEM_HA_CITUS_DIR`` and ``IDEM_HA_CITUS_PORT`` say where: `make test-chaos-citus` builds one
and runs every Citus failover test and the soak on it, so the start-up is paid once) and never
stops it; otherwise it builds a private one in a temporary directory on free ports and
`destroy()` removes it.

The formation has one database (pg_auto_failover's Citus mode keeps the workers' metadata of one
database), so every test works in `idem` with users of its own: `prepare_raptor` makes the store
and Raptor's colocated tables once, `Database(formation, "idem")` reaches it through the
coordinator, and the soak's snapshot reads the test's users only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from tests.python.e2e.e2e_harness import IS_ROOT, PG_BIN, ROOT, idem_migrate, run_python, statements
from tests.python.e2e.ha_harness import Autoctl, free_port_run
from tests.python.support.waiting import wait_until

HA_CITUS_SH = ROOT / "scripts" / "ha-citus.sh"
_PKGLIB = subprocess.run([str(PG_BIN / "pg_config"), "--pkglibdir"], capture_output=True, text=True).stdout.strip()
CITUS_LIB = Path(_PKGLIB or "/nonexistent") / "citus.so"
SCHEMA_CITUS = ROOT / "examples" / "raptor" / "schema_citus.sql"
DB = "idem"
RULING = ("primary", "wait_primary", "single")


class CitusFormation(Autoctl):
    script = HA_CITUS_SH

    def __init__(self, workers: int = 2) -> None:
        self.reused = os.environ.get("IDEM_HA_CITUS_REUSE") == "1"
        if self.reused:  # default: the formation of `make ha-citus-up`
            self.dir = Path(os.environ.get("IDEM_HA_CITUS_DIR") or ROOT / ".ha-citus")
            self.port = int(os.environ["IDEM_HA_CITUS_PORT"])
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="idem-e2e-ha-citus-"))
            if IS_ROOT:
                shutil.chown(self.dir, "postgres", "postgres")
            self.port = free_port_run(9)
        self.env = {
            **os.environ,
            "IDEM_HA_CITUS_DIR": str(self.dir),
            "IDEM_HA_CITUS_PORT": str(self.port),
            "IDEM_HA_CITUS_WORKERS": str(workers),
        }
        self.bring_up(timeout=600)

    def destroy(self) -> None:
        if not self.reused:
            self.teardown(self.node_names())

    def node_names(self) -> list[str]:
        return self.sh("nodes").split()

    def node_port(self, node: str) -> int:
        return int(self.sh("port", node))

    def kill(self, node: str) -> None:
        """SIGKILL the node's keeper, postmaster and backends at once: its machine is lost."""
        self.sh("kill", node)

    def start(self, node: str) -> None:
        self.sh("start", node, timeout=400)

    def add_worker(self) -> int:
        """A new worker group (primary and standby), active in the coordinator's metadata."""
        before = set(self.groups())
        self.sh("add-worker", timeout=600)
        (group,) = set(self.groups()) - before
        return group

    def drop_worker(self, group: int) -> None:
        self.sh("drop-worker", str(group), timeout=900)

    # -- the monitor's view ------------------------------------------------------------------

    def nodes(self) -> dict[str, tuple[int, str, str]]:
        """node -> (group, reported state, assigned state), as the monitor sees them now."""
        try:
            with psycopg.connect(self.node_url("monitor", "pg_auto_failover"), connect_timeout=2) as conn:
                rows = conn.execute(
                    "SELECT nodename, groupid, reportedstate, goalstate FROM pgautofailover.node"
                ).fetchall()
        except psycopg.Error:
            return {}
        return {str(n): (int(g), str(r), str(a)) for n, g, r, a in rows}

    def groups(self) -> list[int]:
        return sorted({g for g, _, _ in self.nodes().values() if g > 0})

    def primary(self, group: int) -> str | None:
        """The node the monitor has made primary (a lost one keeps "primary" as its last report)."""
        for node, (g, reported, goal) in sorted(self.nodes().items()):
            if g == group and reported in RULING and goal in RULING:
                return node
        return None

    def standby(self, group: int) -> str | None:
        for node, (g, reported, _) in sorted(self.nodes().items()):
            if g == group and reported == "secondary":
                return node
        return None

    @property
    def coordinator_standby(self) -> bool:
        return self.env.get("IDEM_HA_CITUS_COORD_STANDBY") == "1"

    def whole(self, group: int) -> bool:
        states = sorted(r for g, r, _ in self.nodes().values() if g == group)
        alone = group == 0 and not self.coordinator_standby
        return states == (["single"] if alone else ["primary", "secondary"])

    def wait_whole(self, timeout: float = 240) -> None:
        """Every group whole again: a primary and its standby (the coordinator alone: single), and
        every worker's copy of the metadata current (a shard move refuses to start otherwise)."""

        def all_whole() -> bool:
            nodes = self.nodes()
            return bool(nodes) and all(self.whole(g) for g in {0, *self.groups()}) and self.synced()

        wait_until(all_whole, timeout, 0.5, what=f"every group whole\n{self.state()}")

    def wait_promoted(self, group: int, other_than: str, timeout: float = 120) -> str:
        """A node other than ``other_than`` is the group's primary, and the coordinator's metadata
        names it (pg_autoctl's citus_update_node)."""

        def promoted() -> str | None:
            p = self.primary(group)
            if not p or p == other_than:
                return None
            return p if self.worker_port_in_metadata(group) == self.node_port(p) else None

        return wait_until(promoted, timeout, 0.2, what=f"a primary of group {group} other than {other_than}")

    # -- the coordinator's view --------------------------------------------------------------

    def synced(self) -> bool:
        try:
            with psycopg.connect(self.url(DB), connect_timeout=2) as conn:
                row = conn.execute("SELECT bool_and(metadatasynced) FROM pg_dist_node WHERE hasmetadata").fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0])

    def worker_port_in_metadata(self, group: int) -> int | None:
        try:
            with psycopg.connect(self.url(DB), connect_timeout=2) as conn:
                row = conn.execute(
                    "SELECT nodeport FROM pg_dist_node WHERE groupid = %s AND noderole = 'primary'", (group,)
                ).fetchone()
        except psycopg.Error:
            return None
        return None if row is None else int(row[0])

    def placements(self) -> list[tuple[int, int, int]]:
        """(shard, worker group, its primary's port) of every shard of the store."""
        with psycopg.connect(self.url(DB)) as conn:
            rows = conn.execute(
                "SELECT s.shardid, p.groupid, n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
                "  JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'"
                " WHERE s.logicalrelid = 'public.idempotency_keys'::regclass ORDER BY 1"
            ).fetchall()
        return [(int(shard), int(group), int(port)) for shard, group, port in rows]

    def move_shard(self, shard: int, source: int, target: int) -> None:
        """citus_move_shard_placement without blocking writes: the shard and its colocated ones."""
        with psycopg.connect(self.url(DB), autocommit=True) as conn:
            conn.execute(
                "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,"
                " shard_transfer_mode => 'force_logical')",
                (shard, source, target),
            )

    def shards_per_group(self) -> dict[int, int]:
        """The store's shard placements per worker group."""
        with psycopg.connect(self.url(DB)) as conn:
            rows = conn.execute(
                "SELECT p.groupid, count(*) FROM pg_dist_placement p JOIN pg_dist_shard s USING (shardid)"
                " WHERE s.logicalrelid = 'public.idempotency_keys'::regclass GROUP BY 1"
            ).fetchall()
        return {int(g): int(n) for g, n in rows}

    # -- what e2e_harness.Cluster offers -------------------------------------------------------

    def node_url(self, node: str, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.node_port(node)}/{dbname}"

    def url(self, dbname: str, user: str = "postgres") -> str:
        """The coordinator, as the app names it (both nodes of group 0 when it has a standby)."""
        if self.coordinator_standby:
            hosts = f"127.0.0.1:{self.port + 1},127.0.0.1:{self.port + 2}"
            return f"postgresql://{user}@{hosts}/{dbname}?target_session_attrs=read-write"
        return f"postgresql://{user}@127.0.0.1:{self.port + 1}/{dbname}"

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def cron(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """A query in pg_cron's database on the coordinator (cron lives there alone)."""
        with psycopg.connect(self.url(DB), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []


def prepare_raptor(formation: CitusFormation) -> None:
    """The store (idem migrate distributes it) and Raptor's tables distributed and colocated with it
    (examples/raptor/schema_citus.sql), once per formation."""
    url = formation.url(DB)
    idem_migrate(url)
    with psycopg.connect(url) as conn:
        done = conn.execute(
            "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('raptor.accounts')"
        ).fetchone()
    if done:
        return
    run_python("-m", "examples.raptor", "init-db", "--database-url", url)
    with psycopg.connect(url) as conn:  # one transaction, one statement at a time (Citus forwards each)
        for stmt in statements(SCHEMA_CITUS):
            conn.execute(stmt)  # the file's own statements, no value from outside
