"""The SQLSTATEs a failover produces are the store unavailable, in sqlstates.py's one table.

What a failover or a restart makes the server answer (a standby or a demoted primary: 25006; a
stopping or crashed server: 57P01, 57P02; one starting up or in recovery: 57P03; the connection
classes 08xxx) must count as the store being unavailable (Tier 1: 503), with the connection
treated as lost, never as the SQL API refusing one request.
"""

from __future__ import annotations

import pytest
from psycopg import errors as pg_errors

from idem_shim import sqlstates
from idem_shim.errors import StoreUnavailableError

FAILOVER = ["25006", "57P01", "57P02", "57P03", "08000", "08001", "08003", "08004", "08006"]


@pytest.mark.parametrize("code", FAILOVER)
def test_failover_codes_are_the_store_unavailable(code: str) -> None:
    exc = pg_errors.lookup(code)("the server said so")
    assert sqlstates.is_failover(exc)
    assert sqlstates.refusal(exc) is None
    conn = _Healthy()  # a connection that still looks usable: the SQLSTATE alone says it is lost
    unavailable = sqlstates.store_error(exc, conn)  # type: ignore[arg-type]
    assert isinstance(unavailable, StoreUnavailableError)
    assert unavailable.connection_lost  # Tier 2's handler must not reuse the connection
    assert conn.closed, "the connection is discarded: the pool replaces it with one to the primary of now"


class _Healthy:
    broken = False
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    "code", ["22023", "23503", "IDM00", "IDM01", "IDM02", "IDM03", "IDM04", "57014", "40001", "23505"]
)
def test_other_codes_are_not_failover(code: str) -> None:
    exc = pg_errors.lookup(code)("no") if code[:3] != "IDM" else pg_errors.DatabaseError("no")
    assert not sqlstates.is_failover(exc)


def test_the_table_holds_refusals_and_failover_codes_only() -> None:
    refusals = {code for code, kind in sqlstates.SQLSTATES.items() if kind is not StoreUnavailableError}
    assert refusals == {"22023", "23503", "IDM00", "IDM01", "IDM02", "IDM03", "IDM04"}
    assert {code for code, kind in sqlstates.SQLSTATES.items() if kind is StoreUnavailableError} == set(FAILOVER)
