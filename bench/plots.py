"""The benchmark as pictures (matplotlib, a bench-only dependency): `bench/run.py --plots DIR`.

Three PNGs, each titled with the run it was drawn from (mode, time, load):
- `latency-one-client[-MODE].png`: part 2a's one-client latency distribution, decorated against
  undecorated, one percentile curve per run (wrk's percentiles, fresh.lua's done());
- `cleanup-over-time[-MODE].png`: every claim's latency against time across part 4's cleanups
  (default pace and unpaced), the cleanup's window shaded, its p99 before and during drawn;
- `ratios[-MODE].png`: every ratio of the table that has a contract §6 target, as bars beside it.
The full run (`make bench`) writes the names without a suffix; bench/README.md shows them.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

from bench.common import Report, percentile


def write_all(report: Report, run_label: str, out_dir: Path, suffix: str) -> list[Path]:
    """Draw what the report holds; return the files written (a missing part draws nothing)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    run_label = "\n".join(textwrap.wrap(run_label, 110))  # the run's name, whole, in every title
    written: list[Path] = []
    if "latency" in report.data:
        written.append(_latency(report.data["latency"], run_label, out_dir / f"latency-one-client{suffix}.png"))
    if "cleanup" in report.data:
        written.append(_cleanup(report.data["cleanup"], run_label, out_dir / f"cleanup-over-time{suffix}.png"))
    ratios = _ratios_of(report)
    if ratios:
        written.append(_ratios(ratios, run_label, out_dir / f"ratios{suffix}.png"))
    return written


def _latency(runs: tuple[list[dict[float, float]], list[dict[float, float]]], label: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    decorated, undecorated = runs
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for curves, colour, name in ((undecorated, "tab:blue", "undecorated"), (decorated, "tab:orange", "decorated")):
        for i, curve in enumerate(curves):
            if not curve:
                continue
            points = sorted(curve.items())
            ax.plot(
                [ms for _, ms in points],
                [p for p, _ in points],
                color=colour,
                alpha=0.6,
                linewidth=1,
                label=f"{name} ({len(curves)} runs)" if i == 0 else None,
            )
    ax.set_xscale("log")
    ax.set_xlabel("request latency, ms (log scale)")
    ax.set_ylabel("percentile")
    ax.set_title(f"One client, single-INSERT route: decorated vs undecorated\n{label}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cleanup(runs: list[Any], label: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), sharey=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        t0 = run.start
        xs = [ended - lat / 1000.0 - t0 for ended, lat in run.samples]
        ys = [lat for _, lat in run.samples]
        ax.scatter(xs, ys, s=2, alpha=0.4, color="tab:blue", label="one claim")
        ax.axvspan(
            0, run.end - t0, color="tab:red", alpha=0.12, label=f"cleanup: {run.deleted:,} rows, {run.seconds:.1f} s"
        )
        b99, d99 = percentile(run.before.latencies, 99), percentile(run.during, 99)
        ax.axhline(b99, color="tab:green", linestyle="--", linewidth=1, label=f"p99 before {b99:.2f} ms")
        ax.axhline(
            d99, color="tab:red", linestyle="--", linewidth=1, label=f"p99 during {d99:.2f} ms ({run.ratio:.2f}×)"
        )
        ax.set_yscale("log")
        ax.set_ylabel("claim latency, ms")
        ax.set_title(f"{run.call}", fontsize=9, family="monospace")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the cleanup started (claims at a fixed rate, pgbench)")
    fig.suptitle(f"Claim latency across the cleanup\n{label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_RATIO = re.compile(r"^(\d+(?:\.\d+)?)×$")
_TARGET = re.compile(r"^([≥≤])\s*(\d+(?:\.\d+)?)×$")


def _ratios_of(report: Report) -> list[tuple[str, float, str, float]]:
    """(figure, measured, direction, target) of every row whose value and target are ratios."""
    found = []
    for row in report.rows:
        value, target = _RATIO.match(row.value.strip()), _TARGET.match(row.target.strip())
        if value and target:
            found.append((f"{row.part}: {row.figure}", float(value.group(1)), target.group(1), float(target.group(2))))
    return found


def _ratios(ratios: list[tuple[str, float, str, float]], label: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(ratios) + 1.8))
    names = [_short(name) for name, *_ in ratios]
    ys = range(len(ratios))
    colours = [
        "tab:green" if (value >= target if direction == "≥" else value <= target) else "tab:red"
        for _, value, direction, target in ratios
    ]
    ax.barh(list(ys), [value for _, value, _, _ in ratios], color=colours, alpha=0.8)
    for y, (_, value, direction, target) in zip(ys, ratios, strict=True):
        ax.plot([target, target], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax.annotate(
            f"{value:.2f}× (target {direction} {target:g}×)",
            (value, y),
            xytext=(4, -3),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("measured ratio (bar; green meets the target) against contract §6's target (black mark)")
    ax.set_title(f"Ratios against the contract §6 targets\n{label}", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"
