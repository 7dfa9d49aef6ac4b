"""A checkout in a folder the postgres user cannot enter (root's 0700 home, a ``mktemp -d``):
the pg_auto_failover scripts run their services as postgres, so every command of theirs, not
``up`` alone, must find the same folder under /tmp, whether the folder is the default or named by
``IDEM_HADIR`` / ``IDEM_HA_CITUS_DIR`` (as `make test-chaos-citus` names .ha-citus-test/). Before,
only ``up`` moved there, and the formation's later ``state`` failed with pg_autoctl's
``Failed to create state directory "<checkout>": Permission denied``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the postgres user's reach matters only to root's runs")


@pytest.fixture
def private_checkout() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="idem-private-"))  # 0700, root's
    checkout = home / "idem"
    shutil.copytree(ROOT / "scripts", checkout / "scripts")
    yield checkout
    shutil.rmtree(home)


def postgres_reaches(path: Path) -> bool:
    while not path.is_dir():
        path = path.parent
    return subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(path)]).returncode == 0


@pytest.mark.parametrize(
    ("script", "variable", "named"),
    [
        ("ha.sh", "IDEM_HADIR", None),
        ("ha.sh", "IDEM_HADIR", ".ha-test"),
        ("ha-citus.sh", "IDEM_HA_CITUS_DIR", None),
        ("ha-citus.sh", "IDEM_HA_CITUS_DIR", ".ha-citus-test"),
    ],
)
def test_every_command_finds_a_folder_the_postgres_user_reaches(
    private_checkout: Path, script: str, variable: str, named: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if k != variable}
    if named:
        env[variable] = str(private_checkout / named)
    assert not postgres_reaches(private_checkout), "the fixture's folder must be out of the postgres user's reach"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(private_checkout / "scripts" / script), *args],
            env={**env, "IDEM_PGPORT": "54999"},
            capture_output=True,
            text=True,
            timeout=60,
        )

    folder = Path(run("dir").stdout.strip())
    assert folder.is_absolute() and postgres_reaches(folder), folder
    assert not folder.is_relative_to(private_checkout.parent), folder
    other = subprocess.run(
        ["bash", "-c", f"cd / && bash {private_checkout}/scripts/{script} dir"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(other.stdout.strip()) == folder, "another shell, another cwd: the same folder"
    state = run("state")  # no formation here: pg_autoctl finds no configuration, and says so
    assert "Permission denied" not in state.stderr, state.stderr
