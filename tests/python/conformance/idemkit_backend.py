"""idemkit's backend Protocol (``idemkit.backends.base.IdempotencyBackend``) over idem's SQL API,
so idemkit 1.0.2's published backend vectors (``idemkit.conformance.BackendConformance``) run
against idem as they are. Run by test_idemkit.py with the peers' venv (.venv-peers, where idemkit
lives; the main venv never holds it): ``python -m tests.python.conformance.idemkit_backend URL``
prints one JSON object, each vector's id to ``{"passed", "error"}``.

The translation, call by call (every call its own connection, so concurrent calls are concurrent
sessions on the server):

* ``claim`` is ``public.idem_claim`` (``p_key_format => 'opaque'``, no user, one endpoint); the
  request is the fingerprint and its version. ``claimed`` is NEW_CLAIMED, or LEASE_RECLAIMED when
  it follows a stale heal (``attempt`` > 1); ``in_flight`` is ALREADY_CLAIMED; ``replay`` is
  ALREADY_COMPLETED; ``stale`` (the heal freed the key) is claimed again at once. The token the
  caller presents later is ``"<key_id>:<claim_token>"``: idem's token is bound to its claim.
* idem's lease is the route's ``p_stale_after``, one value for every claim of a key, where
  idemkit passes one per call: the adapter passes the lease the key's holder last asked for
  (its claim, or its renewal), else the caller's own.
* ``complete`` is ``public.idem_complete`` in a transaction, then COMMIT; ``release`` is
  ``public.idem_fail(p_release => true)``; ``renew`` is ``public.idem_heartbeat``. Each refused
  with IDM01 (claim lost: another token holds the key) is ``False``.
* ``wait_for_completion`` is a duplicate's ``public.idem_claim`` with ``p_wait_ms``: the holder's
  answer when it completes within the wait, else None (a free key it claims is released at once).
* ``expires_after_seconds`` is not used: idem fixes a record's retention at its claim (``p_ttl``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from typing import Any, Final

import psycopg
from idemkit.conformance import BackendConformance
from idemkit.core.state import ClaimResult, ClaimResultType, State, StoredRecord
from psycopg.rows import dict_row

ENDPOINT: Final = "idemkit.conformance"

CLAIM: Final = """
    SELECT outcome, key_id, claim_token, attempt, retry_after_ms, response_code, response_body, response_headers
      FROM public.idem_claim(p_key => %(key)s, p_user_id => NULL, p_endpoint => %(endpoint)s,
                             p_request => %(request)s::jsonb,
                             p_stale_after => pg_catalog.make_interval(secs => %(lease)s),
                             p_wait_ms => %(wait_ms)s, p_key_format => 'opaque')"""
COMPLETE: Final = """
    SELECT public.idem_complete(p_key_id => %s, p_response_code => %s, p_response_body => %s::jsonb,
                                p_response_headers => %s::jsonb, p_claim_token => %s)"""
RELEASE: Final = "SELECT public.idem_fail(p_key_id => %s, p_claim_token => %s, p_release => true)"
HEARTBEAT: Final = "SELECT public.idem_heartbeat(p_key_id => %s, p_claim_token => %s) AS renewed"

CLAIM_LOST: Final = "IDM01"


class IdemBackend:
    """One idem store as an idemkit backend (structural: idemkit's Protocol is not subclassed)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._key_id: dict[str, int] = {}  # the key's latest claim, for a token that names none
        self._request: dict[str, str] = {}  # the key's request, for a waiter (which has none)
        self._lease: dict[str, float] = {}  # the lease the key's holder last asked for

    async def _connect(self, *, autocommit: bool = True) -> psycopg.AsyncConnection[dict[str, Any]]:
        return await psycopg.AsyncConnection.connect(self.url, autocommit=autocommit, row_factory=dict_row)

    async def _claim_row(self, key: str, request: str, lease: float, wait_ms: int = 0) -> dict[str, Any]:
        params = {"key": key, "endpoint": ENDPOINT, "request": request, "lease": lease, "wait_ms": wait_ms}
        async with await self._connect() as conn:
            while True:
                row = await (await conn.execute(CLAIM, params)).fetchone()
                assert row is not None
                if row["outcome"] != "stale":  # a heal freed the key: claim it now
                    return row

    async def claim(
        self, effective_key: str, fingerprint: str, fingerprint_version: int, lease_ttl_seconds: float
    ) -> Any:
        request = json.dumps({"fingerprint": fingerprint, "version": fingerprint_version})
        row = await self._claim_row(effective_key, request, self._lease.get(effective_key, lease_ttl_seconds))
        now = time.time()
        if row["outcome"] == "claimed":
            token = f"{row['key_id']}:{row['claim_token']}"
            self._key_id[effective_key] = row["key_id"]
            self._request[effective_key] = request
            self._lease[effective_key] = lease_ttl_seconds
            kind = ClaimResultType.LEASE_RECLAIMED if row["attempt"] > 1 else ClaimResultType.NEW_CLAIMED
            record = StoredRecord(
                effective_key, State.CLAIMED, fingerprint, fingerprint_version, token, now, now + lease_ttl_seconds
            )
            return ClaimResult(kind, record, our_claim_token=token)
        if row["outcome"] == "in_flight":
            # idem never shows a live holder's token to anyone else: the record carries none.
            lease_until = now + (row["retry_after_ms"] or 0) / 1000
            record = StoredRecord(effective_key, State.CLAIMED, fingerprint, fingerprint_version, "", now, lease_until)
            return ClaimResult(ClaimResultType.ALREADY_CLAIMED, record)
        if row["outcome"] == "replay":
            return ClaimResult(ClaimResultType.ALREADY_COMPLETED, _completed(effective_key, fingerprint, row))
        raise RuntimeError(f"idem_claim answered {row['outcome']!r}, which idemkit's protocol has no outcome for")

    def _token(self, key: str, token: str) -> tuple[int | None, str]:
        key_id, _, claim_token = token.partition(":")
        if key_id.isdigit() and claim_token:
            return int(key_id), claim_token
        return self._key_id.get(key), token  # a token that is not ours: idem judges it

    async def complete(
        self,
        effective_key: str,
        claim_token: str,
        response_status: int,
        response_headers: dict[str, str],
        response_body: bytes,
        expires_after_seconds: float,
    ) -> bool:
        key_id, token = self._token(effective_key, claim_token)
        body = json.dumps({"idem_raw": "base64", "data": base64.b64encode(response_body).decode("ascii")})
        async with await self._connect(autocommit=False) as conn:
            try:
                await conn.execute(COMPLETE, (key_id, response_status, body, json.dumps(response_headers), token))
                await conn.commit()
            except psycopg.Error as exc:
                if exc.sqlstate == CLAIM_LOST:
                    return False
                raise
        return True

    async def release(self, effective_key: str, claim_token: str) -> bool:
        key_id, token = self._token(effective_key, claim_token)
        async with await self._connect() as conn:
            try:
                await conn.execute(RELEASE, (key_id, token))
            except psycopg.Error as exc:
                if exc.sqlstate == CLAIM_LOST:
                    return False
                raise
        return True

    async def renew(self, effective_key: str, claim_token: str, lease_ttl_seconds: float) -> bool:
        key_id, token = self._token(effective_key, claim_token)
        async with await self._connect() as conn:
            try:
                row = await (await conn.execute(HEARTBEAT, (key_id, token))).fetchone()
            except psycopg.Error as exc:
                if exc.sqlstate == CLAIM_LOST:
                    return False
                raise
        if row is None or row["renewed"] is None:
            return False
        self._lease[effective_key] = lease_ttl_seconds
        return True

    async def wait_for_completion(self, effective_key: str, timeout_seconds: float) -> Any:
        request = self._request.get(effective_key)
        if request is None:
            return None
        wait_ms = max(0, min(60_000, int(timeout_seconds * 1000)))
        row = await self._claim_row(effective_key, request, self._lease.get(effective_key, 30.0), wait_ms)
        if row["outcome"] == "claimed":  # the key was free: not the waiter's to hold
            await self.release(effective_key, f"{row['key_id']}:{row['claim_token']}")
            return None
        if row["outcome"] == "replay":
            fingerprint = json.loads(request)["fingerprint"]
            return _completed(effective_key, fingerprint, row)
        return None


def _completed(key: str, fingerprint: str, row: dict[str, Any]) -> Any:
    body = row["response_body"] or {}
    data = base64.b64decode(body["data"]) if body.get("idem_raw") == "base64" else str(body.get("data", "")).encode()
    now = time.time()
    return StoredRecord(
        key,
        State.COMPLETED,
        fingerprint,
        1,
        "",
        now,
        now,
        completed_at=now,
        response_status=row["response_code"],
        response_headers=dict(row["response_headers"] or {}),
        response_body=data,
    )


async def run(url: str) -> dict[str, dict[str, Any]]:
    report = await BackendConformance(IdemBackend(url)).run()
    return {r.vector_id: {"passed": r.passed, "error": r.error} for r in report.results}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(sys.argv[1]))))
