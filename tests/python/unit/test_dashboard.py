"""ops/grafana/idem.json loads as a Grafana dashboard model and reads only what the shim exports.

Checks: uid, title, integer schemaVersion, panels with unique ids and a grid position; the
subjects the operators asked for each have a panel (outcomes by endpoint, claim latency, store
errors, stale heals, in flight, the cleanup's progress); every panel's and variable's query names
only metrics the shim exports; and every query parses as PromQL (promtool checks them as
recording rules, with Grafana's variables given values).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.python.support.exported_metrics import exported_sample_names, names_in

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "ops" / "grafana" / "idem.json"
PROMTOOL = shutil.which("promtool")
#: Grafana's variables as a query sees them once Grafana has substituted them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$endpoint": ".*"}


def model() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def graph_panels() -> list[dict[str, Any]]:
    return [p for p in model()["panels"] if p["type"] != "row"]


def queries() -> list[str]:
    exprs = [t["expr"] for p in graph_panels() for t in p["targets"]]
    for var in model()["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])
    return exprs


def test_it_is_a_dashboard_model() -> None:
    dash = model()
    assert dash["uid"] == "idem-store" and dash["title"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in dash["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
    for panel in graph_panels():
        assert panel["targets"], f"{panel['title']} has no query"
        assert all(t["refId"] and t["expr"] for t in panel["targets"])


@pytest.mark.parametrize(
    "subject",
    ["Request outcomes by endpoint", "Claim latency", "Store errors", "Stale heals", "In flight", "Cleanup progress"],
)
def test_each_subject_has_a_panel(subject: str) -> None:
    assert subject in {p["title"] for p in graph_panels()}


def test_every_query_names_only_metrics_the_shim_exports() -> None:
    exported = exported_sample_names()
    for expr in queries():
        named = names_in(expr)
        assert named, f"names no idempotency_* metric: {expr}"
        assert named <= exported, f"not exported: {sorted(named - exported)} in {expr}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: make deps installs prometheus")
def test_every_panel_query_parses_as_promql(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rules = []
    for i, panel in enumerate(graph_panels()):
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            rules.append({"record": f"idem_dashboard:panel{i}:{target['refId']}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
