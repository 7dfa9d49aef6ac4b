"""The outcomes of ``idem_claim`` (contract §3): the one list the shim's modules branch on."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """``idem_claim_result.outcome``; the values are the SQL API's own strings."""

    CLAIMED = "claimed"
    MISMATCH = "mismatch"
    REPLAY = "replay"
    IN_FLIGHT = "in_flight"
    STALE = "stale"
    PREVIOUS_FAILED = "previous_failed"
