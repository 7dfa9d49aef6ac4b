"""bench/outage.py still runs (`make bench-outage`): one short outage on one worker, so the script
cannot rot between the runs whose figures bench/README.md quotes. Nothing here judges a figure
(test_outage.py asserts the behaviour); the run must print each of its lines, with the breaker's
one store_down and one store_back line for its one worker."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.http_path import wrk_bin
from tests.python.e2e.e2e_harness import ROOT


@pytest.mark.skipif(not wrk_bin(), reason="wrk is missing (apt-get install wrk: make deps)")
def test_the_outage_bench_prints_each_phase() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.outage", "1", "1", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert re.search(r"\[this shim\] store up, 1 s: [\d,]+ answers/s", out), out
    assert re.search(r"\[this shim\] outage 1, 1 s, store down: [\d,]+ answers/s", out), out
    restart = re.search(r"\[this shim\] restart 1: first 201 (\d+) ms after", out)
    assert restart, out
    assert "[this shim] log: store_down per worker [1], store_back [1]," in out, out
