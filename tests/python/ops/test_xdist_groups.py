"""
Tests that share a named resource carry ``xdist_group(name)`` (the docs' scratch databases,
pg_cron's own job): no two of one group may run at once, whatever worker each lands on. A probe
of two such tests runs under make test-py's own options (``-n 2 --dist loadgroup``) with this
suite's conftest, and each of them fails if it finds the other inside.

A fresh-clone CI met the failure this guards against: docs/adopting.md's database vanished
half-way because docs/operations.md's cookbook, on another worker, dropped the docs' scratch
databases as it ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: Each test marks itself inside, then watches for up to 3 s whether the other is inside too, and
#: stops watching early once the other has finished. Run one after the other, neither ever sees
#: the other inside; run at once on two workers (they start together), the first to look does.
PROBE = """
import os
import time
from pathlib import Path

import pytest

SHARED = Path(os.environ["IDEM_GROUP_PROBE_DIR"])
GROUP = os.environ["IDEM_GROUP_PROBE_NAME"]


def inside(me: str, other: str) -> None:
    (SHARED / f"inside-{me}").touch()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not (SHARED / f"done-{other}").exists():
            assert not (SHARED / f"inside-{other}").exists(), f"test_{other} runs while test_{me} does"
            time.sleep(0.05)  # the probe's window is the thing tested: how long it looks for the other
    finally:
        (SHARED / f"inside-{me}").unlink()
        (SHARED / f"done-{me}").touch()


@pytest.mark.xdist_group(GROUP)
def test_one() -> None:
    inside("one", "two")


@pytest.mark.xdist_group(GROUP)
def test_two() -> None:
    inside("two", "one")
"""


@pytest.mark.slow
def test_two_tests_of_one_group_never_run_at_once(admin_url: str, tmp_path: Path) -> None:
    probe, shared = tmp_path / "probe", tmp_path / "shared"
    probe.mkdir()
    shared.mkdir()
    (probe / "pytest.ini").write_text("[pytest]\n")  # the probe's own rootdir: none of the project's options
    (probe / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this worker's
    env.update(
        DATABASE_URL=admin_url,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'python'}",
        IDEM_GROUP_PROBE_DIR=str(shared),
        IDEM_GROUP_PROBE_NAME=f"probe {uuid.uuid4().hex[:8]}",  # its own group: waits for no real one
    )
    pytest_args = ["-q", "-p", "no:cacheprovider", "-p", "tests.python.conftest"]  # this suite's conftest
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, "-n", "2", "--dist", "loadgroup", "test_probe.py"],
        cwd=probe,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


#: The same watch, for a test marked ``alone`` and one with no mark at all.
ALONE_PROBE = PROBE.replace(
    "@pytest.mark.xdist_group(GROUP)\ndef test_one", "@pytest.mark.alone\ndef test_one"
).replace("@pytest.mark.xdist_group(GROUP)\ndef test_two", "def test_two")


@pytest.mark.slow
def test_a_test_marked_alone_runs_beside_no_other(admin_url: str, tmp_path: Path) -> None:
    """One stops a Citus worker for every database of the cluster: the unmarked test on the other
    worker must not run meanwhile, nor it beside that one."""
    assert "@pytest.mark.alone" in ALONE_PROBE and ALONE_PROBE.count("xdist_group(GROUP)") == 0
    probe, shared = tmp_path / "probe", tmp_path / "shared"
    probe.mkdir()
    shared.mkdir()
    (probe / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: runs beside no other test\n")
    (probe / "test_probe.py").write_text(ALONE_PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        DATABASE_URL=admin_url,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'python'}",
        IDEM_GROUP_PROBE_DIR=str(shared),
        IDEM_GROUP_PROBE_NAME="unused",
        # its own server lock: this test, inside a run that may hold the real one shared, must not
        # keep its probe's alone test waiting (it did, for the probe's whole timeout, in a CI run)
        IDEM_TESTS_SERVER_LOCK=f"probe server {uuid.uuid4().hex[:8]}",
    )
    pytest_args = ["-q", "-p", "no:cacheprovider", "-p", "tests.python.conftest"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, "-n", "2", "--dist", "load", "test_probe.py"],
        cwd=probe,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


#: A run whose only ``alone`` test a mark skips: the other test looks for a session holding the
#: run's server lock (its own included), and finds none.
SKIPPED_ALONE = """
import os

import psycopg
import pytest


@pytest.mark.skipif(True, reason="as test_citus.py's tests outside make test-citus")
@pytest.mark.alone
def test_alone_but_skipped() -> None:
    pass


def test_plain() -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        holders = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            ("idem tests: " + os.environ["IDEM_TESTS_SERVER_LOCK"] + "%",),
        ).fetchone()
    assert holders == (0,), "a test took the server's lock in a run whose alone test is skipped"
"""


def test_a_run_whose_alone_test_is_skipped_takes_no_server_lock(admin_url: str, tmp_path: Path) -> None:
    """test_citus.py's alone test is collected, and skipped, in make test-py: the whole run took the
    server's lock shared, and the skipped test took it exclusively, holding every worker up (CI's
    test-py went from 390 s to 490 s) and a probe in it for its whole timeout."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: runs beside no other test\n")
    (tmp_path / "test_probe.py").write_text(SKIPPED_ALONE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        DATABASE_URL=admin_url,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'python'}",
        IDEM_TESTS_SERVER_LOCK=f"probe server {uuid.uuid4().hex[:8]}",
    )
    pytest_args = ["-q", "-p", "no:cacheprovider", "-p", "tests.python.conftest"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, "-n", "0", "test_probe.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "1 passed, 1 skipped" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


#: A test of a group whose lock's session is ended while it runs (pg_terminate_backend).
LOSES_ITS_LOCK = """
import os

import psycopg
import pytest


@pytest.mark.xdist_group(os.environ["IDEM_GROUP_PROBE_NAME"])
def test_loses_its_lock() -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            ("idem tests: " + os.environ["IDEM_GROUP_PROBE_NAME"],),
        ).fetchone()
    assert ended == (1,)
"""


def test_a_test_whose_lock_was_lost_while_it_ran_fails(admin_url: str, tmp_path: Path) -> None:
    """Had the lock's session ended under a test, another of its group could have run at once:
    the test's teardown says so instead of passing."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_probe.py").write_text(LOSES_ITS_LOCK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        DATABASE_URL=admin_url,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'python'}",
        IDEM_GROUP_PROBE_NAME=f"probe {uuid.uuid4().hex[:8]}",
    )
    pytest_args = ["-q", "-p", "no:cacheprovider", "-p", "tests.python.conftest"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, "-n", "0", "test_probe.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 1 and "1 passed, 1 error" in out, out[-4000:] + run.stderr[-2000:]
    assert "ERROR at teardown of test_loses_its_lock" in out and "was lost while the test ran" in out, out[-4000:]
