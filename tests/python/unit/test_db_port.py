"""
A DBA reaches the cluster from any shell: without IDEM_PGPORT, make finds the port of
the checkout's cluster in its data directory; with an IDEM_PGPORT that is not the cluster's,
db.sh says which port the cluster is on instead of failing with "connection refused".
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def env_for(pgdir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("IDEM_PGPORT", "DATABASE_URL", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }
    env.update(IDEM_PGDIR=str(pgdir), **extra)
    return env


def fake_cluster(tmp_path: Path, port: int) -> Path:
    data = tmp_path / "data"
    data.mkdir(parents=True)
    (data / "postgresql.conf").write_text(f"#port = 5432\n# --- idem ---\nport = {port}\n")
    return tmp_path


def test_make_env_finds_the_clusters_port(tmp_path: Path) -> None:
    pgdir = fake_cluster(tmp_path, 54987)
    out = subprocess.run(
        ["make", "-s", "env"], cwd=ROOT, env=env_for(pgdir), text=True, capture_output=True, check=True
    ).stdout
    assert out.strip() == "export DATABASE_URL=postgresql://postgres@127.0.0.1:54987/idem"


def test_a_running_clusters_pid_file_wins(tmp_path: Path) -> None:
    pgdir = fake_cluster(tmp_path, 54987)
    (pgdir / "data" / "postmaster.pid").write_text("4242\n/x/data\n1700000000\n54986\n/x/run\n")
    out = subprocess.run(
        ["bash", "scripts/db.sh", "port"], cwd=ROOT, env=env_for(pgdir), text=True, capture_output=True, check=True
    ).stdout
    assert out.strip() == "54986"


def test_without_a_cluster_the_default_port(tmp_path: Path) -> None:
    out = subprocess.run(
        ["make", "-s", "env"], cwd=ROOT, env=env_for(tmp_path / "none"), text=True, capture_output=True, check=True
    ).stdout
    assert out.strip() == "export DATABASE_URL=postgresql://postgres@127.0.0.1:54329/idem"


def test_a_port_mismatch_says_which_port_the_cluster_is_on(tmp_path: Path) -> None:
    pgdir = fake_cluster(tmp_path, 54987)
    proc = subprocess.run(
        ["bash", "scripts/db.sh", "up"],
        cwd=ROOT,
        env=env_for(pgdir, IDEM_PGPORT="54988"),
        text=True,
        capture_output=True,
    )
    assert proc.returncode == 1
    assert "cluster is on port 54987, not 54988" in proc.stderr and "export IDEM_PGPORT=54987" in proc.stderr
    assert not (pgdir / "data" / "PG_VERSION").exists()  # nothing was created or started
    env = subprocess.run(
        ["make", "-s", "env"], cwd=ROOT, env=env_for(pgdir, IDEM_PGPORT="54988"), text=True, capture_output=True
    )
    assert env.returncode != 0 and "cluster is on port 54987, not 54988" in env.stderr
