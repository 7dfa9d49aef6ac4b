"""What one machine can show of a formation that grows (docs/scaling.md "What one machine shows"):
per-node CPU per claim, and the claim's latency before, during and after a worker joins and the
store is rebalanced onto it.

    make bench-citus-ha          # a private formation; bench/citus-rebalance.png, figures on stdout
    IDEM_HA_CITUS_REUSE=1 make bench-citus-ha   # on the formation of make ha-citus-up (2 groups)

pgbench at a fixed rate (RATE claims/s, CLIENTS clients, bench/pgbench/fn_claim_complete.sql:
a claim and its completion, as the shim sends them, over USERS users) against the coordinator of a
formation of two worker groups (each a primary and its synchronous standby). After BEFORE seconds a
third worker group joins (scripts/ha-citus.sh add-worker) and the store is rebalanced onto it
(citus_rebalance_start, force_logical); the load goes on AFTER seconds past the rebalance's end.

- CPU per claim, per node: the CPU time (user + system) of each PostgreSQL server's processes (the
  postmaster, its live children, and the children that exited meanwhile) beyond what it uses idle
  (IDLE seconds without load, first), over the claims completed in the same window: before the
  join (two workers) and after the rebalance (three); a worker's also over the claims it served
  (its share of the shards: the users are drawn uniformly);
- the claim's latency (pgbench's per-transaction log: the claim and its completion) over time, with
  p50 and p99 before, during (the join and the rebalance) and after, drawn as bench/citus-rebalance.png.

The machine is shared and the nodes share its cores: read the figures with the load printed beside
them. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.common import log, percentile, pgbench
from tests.python.e2e.citus_ha_harness import DB, CitusFormation, prepare_raptor

BENCH = Path(__file__).resolve().parent
RATE = 60  # claims/s: the formation keeps it on two shared cores, so latency is not queueing
CLIENTS = 4
USERS = 10_000
IDLE, BEFORE, AFTER = 10.0, 30.0, 30.0


# --- CPU of a PostgreSQL server ------------------------------------------------------------------


def _ticks(pid: int) -> tuple[int, int, int] | None:
    """(ppid, own utime + stime, reaped children's cutime + cstime) in clock ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def server_cpu_seconds(data_dir: Path) -> float:
    """Every CPU second a server has used: its postmaster's, its live children's, and those of the
    children it reaped (a backend that ended, a move's worker)."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    own = _ticks(postmaster)
    if own is None:
        raise RuntimeError(f"no postmaster {postmaster} for {data_dir}")
    total = own[1] + own[2]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        found = _ticks(int(stat.parent.name))
        if found is not None and found[0] == postmaster:
            total += found[1]
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuWindow:
    label: str
    start: dict[str, float]
    began: float
    end: dict[str, float] = field(default_factory=dict)
    ended: float = 0.0
    claims: int = 0
    shares: dict[str, float] = field(default_factory=dict)  # worker role -> its share of the shards

    def seconds(self) -> float:
        return self.ended - self.began

    def used(self, node: str) -> float:
        return self.end[node] - self.start[node]


def snapshot(formation: CitusFormation) -> dict[str, float]:
    """node -> CPU seconds, for every node of the formation that is running, named by its role."""
    out: dict[str, float] = {}
    for node, (group, reported, _) in formation.nodes().items():
        role = "coordinator" if group == 0 else f"worker {group} {'primary' if reported == 'primary' else 'standby'}"
        try:
            out[role] = server_cpu_seconds(formation.dir / node)
        except (OSError, RuntimeError, ValueError):
            pass
    out["monitor"] = server_cpu_seconds(formation.dir / "monitor")
    return out


def measure(formation: CitusFormation, label: str, seconds: float) -> CpuWindow:
    window = CpuWindow(label, snapshot(formation), time.time())
    time.sleep(seconds)
    window.end, window.ended = snapshot(formation), time.time()
    return window


def share_of_shards(formation: CitusFormation) -> dict[str, float]:
    """worker role -> the share of the store's shards its group holds (of the claims it serves:
    the users are drawn uniformly, the shards are equal hash ranges)."""
    per_group = formation.shards_per_group()
    total = sum(per_group.values())
    return {f"worker {g} {kind}": n / total for g, n in per_group.items() for kind in ("primary", "standby")}


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: float  # epoch seconds
    end: float


class Load:
    """pgbench at RATE claims/s in back-to-back runs of CHUNK seconds, until stopped."""

    CHUNK = 10

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.thread = threading.Thread(target=self._drive)
        self.samples: list[tuple[float, float]] = []  # (end epoch, latency ms)
        self.failure: list[BaseException] = []

    def _drive(self) -> None:
        try:
            while not self.stop.is_set():
                run = pgbench(
                    self.url,
                    "fn_claim_complete",
                    clients=CLIENTS,
                    seconds=self.CHUNK,
                    rate=RATE,
                    logged=True,
                    threads=2,
                )
                self.samples += run.samples
        except BaseException as exc:  # reported by the main thread
            self.failure.append(exc)

    def claims(self, start: float, end: float) -> int:
        return sum(1 for done, _ in self.samples if start <= done < end)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()
        if self.failure:
            raise self.failure[0]


def run(formation: CitusFormation, out: Path) -> Path:
    url = formation.url(DB)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.users (id) SELECT g FROM generate_series(1, %s) g ON CONFLICT DO NOTHING", (USERS,)
        )
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    idle = measure(formation, "idle", IDLE)
    driver = Load(url)
    driver.thread.start()
    time.sleep(5.0)  # connections made, caches warm
    if driver.failure or not driver.thread.is_alive():
        driver.finish()
        raise RuntimeError("pgbench did not run")
    before = measure(formation, "two workers", BEFORE)
    before.shares = share_of_shards(formation)
    joined = time.time()
    group = formation.add_worker()
    added = time.time()
    rebalanced = formation.run("rebalance", timeout=900)
    if rebalanced.returncode != 0:
        driver.finish()
        raise RuntimeError(f"the rebalance failed: {rebalanced.stderr}")
    done = time.time()
    time.sleep(3.0)
    after = measure(formation, "three workers", AFTER)
    after.shares = share_of_shards(formation)
    driver.finish()
    for window in (before, after):
        window.claims = driver.claims(window.began, window.ended)
    phases = [
        Phase("before (2 workers)", before.began, joined),
        Phase(f"worker group {group} joins", joined, added),
        Phase("rebalance (force_logical)", added, done),
        Phase("after (3 workers)", done, after.ended),
    ]
    samples = [(end, lat) for end, lat in driver.samples if end - lat / 1000.0 < after.ended]
    report(phases, samples, idle, [before, after], load, rebalanced.stderr.strip().splitlines()[-1])
    return plot(phases, samples, load, out / "citus-rebalance.png")


def latencies(samples: list[tuple[float, float]], phase: Phase) -> list[float]:
    return [lat for end, lat in samples if phase.start <= end - lat / 1000.0 < phase.end]


def report(
    phases: list[Phase],
    samples: list[tuple[float, float]],
    idle: CpuWindow,
    windows: list[CpuWindow],
    load: str,
    rebalance: str,
) -> None:
    print(f"citus-ha bench: {RATE} claims/s (claim + complete), {CLIENTS} clients, {USERS:,} users; {load}")
    print(f"  {rebalance}")
    print("| phase | seconds | claims | p50 | p99 |")
    print("| --- | --- | --- | --- | --- |")
    for p in phases:
        lats = latencies(samples, p)
        print(
            f"| {p.name} | {p.end - p.start:.0f} | {len(lats)} | {percentile(lats, 50):.2f} ms |"
            f" {percentile(lats, 99):.2f} ms |"
        )
    # a node's CPU beyond its idle rate, over the claims of the window; a worker's also over the
    # claims it served (its share of the shards)
    print("| node | idle CPU | " + " | ".join(f"CPU per claim, {w.label} ({w.claims} claims)" for w in windows) + " |")
    print("| --- | --- |" + " --- |" * len(windows))

    def idle_rate(n: str) -> float:
        """CPU s/s idle; a node that joined later is given its kind's mean (primary, standby)."""
        if n in idle.end and n in idle.start:
            return idle.used(n) / idle.seconds()
        kind = [m for m in idle.end if m in idle.start and m.startswith("worker") and m.split()[-1] == n.split()[-1]]
        return sum(idle.used(m) for m in kind) / max(1, len(kind)) / idle.seconds()

    for n in sorted({n for w in windows for n in w.end}):
        rate = idle_rate(n)
        cells = []
        for w in windows:
            if n not in w.end or n not in w.start or n == "monitor":
                cells.append("–")
                continue
            per_claim = (w.used(n) - rate * w.seconds()) * 1000.0 / max(1, w.claims)
            served = f" ({per_claim / w.shares[n]:.2f} ms per claim it served)" if w.shares.get(n) else ""
            cells.append(f"{per_claim:.2f} ms{served}")
        print(f"| {n} | {rate * 1000.0:.0f} ms/s | " + " | ".join(cells) + " |")


