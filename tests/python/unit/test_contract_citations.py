"""Citations of the contract resolve, and nothing cites a document the repository does not hold.

Code, tests and documents cite docs/contract.md by section ("contract §4d", a list such as
"contract §3, §3a", or a link ``docs/contract.md#4d-the-handlers-writes``). A section renamed or
removed must not leave a citation pointing nowhere, and the design documents idem was first built
from (SPEC, ADR-0138) are not in the repository: history may name them (CHANGES.md), nothing else.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.python.unit.test_doc_links import anchors

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = ROOT / "docs" / "contract.md"

#: Where the old documents may still be named: history, and text copied verbatim from elsewhere.
HISTORY = ("CHANGES.md", "bench/HISTORY.md")
#: This file names what it refuses.
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
VENDORED = ("tests/conformance/",)
#: Applied migrations are history too: what they wrote into a database stays as written (the
#: table's COMMENT, from migration 0002). Each entry is (file, the exact text allowed there).
APPLIED = {("sql/migrations/0002.idempotency-keys.sql", "'ADR-0138 idempotency store: one row per")}

_SECTION = re.compile(r"^#{2,3} §(\w+) ", re.M)
_CITATION = re.compile(r"\b[Cc]ontract(?:'s)?\s+§(\w+)((?:\s*(?:,|/|and|or)\s*§\w+)*)")
_MORE = re.compile(r"§(\w+)")
_LINK = re.compile(r"contract\.md#([\w-]+)")
_OLD = re.compile(r"\bSPEC\b|\bADR\b")


def tracked() -> list[Path]:
    """The repository's text files, as git lists them (binary and vendored files left out)."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if name.startswith(VENDORED) or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def sections() -> set[str]:
    return set(_SECTION.findall(CONTRACT.read_text(encoding="utf-8")))


def cited(text: str) -> list[str]:
    """Every section a text cites as "contract" and a section number (and the numbers listed after it)."""
    found = []
    for m in _CITATION.finditer(text):
        found.append(m.group(1))
        found.extend(_MORE.findall(m.group(2)))
    return found


def test_citations_are_read_as_written() -> None:
    assert cited("contract §4d; the contract's §6 targets") == ["4d", "6"]
    assert cited("(contract §3, §3a, §4) and (contract §8 and §9), contract §4a/§5") == [
        "3", "3a", "4", "8", "9", "4a", "5",
    ]  # fmt: skip
    assert cited("Contract\n§3a's setup; RFC 9110 §5.3") == ["3a"]


def test_the_contract_keeps_the_section_numbers() -> None:
    expected = {"1", "2", "3", "3a", "4", "4a", "4b", "4c", "4d", "4e", "5", "6", "7", "8", "9"}
    assert sections() == expected


def test_every_cited_section_has_a_heading() -> None:
    known = sections()
    dead = []
    for path in tracked():
        for section in cited(path.read_text(encoding="utf-8")):
            if section not in known:
                dead.append(f"{path.relative_to(ROOT)}: contract §{section}")
    assert dead == [], "citations of sections docs/contract.md does not have:\n" + "\n".join(sorted(set(dead)))


def test_every_link_into_the_contract_reaches_a_heading() -> None:
    """Markdown links are checked by test_doc_links.py; this covers code comments and docstrings too."""
    known = anchors(CONTRACT)
    dead = []
    for path in tracked():
        for anchor in _LINK.findall(path.read_text(encoding="utf-8")):
            if anchor not in known:
                dead.append(f"{path.relative_to(ROOT)}: contract.md#{anchor}")
    assert dead == [], "links to headings docs/contract.md does not have:\n" + "\n".join(dead)


def test_nothing_outside_history_cites_spec_or_the_adr() -> None:
    found = []
    for path in tracked():
        name = path.relative_to(ROOT).as_posix()
        if name in HISTORY or name == SELF:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _OLD.search(line) and not any(name == f and text in line for f, text in APPLIED):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    assert found == [], "cite docs/contract.md by its section numbers, not SPEC or ADR-0138:\n" + "\n".join(found)


@pytest.mark.parametrize("heading", sorted(_SECTION.findall(CONTRACT.read_text(encoding="utf-8"))))
def test_each_section_names_the_tests_that_hold_it(heading: str) -> None:
    """A section links its tests (test_doc_figures.py checks that they exist), or says plainly
    that it is not built yet."""
    text = CONTRACT.read_text(encoding="utf-8")
    start = re.search(rf"^#{{2,3}} §{heading} .*$", text, re.M)
    assert start is not None
    nxt = _SECTION.search(text, start.end())
    body = text[start.end() : nxt.start() if nxt else len(text)]
    assert "**Not built yet**" in body or re.search(r"\btests/[\w/]+\.(?:py|sql)\b", body), (
        f"contract §{heading} names no test file and does not say it is not built"
    )
