"""The records the shim passes between its layers: one ``idem_claim`` call and its answer.

Plain data, beside ``outcome.py``: the request path (``http``, ``tracing``, ``decorator``) reads
them without importing the driver's modules, and the one mapping from a claim's row to a
``ClaimResult`` is here, so every entry point (a route, ``idempotent()``) reads a row the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias
from uuid import UUID

from .outcome import Outcome

#: A user scope: the id of a row of the host's users table, whose id type the store fixed at
#: install (migration 0017): an int for integer and bigint ids, a UUID for uuid ids.
UserId: TypeAlias = int | UUID


def user_id_value(value: object, who: str) -> UserId | None:
    """``value`` as a user scope: an int, a UUID, a UUID's string (read as the UUID) or None;
    anything else is the caller's bug, a ``TypeError`` naming ``who`` (the store says which of
    int and UUID it takes: docs/adopting.md, "Your users table")."""
    if value is None or isinstance(value, UUID) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise TypeError(f"{who} must be an int, a UUID or None, not {type(value).__name__} {value!r}"[:200])


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The arguments of one ``idem_claim`` call."""

    key: str
    user_id: UserId | None
    endpoint: str
    request_json: str | None  # JSON text, cast to jsonb in SQL; None is SQL NULL
    ttl: timedelta
    stale_after: timedelta
    wait_ms: int
    on_stale: str
    key_format: str = "uuid"

    def params(self) -> tuple[Any, ...]:
        """queries.CLAIM's parameters but the response keys, which the Store (it owns the
        secrets) appends. Intervals go as text: psycopg's timedelta dumper costs more client
        CPU than the server spends parsing "86400.0 seconds"."""
        return (
            self.key,
            self.user_id,
            self.endpoint,
            self.request_json,
            f"{self.ttl.total_seconds()} seconds",
            f"{self.stale_after.total_seconds()} seconds",
            self.wait_ms,
            self.on_stale,
            self.key_format,
        )


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One row of ``idem_claim``."""

    outcome: Outcome
    key_id: int | None
    request_hash: str | None
    response_code: int | None
    response_body: Any
    retry_after_ms: int | None
    #: the stored headers of a replay (None on rows stored before the store kept headers)
    response_headers: Any = None
    #: what complete/fail/heartbeat need beside ``key_id`` (claimed only)
    claim_token: str | None = None
    #: 1 + the stale heals of this key before this claim (claimed only; None from a store too
    #: old to count them)
    attempt: int | None = None
    #: how long an in-flight holder has held the key, in milliseconds (in_flight only)
    holder_elapsed_ms: int | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimResult:
        """The row of ``queries.CLAIM``: its 9th column is the statement's ``set_config``, the
        attempt and the holder's elapsed time come after it."""
        return cls(Outcome(row[0]), row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[9], row[10])
