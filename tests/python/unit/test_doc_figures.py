"""Figures and paths the documents state that can be computed from the tree, checked against it.

A document that says how many pgTAP assertions there are, or names a test file, goes stale
silently when a test is added or moved; these read the tree and fail with the right figure.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PGTAP = ROOT / "tests" / "pgtap"
DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "sql" / "README.md",
    ROOT / "CHANGES.md",
    ROOT / "bench" / "README.md",
    ROOT / "bench" / "HISTORY.md",
    ROOT / "bench" / "peers" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def pgtap_plans() -> dict[str, int]:
    """pgTAP file -> the number its `SELECT plan(N)` declares (pg_prove fails a file that differs)."""
    plans: dict[str, int] = {}
    for path in sorted(PGTAP.glob("*.sql")):
        found = re.findall(r"SELECT plan\((\d+)\)", path.read_text())
        assert len(found) == 1, f"{path.name}: expected one SELECT plan(N), found {len(found)}"
        plans[path.name] = int(found[0])
    return plans


def test_the_assertion_count_in_docs_testing_is_the_plans_sum() -> None:
    plans = pgtap_plans()
    stated = re.search(r"pgTAP: (\d+) assertions in (\d+) files", (ROOT / "docs" / "testing.md").read_text())
    assert stated, "docs/testing.md no longer states the pgTAP assertion count"
    expected = f"pgTAP: {sum(plans.values())} assertions in {len(plans)} files"
    assert stated.group(0) == expected, f"docs/testing.md says {stated.group(0)!r}: write {expected!r}"


def test_every_test_file_a_document_names_exists() -> None:
    missing = []
    for doc in DOCUMENTS:
        for name in sorted(set(re.findall(r"\btests/[\w/]+\.(?:py|sql)\b", doc.read_text()))):
            if not (ROOT / name).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert missing == [], "documents name test files that do not exist:\n" + "\n".join(missing)


def test_the_packages_the_documents_say_make_demo_installs_are_the_scripts() -> None:
    """README.md and docs/demo.md name the Debian packages of `scripts/ensure-deps.sh demo`
    (what `make demo` installs as root): the script's list, not a copy that drifts."""
    listed = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-deps.sh"), "demo", "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listed, "ensure-deps.sh demo --list printed nothing"
    for doc in (ROOT / "README.md", ROOT / "docs" / "demo.md"):
        text = re.sub(r"\s+", " ", doc.read_text())
        stated = re.findall(r"`scripts/ensure-deps\.sh demo`: `([^`]+)`", text)
        assert stated, f"{doc.relative_to(ROOT)} no longer names the demo's packages"
        assert [s.split() for s in stated] == [listed] * len(stated), f"{doc.relative_to(ROOT)}: {stated} != {listed}"
