"""CHAOS_CLAIM: the paper route's claim shape, checked before a soak starts anything."""

from __future__ import annotations

from dataclasses import fields

import pytest

from idem_shim.policy import Policy
from tests.python.chaos.soak import chaos_claim


def test_the_default_is_the_claim_before_the_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHAOS_CLAIM", raising=False)
    assert chaos_claim() == "before"
    monkeypatch.setenv("CHAOS_CLAIM", "before")
    assert chaos_claim() == "before"


def test_an_unknown_claim_stops_the_soak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_CLAIM", "after")
    with pytest.raises(SystemExit, match="must be one of before, in_transaction"):
        chaos_claim()


def test_in_transaction_runs_only_where_the_decorator_takes_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_CLAIM", "in_transaction")
    if "claim" in {f.name for f in fields(Policy)}:
        assert chaos_claim() == "in_transaction"
    else:
        with pytest.raises(SystemExit, match="does not take yet"):
            chaos_claim()
