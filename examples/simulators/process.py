"""Start a simulator as its own process and talk to it: what `make demo`, tests/e2e and
tests/chaos use (``Simulator("broker", directory).start()``, then ``.url``, ``.faults(...)``,
``.fills()``, ``.stop()``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from examples.raptor.downstream import call

ROOT = Path(__file__).resolve().parents[2]


class Simulator:
    def __init__(self, name: str, directory: str | Path, port: int = 0) -> None:
        if name not in ("broker", "stripe"):
            raise ValueError(f"no simulator {name!r}: broker or stripe")
        self.name = name
        self.dir = Path(directory)
        self.port = port
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    @property
    def db_path(self) -> Path:
        return self.dir / f"{self.name}.sqlite3"

    def start(self, timeout: float = 15.0) -> Simulator:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"examples.simulators.{self.name}",
                "--port",
                str(self.port),
                "--db",
                str(self.db_path),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=(self.dir / f"{self.name}.log").open("ab"),
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()  # "<name> listening on http://127.0.0.1:<port>"
        if " listening on " not in line or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"the {self.name} simulator did not start: {line!r} (log in {self.dir})")
        self.url = line.rsplit(" ", 1)[1].strip()
        return self

    def get(self, path: str) -> Any:
        answer = call(self.url, "GET", path)
        if answer.status != 200:
            raise RuntimeError(f"{self.name} GET {path}: {answer.status} {answer.body}")
        return answer.body

    def faults(self, **switches: int) -> dict[str, Any]:
        """Set fault switches (fail_before_accept, drop_after_accept, delay_ms, delay_count)."""
        answer = call(self.url, "POST", "/_sim/faults", body=json.dumps(switches).encode())
        if answer.status != 200:
            raise RuntimeError(f"{self.name} faults: {answer.status} {answer.body}")
        result: dict[str, Any] = answer.body
        return result

    def fills(self) -> list[dict[str, Any]]:
        fills: list[dict[str, Any]] = self.get("/_sim/fills")["fills"]
        return fills

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
