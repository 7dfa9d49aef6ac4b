"""Every relative link of the repository's Markdown reaches a file, and its ``#anchor`` a heading
of that file (GitHub's slugs): moving a section out of the README, or renumbering one, must not
leave a reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = sorted(
    p
    for pattern in ("*.md", "docs/*.md", "sql/*.md", "bench/**/*.md", "examples/**/*.md", "ops/**/*.md")
    for p in ROOT.glob(pattern)
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _FENCE.sub("", path.read_text()).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_the_slug_is_githubs() -> None:
    assert slug("The peers side by side (`make bench-peers`)") == "the-peers-side-by-side-make-bench-peers"
    assert slug("10. A Citus worker: failed") == "10-a-citus-worker-failed"


def test_every_relative_link_and_anchor_resolves() -> None:
    dead = []
    for doc in DOCUMENTS:
        for target in _LINK.findall(_FENCE.sub("", doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                dead.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                dead.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert dead == [], "dead links:\n" + "\n".join(dead)
