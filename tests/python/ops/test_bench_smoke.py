"""The benchmark's scripts still run: `bench/run.py --smoke` at a tiny size, once.

Times are not checked (the benchmark asserts no timing); only that every part ran and printed
its rows in the Markdown table, and that `--plots` drew its three pictures. Needs pgbench
(postgresql server package); the HTTP parts also need wrk, and report themselves as not run
without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(
    not (shutil.which("pgbench") or Path("/usr/lib/postgresql/15/bin/pgbench").exists()),
    reason="pgbench is not installed",
)
def test_bench_smoke_prints_the_table(admin_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": admin_url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--plots", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-4000:] + out
    assert "| part | figure | value | target | result |" in out
    for part in ("1 SQL", "3 scale", "4 cleanup", "5 race"):
        assert f"| {part} |" in out, f"part {part} missing:\n{out}"
    assert out.startswith("**Server"), "the table opens with the server's settings"
    assert "fsync" in out.splitlines()[0] and "synchronous_commit" in out.splitlines()[0]
    if shutil.which("wrk"):
        assert "| 2 HTTP |" in out and "| 6 memory |" in out, out
        assert "| 2a latency |" in out and "| 2b round trips |" in out, out
    assert "could not run" not in out, out
    assert "| 5 race | double executions | 0 " in out, out
    # The pictures, each a PNG (matplotlib is in the test venv: requirements.txt's bench group).
    expected = {"cleanup-over-time-smoke.png", "ratios-smoke.png"}
    if shutil.which("wrk"):
        expected.add("latency-one-client-smoke.png")
    assert {p.name for p in tmp_path.glob("*.png")} == expected, out
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, png
