"""What a person, a scheduler or a tool types names idem's objects as ``public.*`` (contract §3a).

A DBA's psql starts with ``search_path = "$user", public``: a schema named like the DBA's role,
made by the database's owner (a member of idem_app), is searched first, and an unqualified
``SELECT idem_erase_user(...)`` runs the owner's look-alike as the DBA. So every command that
idem shows or runs names its routines and relations with their schema. This lint reads:

- ``*.md`` (the tracked ones): fenced code blocks and inline code spans;
- ``sql/**/*.sql`` and ``python/idem_shim/schema/sql/*.sql``: the strings of each ``RAISE``
  statement (its message or format, ``MESSAGE``, ``HINT``, ``DETAIL``: what psql prints);
- ``python/idem_shim/**/*.py`` and ``examples/**/*.py``: every string literal (queries, hints,
  help texts); ``examples/**/*.sh``, ``*.sql``: the whole text;
- ``ops/grafana/*.json``: every string value (queries, expressions).

A finding is a call of an idem routine (its name, then ``(`` at once; or ``CALL name``) or one of idem's
relations after ``FROM``, ``JOIN``, ``INTO``, ``UPDATE`` or ``TABLE``, with no schema before it.
Prose that names a routine without calling it (``idem_claim returns ...``) is not one. The names
are read from the SQL that creates them (``CREATE ... public.name``), so a new routine is covered.

    python scripts/lint_qualified.py          # exit 1 and one line per finding
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_DEFINED_ROUTINE = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+public\.(\w+)", re.I)
_DEFINED_RELATION = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?public\.(\w+)", re.I
)
_STRING = re.compile(r"(?:\b[eE])?'(?:[^']|'')*'")
_RAISE = re.compile(r"\bRAISE\b", re.I)
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    text: str  # what was found: `idem_health`, `CALL idem_cleanup`, `FROM idempotency_keys`

    @property
    def name(self) -> str:
        return self.text.split()[-1].lower()

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: unqualified {self.text!r}: write public.{self.name}"


def _sql_sources() -> list[Path]:
    return sorted(
        {*ROOT.glob("sql/**/*.sql"), *ROOT.glob("sql/migrations/*.py"), *ROOT.glob("python/idem_shim/schema/sql/*.sql")}
    )


def idem_names() -> tuple[set[str], set[str]]:
    """idem's routines and relations in public, as the SQL that creates them names them."""
    text = "\n".join(p.read_text() for p in _sql_sources())
    routines = {m.lower() for m in _DEFINED_ROUTINE.findall(text)}
    relations = {m.lower() for m in _DEFINED_RELATION.findall(text)}
    return routines, relations


class Rules:
    """The patterns for one set of names."""

    def __init__(self, routines: Iterable[str], relations: Iterable[str]) -> None:
        routine = "|".join(sorted(routines, key=len, reverse=True))
        relation = "|".join(sorted(relations, key=len, reverse=True))
        # no schema before the name: not after a dot, a word character or a quote
        self.call = re.compile(rf"(?<![\w.\"$])({routine})\(", re.I)
        self.bare_call = re.compile(rf"\bCALL\s+({routine})\b(?!\s*\.)", re.I)
        self.relation = re.compile(rf"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+(?:ONLY\s+)?({relation})\b(?![.\w\"])", re.I)

    def scan(self, text: str) -> Iterator[tuple[int, str]]:
        """(offset, the unqualified text) for each finding in a piece of SQL or prose."""
        seen: set[int] = set()
        for pattern in (self.call, self.bare_call, self.relation):
            for m in pattern.finditer(text):
                if m.start(1) not in seen:
                    seen.add(m.start(1))
                    yield m.start(1), m.group(0).rstrip("(").strip()


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def markdown_pieces(text: str) -> Iterator[tuple[int, str]]:
    """(offset, text) of each fenced block's body and each inline code span outside them."""
    prose: list[tuple[int, str]] = []
    offset, fence, start = 0, "", 0
    chunk_start, chunk = 0, list[str]()
    for line in text.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence:
            if (
                m
                and m.group(1)[0] == fence[0]
                and len(m.group(1)) >= len(fence)
                and not line.strip()[len(m.group(1)) :]
            ):
                yield start, text[start:offset]
                fence = ""
                chunk_start, chunk = offset + len(line), []
        elif m:
            prose.append((chunk_start, "".join(chunk)))
            fence, start = m.group(1), offset + len(line)
        else:
            chunk.append(line)
        offset += len(line)
    if not fence:
        prose.append((chunk_start, "".join(chunk)))
    for base, body in prose:
        for span in _CODE_SPAN.finditer(body):
            yield base + span.start(2), span.group(2)


