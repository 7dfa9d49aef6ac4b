"""What one machine can show of a formation that grows (docs/scaling.md "What one machine shows"):
per-node CPU per claim, and the claim's latency before, during and after a worker joins and the
store is rebalanced onto it.

    make bench-citus-ha          # a private formation; bench/citus-rebalance.png, figures on stdout
    IDEM_HA_CITUS_REUSE=1 make bench-citus-ha   # on the formation of make ha-citus-up (2 groups)

One pgbench run at a fixed rate (RATE claims/s, CLIENTS clients, bench/pgbench/fn_claim_complete.sql:
a claim and its completion, as the shim sends them, over USERS users) against the coordinator of a
formation of two worker groups (each a primary and its synchronous standby). After BEFORE seconds a
third worker group joins (scripts/ha-citus.sh add-worker) and the store is rebalanced onto it
(citus_rebalance_start, force_logical); the run goes on AFTER seconds past the rebalance's end.

- CPU per claim, per node: the CPU time (user + system) of each PostgreSQL server's processes (the
  postmaster, its live children, and the children that exited meanwhile), over the claims completed
  in the same window: before the join (two workers) and after the rebalance (three);
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

from bench.common import PgbenchRun, log, percentile, pgbench
from tests.python.e2e.citus_ha_harness import DB, CitusFormation, prepare_raptor

BENCH = Path(__file__).resolve().parent
RATE = 60  # claims/s: the formation keeps it on two shared cores, so latency is not queueing
CLIENTS = 4
USERS = 10_000
BEFORE, AFTER = 30.0, 30.0
MAX_RUN = 420  # pgbench's -T: the join and the rebalance must end within it, AFTER seconds left


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
    end: dict[str, float] = field(default_factory=dict)
    claims: int = 0

    def per_claim_ms(self) -> dict[str, float]:
        return {n: (self.end[n] - self.start[n]) * 1000.0 / max(1, self.claims) for n in self.end if n in self.start}


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


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: float  # epoch seconds
    end: float


def run(formation: CitusFormation, out: Path) -> Path:
    url = formation.url(DB)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.users (id) SELECT g FROM generate_series(1, %s) g ON CONFLICT DO NOTHING", (USERS,)
        )
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    result: dict[str, PgbenchRun] = {}
    failure: list[BaseException] = []

    def drive() -> None:
        try:
            result["run"] = pgbench(
                url, "fn_claim_complete", clients=CLIENTS, seconds=MAX_RUN, rate=RATE, logged=True, threads=2
            )
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    driver = threading.Thread(target=drive)
    t0 = time.time()
    driver.start()
    time.sleep(5.0)  # connections made, caches warm
    if failure or not driver.is_alive():
        driver.join()
        raise RuntimeError(f"pgbench did not run: {failure}")
    cpu_before = CpuWindow("two workers", snapshot(formation))
    before_start = time.time()
    time.sleep(BEFORE)
    cpu_before.end = snapshot(formation)
    joined = time.time()
    group = formation.add_worker()
    added = time.time()
    rebalanced = formation.run("rebalance", timeout=900)
    if rebalanced.returncode != 0:
        raise RuntimeError(f"the rebalance failed: {rebalanced.stderr}")
    done = time.time()
    time.sleep(3.0)
    cpu_after = CpuWindow("three workers", snapshot(formation))
    after_start = time.time()
    if after_start + AFTER > t0 + MAX_RUN:
        raise RuntimeError(f"the join and the rebalance took {done - joined:.0f} s: raise MAX_RUN")
    time.sleep(AFTER)
    cpu_after.end = snapshot(formation)
    driver.join()
    if failure:
        raise failure[0]
    samples = result["run"].samples  # (end epoch, latency ms)
    cpu_before.claims = sum(1 for end, _ in samples if before_start <= end < joined)
    cpu_after.claims = sum(1 for end, _ in samples if after_start <= end < after_start + AFTER)
    phases = [
        Phase("before (2 workers)", before_start, joined),
        Phase(f"worker group {group} joins", joined, added),
        Phase("rebalance (force_logical)", added, done),
        Phase("after (3 workers)", done, samples[-1][0] if samples else done),
    ]
    report(phases, samples, [cpu_before, cpu_after], load, rebalanced.stderr.strip().splitlines()[-1])
    return plot(phases, samples, load, out / "citus-rebalance.png")


def latencies(samples: list[tuple[float, float]], phase: Phase) -> list[float]:
    return [lat for end, lat in samples if phase.start <= end - lat / 1000.0 < phase.end]


def report(
    phases: list[Phase], samples: list[tuple[float, float]], cpu: list[CpuWindow], load: str, rebalance: str
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
    nodes = sorted({n for w in cpu for n in w.per_claim_ms()})
    print("| node | " + " | ".join(f"CPU per claim, {w.label} ({w.claims} claims)" for w in cpu) + " |")
    print("| --- |" + " --- |" * len(cpu))
    for n in nodes:
        cells = [f"{w.per_claim_ms()[n]:.3f} ms" if n in w.per_claim_ms() else "–" for w in cpu]
        print(f"| {n} | " + " | ".join(cells) + " |")


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