def plot(phases: list[Phase], samples: list[tuple[float, float]], load: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = phases[0].start
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = [end - lat / 1000.0 - t0 for end, lat in samples]
    ax.scatter(xs, [lat for _, lat in samples], s=2, alpha=0.35, color="tab:blue", label="one claim + completion")
    shades = {1: "tab:orange", 2: "tab:red"}
    for i, p in enumerate(phases):
        lats = latencies(samples, p)
        if i in shades:
            ax.axvspan(
                p.start - t0, p.end - t0, color=shades[i], alpha=0.12, label=f"{p.name}: {p.end - p.start:.0f} s"
            )
        if lats:
            for q, style in ((50, ":"), (99, "--")):
                v = percentile(lats, q)
                ax.hlines(v, p.start - t0, p.end - t0, colors="black", linestyles=style, linewidth=1)
                ax.annotate(f"p{q} {v:.1f}", (p.start - t0, v), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlim(0, max(xs, default=1))
    ax.set_xlabel("seconds (claims at a fixed rate, pgbench)")
    ax.set_ylabel("claim + completion latency, ms")
    ax.set_title(
        f"A worker joins and the store is rebalanced under claims (p50 dotted, p99 dashed per phase)\n{load}",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=BENCH, help="where citus-rebalance.png goes")
    args = parser.parse_args()
    formation = CitusFormation()
    try:
        formation.wait_whole()
        if len(formation.groups()) > 2:
            log(f"dropping worker group {max(formation.groups())} first: the run adds the third")
            formation.drop_worker(max(formation.groups()))
        prepare_raptor(formation)  # the store (idem migrate), as the soak's
        path = run(formation, args.out)
        log(f"wrote {path}")
    finally:
        formation.destroy()


if __name__ == "__main__":
    main()
