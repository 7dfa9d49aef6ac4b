"""docs/security.md says which test holds each of its statements: every test file it names
exists, and every ``file::test_prefix…`` it names matches a test function in that file. A
statement whose test is renamed or removed fails here, not silently in the document."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
CITED_FILE = re.compile(r"`((?:tests|scripts)/[\w/.]+\.(?:py|sql))`")
CITED_TEST = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)::(test_\w+?)(?:_…|…)?`")


def _test_file(name: str) -> Path:
    direct = ROOT / name
    if direct.exists():
        return direct
    found = sorted(ROOT.glob(f"tests/**/{Path(name).name}"))
    assert found, f"docs/security.md cites {name}, which does not exist"
    return found[0]


def test_every_cited_test_file_exists() -> None:
    cited = CITED_FILE.findall(DOC.read_text(encoding="utf-8"))
    assert len(cited) >= 8
    for name in cited:
        assert (ROOT / name).exists(), f"docs/security.md cites {name}, which does not exist"


def test_every_cited_test_function_exists() -> None:
    cited = CITED_TEST.findall(DOC.read_text(encoding="utf-8"))
    assert len(cited) >= 5
    for file, prefix in cited:
        names = re.findall(r"^def (test_\w+)", _test_file(file).read_text(encoding="utf-8"), re.M)
        assert any(n.startswith(prefix) for n in names), f"{file} has no test starting {prefix!r}"
