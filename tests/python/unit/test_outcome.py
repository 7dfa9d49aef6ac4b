"""The shim's ``Outcome`` enum is idem_claim's closed set of outcomes, no more, no less.
No database needed: the outcomes are read from the function's own RETURN ROW(...) lines."""

from __future__ import annotations

import re
from pathlib import Path

from idem_shim.metrics import HIT_OUTCOMES
from idem_shim.outcome import Outcome

CLAIM_SQL = Path(__file__).resolve().parents[3] / "sql" / "functions" / "010_idem_claim.sql"


def test_the_enum_is_exactly_what_idem_claim_returns() -> None:
    returned = set(re.findall(r"RETURN ROW\('([a-z_]+)'", CLAIM_SQL.read_text(encoding="utf-8")))
    assert returned == {outcome.value for outcome in Outcome}


def test_every_outcome_but_claimed_is_a_hit() -> None:
    assert HIT_OUTCOMES == set(Outcome) - {Outcome.CLAIMED}
    assert "replay" in HIT_OUTCOMES  # str-valued: the SQL's text compares equal to its member