def _sql_statement_end(text: str, start: int) -> int:
    """The offset of the ``;`` that ends the statement beginning at start (quotes skipped)."""
    i = start
    while i < len(text):
        if text[i] == "'":
            m = _STRING.match(text, i)
            i = m.end() if m else i + 1
        elif text.startswith("--", i):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        elif text[i] == ";":
            return i
        else:
            i += 1
    return len(text)


def sql_message_pieces(text: str) -> Iterator[tuple[int, str]]:
    """(offset, text) of the string literals of each RAISE statement."""
    for m in _RAISE.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if "--" in text[line_start : m.start()]:
            continue  # in a comment
        statement = text[m.start() : _sql_statement_end(text, m.end())]
        for s in _STRING.finditer(statement):
            yield m.start() + s.start(), s.group(0)


def python_pieces(text: str) -> Iterator[tuple[int, str]]:
    """(offset, value) of each string literal of a Python module (f-strings' text parts too)."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield starts[node.lineno - 1] + node.col_offset, node.value


def json_pieces(text: str) -> Iterator[tuple[int, str]]:
    """(offset of its first occurrence, value) of every string in a JSON document."""

    def walk(value: object) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from walk(v)
        elif isinstance(value, list):
            for v in value:
                yield from walk(v)

    for value in walk(json.loads(text)):
        yield max(text.find(json.dumps(value)[1:-1]), 0), value


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in sorted(set(out.stdout.decode().split("\0"))) if p]  # unmerged: one per stage


def sources() -> Iterator[tuple[Path, str]]:
    """Each file the lint reads and how (markdown, sql, python, json, text)."""
    for p in _tracked("*.md"):
        yield p, "markdown"
    for p in _tracked("sql/*.sql", "python/idem_shim/schema/sql/*.sql"):
        yield p, "sql"
    for p in _tracked("python/idem_shim/*.py", "examples/*.py"):
        yield p, "python"
    for p in _tracked("examples/*.sh", "examples/*.sql"):
        yield p, "text"
    for p in _tracked("ops/grafana/*.json"):
        yield p, "json"


def whole_text(text: str) -> Iterator[tuple[int, str]]:
    yield 0, text


READERS: dict[str, Callable[[str], Iterator[tuple[int, str]]]] = {
    "markdown": markdown_pieces,
    "sql": sql_message_pieces,
    "python": python_pieces,
    "json": json_pieces,
    "text": whole_text,
}


def lint_text(text: str, kind: str, path: str = "<text>", rules: Rules | None = None) -> list[Finding]:
    """The findings in one file's text, read as ``kind``."""
    rules = rules or Rules(*idem_names())
    findings: list[Finding] = []
    for base, piece in READERS[kind](text):
        for offset, found in rules.scan(piece):
            # a string literal's offset points at its start: name the line it begins on, plus the
            # lines inside it when the reader kept its text as written
            inside = piece.count("\n", 0, offset)
            findings.append(Finding(path, _line(text, base) + inside, found))
    return findings


def lint_tree() -> list[Finding]:
    rules = Rules(*idem_names())
    findings: list[Finding] = []
    for path, kind in sources():
        findings.extend(lint_text(path.read_text(), kind, str(path.relative_to(ROOT)), rules))
    return findings


def main() -> int:
    findings = lint_tree()
    for f in findings:
        print(f)
    if findings:
        print(
            f"lint_qualified: {len(findings)} unqualified reference(s) to idem's objects: a DBA's "
            '"$user" schema would shadow them (scripts/lint_qualified.py)',
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
