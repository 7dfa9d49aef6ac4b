"""
The WARNING a stale heal raises (contract §3): it is for the DBA's log, so it is asserted from the
client that made the call, through psycopg's notice handler (pgTAP cannot see its own session's
notices; 010_idem_claim.sql asserts everything else about the heal). Time moves through p_now.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg

from tests.python.support.sqlapi import claim, connect, new_key


@dataclass(frozen=True)
class Notice:
    severity: str | None
    message: str | None
    hint: str | None


def notices_of(conn: psycopg.Connection[dict[str, object]]) -> list[Notice]:
    """Collect every notice the server sends on ``conn`` from now on (copied: psycopg's
    Diagnostic reads the server's message, which lives only while the handler runs)."""
    seen: list[Notice] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        seen.append(Notice(diag.severity_nonlocalized, diag.message_primary, diag.message_hint))

    conn.add_notice_handler(handler)
    return seen


def test_a_heal_raises_one_warning_naming_the_key_id_and_endpoint(fresh_app_role_url: str) -> None:
    key = new_key()
    with connect(fresh_app_role_url) as conn:
        holder = claim(conn, key, endpoint="warning-probe", now="2030-01-01T00:00:00Z")
        seen = notices_of(conn)
        healed = claim(conn, key, endpoint="warning-probe", now="2030-01-01T00:00:31Z")
    assert healed["outcome"] == "stale" and healed["key_id"] == holder["key_id"]
    assert [n.severity for n in seen] == ["WARNING"]
    message = seen[0].message or ""
    assert re.fullmatch(
        rf"idem_claim: healed stale in-flight key_id {holder['key_id']} on warning-probe"
        r" \(lease taken at .+\)",
        message,
    ), message
    assert seen[0].hint is not None and "p_stale_after" in seen[0].hint


def test_claims_that_heal_nothing_raise_no_notice(fresh_app_role_url: str) -> None:
    key = new_key()
    with connect(fresh_app_role_url) as conn:
        seen = notices_of(conn)
        claim(conn, key, endpoint="warning-probe", now="2030-01-01T00:00:00Z")
        assert claim(conn, key, endpoint="warning-probe", now="2030-01-01T00:00:05Z")["outcome"] == "in_flight"
    assert seen == []
