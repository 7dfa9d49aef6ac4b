"""ops/prometheus/idem-rules.yml: what promtool cannot check about our rules.

Every alert has a ``for:``, a severity, a summary and a runbook link to a section of
docs/operations.md that exists; it has a unit-test file in ops/prometheus/tests/ that names it,
both firing and silent; its expression names only metrics the shim exports. And a malformed rules
file fails promtool with promtool's own message (what `make test-rules` shows). promtool's own
check and unit tests run in `make test-rules`; here, once more, so a failure shows in pytest too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.python.support.exported_metrics import exported_sample_names, names_in

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "ops" / "prometheus" / "idem-rules.yml"
RULE_TESTS = sorted((ROOT / "ops" / "prometheus" / "tests").glob("*.test.yml"))
RUNBOOK = ROOT / "docs" / "operations.md"
SEVERITIES = {"critical", "warning", "info"}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: make deps installs prometheus")


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub makes them: lower case, punctuation dropped, spaces to dashes."""
    anchors = set()
    for line in markdown.splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return anchors


ALERTS = alerts()


def test_the_rules_file_holds_the_alerts_the_runbook_describes() -> None:
    assert {a["alert"] for a in ALERTS} == {
        "IdemStoreErrors",
        "IdemStoreGaugesDown",
        "IdemStaleHeals",
        "IdemClaimLatencyHigh",
        "IdemReplayRatioHigh",
        "IdemCleanupNotRunning",
        "IdemExpiredRowsLeft",
        "IdemRowsStuckInFlight",
    }


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_each_alert_has_a_for_a_severity_and_a_runbook_section(alert: dict[str, Any]) -> None:
    assert re.fullmatch(r"\d+[smhd]", str(alert.get("for", ""))), "no for: duration"
    assert alert["labels"]["severity"] in SEVERITIES
    assert alert["annotations"]["summary"]
    path, _, anchor = alert["annotations"]["runbook_url"].partition("#")
    assert path == "docs/operations.md"
    assert anchor == alert["alert"].lower()
    assert anchor in github_anchors(RUNBOOK.read_text()), f"docs/operations.md has no section #{anchor}"


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_each_alert_has_a_unit_test_that_fires_it_and_one_that_does_not(alert: dict[str, Any]) -> None:
    name = alert["alert"]
    cases = [
        case
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == name
    ]
    assert any(case["exp_alerts"] for case in cases), f"no unit test fires {name}"
    assert any(not case["exp_alerts"] for case in cases), f"no unit test keeps {name} silent"


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_each_alert_names_only_metrics_the_shim_exports(alert: dict[str, Any]) -> None:
    named = names_in(alert["expr"])
    assert named, "the expression names no idempotency_* metric"
    assert named <= exported_sample_names(), f"not exported: {sorted(named - exported_sample_names())}"


@needs_promtool
def test_promtool_checks_and_tests_the_rules() -> None:
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True, check=False
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_a_malformed_rules_file_fails_with_promtools_message(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    broken = tmp_path / "idem-rules.yml"
    broken.write_text(
        RULES.read_text().replace("rate(idempotency_store_errors_total", "rate(idempotency_store_errors_total[", 1)
    )

    result = subprocess.run([PROMTOOL, "check", "rules", str(broken)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    said = result.stdout + result.stderr
    assert '"IdemStoreErrors": could not parse expression' in said, said
