"""
Executable documentation: runs the command blocks of a Markdown document in order and compares
their output with what the document shows (tests/python/ops/test_docs.py drives it).

The blocks a document may hold, by fence info string:

- ```psql     a psql transcript: lines that begin with psql's prompt (`idem=# `, continuation
              `idem-# `) are typed, everything else is what psql printed. The typed lines of one
              block run in one psql session (`psql -X -a`, so psql echoes them as it reads them),
              and the output must match the block with its prompts removed.
- ```console  a shell transcript: `$ command` lines run one by one (bash, repository root,
              with the setup blocks before them), the lines after each are its output
              (stdout and stderr together); a non-zero exit must show as `[exit N]`; a
              `$ export …` holds for the commands after it, as in a terminal. A command
              with a here-document (`$ python - <<'EOF'`) takes the lines up to its
              terminator as its input; its output follows the terminator.
- ```bash     setup that runs and must succeed (exports, variables); its output is not shown.
- ```sql      statements that must run without an error (psql, ON_ERROR_STOP); no output shown.

A block is skipped when the paragraph right before it says so where a reader sees it: a line
that begins with `Not run by the docs test:` followed by the reason. Other fences (python,
text, plain) are prose.

Expected output may use two wildcards: `…` inside a line stands for any text, and a line that
is only `...` for any number of lines. Both sides go through `normalise()` first: timestamps,
intervals, durations, plan costs and the spacing of psql's aligned columns may differ.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROMPT = re.compile(r"^[a-z_][a-z0-9_]*[=\-'\"(][#>] ?")
NOT_RUN = re.compile(r"^\W*not run by the docs test:", re.IGNORECASE)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


@dataclass
class Block:
    kind: str
    lines: list[str]
    line_no: int  # 1-based line of the opening fence
    indent: str = ""
    skipped: str | None = None


@dataclass
class Result:
    block: Block
    expected: list[str]
    actual: list[str]
    ok: bool
    notes: list[str] = field(default_factory=list)


def parse(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with the skip marker of each."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, kind = m.group(1), m.group(2)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        # the paragraph before the fence: the non-blank lines just above it
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        para: list[str] = []
        while j >= 0 and lines[j].strip() and not lines[j].lstrip().startswith("```"):
            para.insert(0, lines[j].strip())
            j -= 1
        skipped = None
        for k, p in enumerate(para):
            if NOT_RUN.match(p):
                skipped = " ".join(para[k:])
        blocks.append(Block(kind, body, start + 1, indent, skipped))
    return blocks


_TS = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?([+-]\d\d(:\d\d)?)?")
_INTERVAL = re.compile(r"(\d+ days?,? )?-?\d{1,2}:\d\d:\d\d(\.\d+)?")
_DURATION = re.compile(r"\d+(\.\d+)? ?(ms|s)\b")
_COST = re.compile(r"cost=[\d.]+\.\.[\d.]+ rows=\d+ width=\d+")


def normalise(line: str) -> str:
    line = _TS.sub("<ts>", line)
    line = _INTERVAL.sub("<interval>", line)
    line = _DURATION.sub("<duration>", line)
    line = _COST.sub("cost=<cost>", line)
    line = re.sub(r"-{2,}", "--", line)
    line = re.sub(r"\s+", " ", line).strip()
    return line


def _line_matches(expected: str, actual: str) -> bool:
    e, a = normalise(expected), normalise(actual)
    if "…" not in e:
        return e == a
    pattern = ".*".join(
        re.escape(part.strip()) if k in (0, e.count("…")) else re.escape(part) for k, part in enumerate(e.split("…"))
    )
    return re.fullmatch(pattern, a) is not None


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line after normalise(); `…` in a line and a `...` line are wildcards."""
    exp = [e for e in expected if e.strip()]
    act = [a for a in actual if a.strip()]

    def walk(i: int, j: int) -> bool:
        while i < len(exp):
            if exp[i].strip() == "...":
                return any(walk(i + 1, k) for k in range(j, len(act) + 1))
            if j >= len(act) or not _line_matches(exp[i], act[j]):
                return False
            i, j = i + 1, j + 1
        return j == len(act)

    return walk(0, 0)


