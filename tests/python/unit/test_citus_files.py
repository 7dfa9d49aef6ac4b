"""sql/citus/ stays in step with sql/functions/: each file there replaces a routine of the
same name, and the one copied routine (idem_inspect) differs from its original by its join only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CITUS = ROOT / "sql" / "citus"
FUNCTIONS = ROOT / "sql" / "functions"


def _body(text: str) -> str:
    """From the CREATE on, comments dropped: what the database gets."""
    start = text.index("CREATE OR REPLACE")
    return "\n".join(ln for ln in text[start:].splitlines() if not ln.lstrip().startswith("--"))


#: Routines that exist on a distributed store only, each with the reason in its file's header:
#: idem_complete_in_scope is idem_complete delegated to the claim's worker (a SECURITY DEFINER
#: call after the app's own writes would otherwise reach their placements as another role).
CITUS_ONLY = {"021_idem_complete_in_scope.sql"}


def test_every_citus_routine_replaces_one_of_the_same_file_name() -> None:
    for path in sorted(CITUS.glob("*.sql")):
        if path.name == "000_distribute.sql" or path.name in CITUS_ONLY:
            continue
        original = FUNCTIONS / path.name
        assert original.exists(), f"sql/citus/{path.name} replaces no sql/functions/{path.name}"
        name = re.search(r"CREATE OR REPLACE FUNCTION (public\.\w+)\(", path.read_text(encoding="utf-8"))
        assert name is not None
        assert f"CREATE OR REPLACE FUNCTION {name.group(1)}(" in original.read_text(encoding="utf-8")


def test_the_citus_inspect_is_the_original_but_for_its_join_on_the_distribution_column() -> None:
    original = _body((FUNCTIONS / "120_idem_inspect.sql").read_text(encoding="utf-8"))
    copy = _body((CITUS / "120_idem_inspect.sql").read_text(encoding="utf-8"))
    joined = copy.replace(
        "FROM public.idempotency_events e\n             WHERE e.key_id = k.id AND e.scope_user_id = k.scope_user_id)",
        "FROM public.idempotency_events e WHERE e.key_id = k.id)",
    )
    assert joined != copy, "the Citus copy lost its join on the distribution column"
    assert joined == original, "sql/functions/120_idem_inspect.sql changed: make the same change in sql/citus/"


def test_a_citus_only_routine_has_no_single_node_namesake() -> None:
    for name in CITUS_ONLY:
        assert (CITUS / name).exists(), f"sql/citus/{name} is listed but missing"
        routine = re.search(r"CREATE OR REPLACE FUNCTION (public\.\w+)\(", (CITUS / name).read_text(encoding="utf-8"))
        assert routine is not None
        for original in FUNCTIONS.glob("*.sql"):
            assert f"FUNCTION {routine.group(1)}(" not in original.read_text(encoding="utf-8"), original.name
