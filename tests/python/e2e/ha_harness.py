"""A replicated store for the failover tests: scripts/ha.sh (pg_auto_failover: a monitor and two
nodes, as `make ha-up` builds) in a temporary directory on free ports, driven from Python.

`HaCluster` stands in for e2e_harness.Cluster where a test needs a database: its URLs are libpq
multi-host URLs with ``target_session_attrs=read-write``, so `prepare_template`, `Database` and
the app all reach whichever node is the primary, exactly as a user's app would.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.python.e2e.e2e_harness import IS_ROOT, ROOT
from tests.python.support import databases
from tests.python.support.waiting import wait_until

HA_SH = ROOT / "scripts" / "ha.sh"
NODES = ("node1", "node2")


def free_port_run(n: int = 3) -> int:
    """A port p with p .. p+n-1 all free (the monitor and the two nodes). Searched upwards from
    IDEM_PGPORT + 10 (the ports of this checkout, which make exports), else from 21000: below the
    kernel's ephemeral range, where a client's outgoing connection could take a port between
    this check and the node's start."""
    start = int(os.environ["IDEM_PGPORT"]) + 10 if os.environ.get("IDEM_PGPORT") else 21000
    # a random offset: the ports of the previous run may still have its sockets closing
    offset: int = random.randrange(0, 75 // n) * n
    base: int
    for base in [*range(start + offset, start + 87, n), *range(start, start + offset, n)]:

        def free(port: int) -> bool:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    return False
            return True

        if all(free(p) for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports from {start}")


class Autoctl:
    """What the pg_auto_failover set-ups share: their script (scripts/ha.sh, scripts/ha-citus.sh),
    the environment it runs in, and the folder that holds their nodes."""

    script: Path
    env: dict[str, str]
    dir: Path

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The script's exit status, stdout and stderr as they are (the refusals' tests read them)."""
        return subprocess.run(
            ["bash", str(self.script), *args],
            env=self.env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )

    def sh(self, *args: str, timeout: float = 120) -> str:
        out = self.run(*args, timeout=timeout)
        if out.returncode != 0:
            command = f"{self.script.name} {' '.join(args)}"
            raise RuntimeError(f"{command} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        return out.stdout.strip()

    def bring_up(self, timeout: float) -> None:
        """`up`; on a failure, whatever came up is stopped again and the error raised."""
        try:
            self.sh("up", timeout=timeout)
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        raise NotImplementedError

    def node_url(self, node: str, dbname: str, user: str = "postgres") -> str:
        raise NotImplementedError

    def state(self) -> str:
        """pg_autoctl show state."""
        return self.sh("state")

    def events(self) -> str:
        """The monitor's event log (pgautofailover.event): every state change, with its reason."""
        with psycopg.connect(self.node_url("monitor", "pg_auto_failover"), connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT eventtime::time(1), nodename, reportedstate, goalstate, description "
                "FROM pgautofailover.event ORDER BY eventid"
            ).fetchall()
        return "\n".join(" | ".join(str(c) for c in row) for row in rows)

    def teardown(self, nodes: list[str]) -> None:
        """Stop every node (whatever is left: every process of its session), remove the folder."""
        try:
            self.sh("down", timeout=300)
        except (RuntimeError, subprocess.TimeoutExpired):
            for node in nodes:
                try:
                    self.sh("kill", node, timeout=10)
                except (RuntimeError, subprocess.TimeoutExpired):
                    pass
        if not os.environ.get("E2E_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)


class HaCluster(Autoctl):
    """pg_auto_failover on 127.0.0.1: ``sync=False`` makes the standby asynchronous."""

    script = HA_SH

    def __init__(self, sync: bool = True) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="idem-e2e-ha-"))
        if IS_ROOT:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port_run()
        self.ports = {"monitor": self.port, "node1": self.port + 1, "node2": self.port + 2}
        self.env = {
            **os.environ,
            "IDEM_HADIR": str(self.dir),
            "IDEM_HA_PORT": str(self.port),
            "IDEM_HA_SYNC": "1" if sync else "0",
        }
        self.bring_up(timeout=300)

    def destroy(self) -> None:
        self.teardown([*NODES, "monitor"])

    def kill(self, node: str) -> None:
        """SIGKILL the node's keeper, postmaster and backends at once: the machine is lost."""
        self.sh("kill", node)

    def start(self, node: str) -> None:
        """Start a node's keeper: a lost primary rejoins as the standby (pg_rewind)."""
        self.sh("start", node, timeout=300)

    def set_async(self, node: str) -> None:
        """The standby ``node`` leaves the replication quorum: the primary stops waiting for it."""
        primary = self.primary()
        assert primary is not None and primary != node, self.state()
        self.sh("quorum", node, "false")
        # the primary passes through apply_settings (no primary for the monitor a moment)
        wait_until(
            lambda: self.node_setting(primary, "synchronous_standby_names") == "" and self.primary() == primary,
            30,
            0.2,
            what=f"{primary} without a synchronous standby",
        )

    # -- the monitor's view ------------------------------------------------------------------

    def states(self) -> dict[str, tuple[str, str]]:
        """node -> (reported state, assigned state), as the monitor sees them now."""
        try:
            with psycopg.connect(self.node_url("monitor", "pg_auto_failover"), connect_timeout=2) as conn:
                rows = conn.execute("SELECT nodename, reportedstate, goalstate FROM pgautofailover.node").fetchall()
        except psycopg.Error:
            return {}
        return {str(n): (str(r), str(g)) for n, r, g in rows}

    def primary(self) -> str | None:
        # a lost primary stays "primary" in the reported column (it never reports again): the
        # monitor's assignment says which node it has made the primary
        ruling = ("primary", "wait_primary", "single")
        for node, (reported, goal) in self.states().items():
            if reported in ruling and goal in ruling:
                return node
        return None

    def writable(self, node: str) -> bool:
        try:
            with psycopg.connect(self.node_url(node, "postgres"), connect_timeout=1, autocommit=True) as conn:
                row = conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()
            return bool(row and row[0])
        except psycopg.Error:
            return False

    def wait_promoted(self, other_than: str, timeout: float = 60) -> str:
        """Wait until a node other than ``other_than`` is the monitor's primary and takes writes."""

        def promoted() -> str | None:
            p = self.primary()
            return p if p and p != other_than and self.writable(p) else None

        return wait_until(promoted, timeout, 0.1, what=f"a primary other than {other_than}\n{self.state()}")

    def wait_pair(self, timeout: float = 90) -> None:
        """Wait until one node is primary and the other its secondary again."""

        def pair() -> bool:
            reported = sorted(r for r, _ in self.states().values())
            return reported == ["primary", "secondary"]

        wait_until(pair, timeout, 0.2, what=f"a primary and a secondary\n{self.state()}")

    def node_setting(self, node: str, name: str) -> str | None:
        try:
            with psycopg.connect(self.node_url(node, "postgres"), connect_timeout=2) as conn:
                row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            return None if row is None else str(row[0])
        except psycopg.Error:
            return None

    def walreceiver_pid(self, node: str) -> int:
        def pid() -> int | None:
            with psycopg.connect(self.node_url(node, "postgres"), connect_timeout=2) as conn:
                row = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver'").fetchone()
            return int(row[0]) if row else None

        return wait_until(pid, 20, 0.2, what=f"{node}'s walreceiver")

    # -- what e2e_harness.Cluster offers -------------------------------------------------------

    def node_url(self, node: str, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.ports[node]}/{dbname}"

    def url(self, dbname: str, user: str = "postgres") -> str:
        hosts = ",".join(f"127.0.0.1:{self.ports[n]}" for n in NODES)
        return f"postgresql://{user}@{hosts}/{dbname}?target_session_attrs=read-write"

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def create_database(self, name: str, template: str | None = None) -> None:
        databases.create_database(self.admin_url, name, template)

    def cron(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """A query in pg_cron's database (``idem``) on the primary."""
        with psycopg.connect(self.url("idem"), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []


def pause(pid: int, seconds: float) -> None:
    """SIGSTOP a process for ``seconds`` (a walreceiver: the standby falls behind)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