class Runner:
    """Runs a document's blocks in order against one database (env DATABASE_URL given)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.setup: list[str] = []

    def psql(self, text: str, *extra: str) -> tuple[int, list[str]]:
        proc = subprocess.run(
            ["psql", "-X", *extra, self.env["DATABASE_URL"]],
            input=text,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
            timeout=300,
        )
        return proc.returncode, proc.stdout.splitlines()

    def shell(self, command: str) -> tuple[int, list[str]]:
        script = "\n".join([*self.setup, command])
        proc = subprocess.run(
            ["bash", "-c", script],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
            timeout=600,
        )
        return proc.returncode, proc.stdout.splitlines()

    def export(self, command: str) -> tuple[int, list[str]]:
        """`$ export X=$(…)` holds for the commands after it, with the value it got once."""
        with tempfile.NamedTemporaryFile() as state:
            rc, out = self.shell(f"{command}\nenv -0 > {state.name}")
            if rc == 0:
                env = dict(
                    item.split("=", 1) for item in Path(state.name).read_bytes().decode().split("\0") if "=" in item
                )
                for name in ("SHLVL", "_", "PWD", "OLDPWD"):
                    env.pop(name, None)
                self.env = env
        return rc, out

    def run(self, block: Block) -> Result | None:
        if block.skipped or block.kind not in ("psql", "console", "bash", "sql"):
            return None
        if block.kind == "psql":
            typed = [PROMPT.sub("", ln, count=1) for ln in block.lines if PROMPT.match(ln)]
            expected = [PROMPT.sub("", ln, count=1) for ln in block.lines]
            _, actual = self.psql("\n".join(typed) + "\n", "-a")
            return Result(block, expected, actual, matches(expected, actual))
        if block.kind == "sql":
            rc, out = self.psql("\n".join(block.lines) + "\n", "-q", "-v", "ON_ERROR_STOP=1")
            return Result(block, [], out, rc == 0, [] if rc == 0 else [f"psql exited {rc}"])
        if block.kind == "bash":
            rc, out = self.shell("set -e\n" + "\n".join(block.lines))
            if rc == 0:
                self.setup.append("\n".join(block.lines))
            return Result(block, [], out, rc == 0, [] if rc == 0 else [f"bash exited {rc}"])
        # console: `$ cmd` then its output
        expected = []
        actual = []
        ok = True
        command: str | None = None
        out_lines: list[str] = []

        def flush() -> None:
            nonlocal ok
            if command is None:
                return
            if command.startswith("export "):
                rc, out = self.export(command)
            else:
                rc, out = self.shell(command)
            if rc != 0:
                out = [*out, f"[exit {rc}]"]
            shown = ("$ " + command).split("\n")
            expected.extend([*shown, *out_lines])
            actual.extend([*shown, *out])
            ok = ok and matches(out_lines, out)

        lines = iter(block.lines)
        for line in lines:
            if line.startswith("$ "):
                flush()
                command, out_lines = line[2:], []
                heredoc = HEREDOC.search(command)
                if heredoc:  # the here-document's lines are the command's input, not its output
                    strip_tabs, word = heredoc.group(1) == "-", heredoc.group(3)
                    for body in lines:
                        command += "\n" + body
                        if (body.lstrip("\t") if strip_tabs else body) == word:
                            break
            else:
                out_lines.append(line)
        flush()
        return Result(block, expected, actual, ok)


def base_env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "IDEM_RESPONSE_KEY"))}
    env.update(
        DATABASE_URL=database_url,
        PGTZ="UTC",
        LC_ALL="C.UTF-8",
        COLUMNS="200",
        PAGER="",
        PSQL_PAGER="",
        PYTHONPATH=f"{ROOT / 'python'}:{ROOT}",
    )
    env.pop("MAKEFLAGS", None)
    env.pop("MAKELEVEL", None)
    return env


def section(text: str, heading: str) -> str:
    """The text of one `## heading` section (up to the next `## `)."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == heading
            continue
        if inside:
            out.append(line)
    return "\n".join(out)


def report(doc: str, results: list[Result]) -> str:
    lines: list[str] = []
    for r in results:
        if r.ok:
            continue
        lines.append(
            f"{doc}:{r.block.line_no}: ```{r.block.kind} block differs from what it runs"
            + (f" ({'; '.join(r.notes)})" if r.notes else "")
        )
        lines.extend(
            "  " + x.rstrip("\n")
            for x in difflib.unified_diff(
                r.expected, r.actual, "the document shows", "the run printed", lineterm="", n=2
            )
        )
    return "\n".join(lines)


def rewrite(path: Path, results: list[Result]) -> None:
    """IDEM_DOCS_UPDATE=1: write what each failing psql/console block printed into the
    document (prompts restored), for a human to review with git diff."""
    lines = path.read_text().splitlines()
    for r in sorted(results, key=lambda r: -r.block.line_no):
        if r.ok or r.block.kind not in ("psql", "console"):
            continue
        start = r.block.line_no  # index of the first body line
        end = start + len(r.block.lines)
        if r.block.kind == "psql":
            typed = [ln for ln in r.block.lines if PROMPT.match(ln)]
            body, pending = [], list(typed)
            for ln in r.actual:
                if pending and PROMPT.sub("", pending[0], count=1) == ln:
                    body.append(pending.pop(0))
                else:
                    body.append(ln.rstrip())
        else:
            body = [ln.rstrip() for ln in r.actual]
        while body and not body[-1].strip():
            body.pop()
        lines[start:end] = [r.block.indent + ln if ln else ln for ln in body]
    path.write_text("\n".join(lines) + "\n")
