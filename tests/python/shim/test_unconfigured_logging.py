"""The shim's log lines in a process whose logging nobody configured: Python's last resort
printed `idempotency mismatch endpoint=...` bare (no time, level or source), and dropped the
rest. They now carry the time, the pid, the level and the logger, on stderr; once the app
configures logging, each line is printed once, by the app's handler.

Run in a subprocess: pytest configures the root logger in its own.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.python.support.shim import shim_db

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """\
    import logging, sys, uuid
    from flask import Flask
    from idem_shim import Idem, connection, idempotency_key

    app = Flask(__name__)
    app.config["IDEM_DATABASE_URL"] = sys.argv[1]

    @app.post("/orders")
    @idempotency_key(service=True)
    def place_order():
        connection().execute("SELECT 1")  # work on the request's connection: no "ran nothing" line
        return {}, 201

    Idem(app)
    client, key = app.test_client(), str(uuid.uuid4())
    client.post("/orders", json={"qty": 1}, headers={"Idempotency-Key": key})
    client.post("/orders", json={"qty": 2}, headers={"Idempotency-Key": key})  # a mismatch: a WARNING
    if sys.argv[2] == "configured":
        logging.basicConfig(format="APP %(levelname)s %(name)s %(message)s")
        client.post("/orders", json={"qty": 3}, headers={"Idempotency-Key": key})
    """
)


def _stderr(url: str, mode: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, mode],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'python'}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return [line for line in run.stderr.splitlines() if line.strip()]


def test_a_line_says_when_what_and_who_without_logging_configured(fresh_admin_url: str) -> None:
    lines = _stderr(shim_db(fresh_admin_url), "bare")
    assert len(lines) == 1, lines
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[\d+\] \[WARNING\] idem_shim: "
        r'idempotency mismatch endpoint="POST /orders" key=\w{4} key_id=\d+',
        lines[0],
    ), lines[0]


def test_once_the_app_configures_logging_each_line_is_printed_once_by_it(fresh_admin_url: str) -> None:
    lines = _stderr(shim_db(fresh_admin_url), "configured")
    assert len(lines) == 2, lines
    assert lines[0].startswith("[") and "[WARNING] idem_shim: idempotency mismatch" in lines[0], lines
    assert lines[1].startswith("APP WARNING idem_shim idempotency mismatch"), lines
