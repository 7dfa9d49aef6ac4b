"""What the shim does with a claim it holds, the same for a route and a job: complete it with the
work's transaction, fail or release it, report it lost. Both entry points call these; what each
answers its caller (a 409, an exception) stays theirs.
"""

from __future__ import annotations

import logging

from . import tracing
from .errors import ClaimLostError
from .logs import error_text, log_event, store_outage
from .scope import RequestScope


def complete(req: RequestScope, response_code: int, body: str | None, headers: str | None) -> None:
    """``idem_complete`` in the work's transaction and its COMMIT, pipelined together; a scope
    whose work never touched the connection (or left its transaction aborted, so nothing of it
    can commit anyway) completes in autocommit: one round trip.

    Raises what ``Store.complete`` raises; the caller rolls back and answers.
    """
    assert req.key_id is not None
    store = req.state.store
    if req.claims_in_transaction and not req.in_open_transaction():
        req.rollback()  # a statement of the work failed: back to the claim, which completes alone
    if req.in_open_transaction():
        store.complete(
            req.connection(),
            req.key_id,
            req.claim_token,
            response_code,
            body,
            headers,
            commit=req.commit,
            block=req.block,
        )
    else:
        store.complete(req.autocommit_conn(), req.key_id, req.claim_token, response_code, body, headers)


@tracing.failure
def fail(req: RequestScope, response_code: int | None) -> None:
    """Roll the work's transaction back, then ``idem_fail`` in autocommit (freeing the key with
    ``on_failure="release"``: the same one round trip). Never raises: a lost claim or a store
    that failed is logged, and the key stays as the store has it."""
    _end_failed(req, response_code, release=req.policy.on_failure == "release")


@tracing.failure
def release(req: RequestScope, response_code: int | None) -> None:
    """As ``fail``, the key freed whatever ``on_failure`` says: a transient failure (a 503, a
    429, a serialization failure) that ``on_failure="replay"`` does not store."""
    _end_failed(req, response_code, release=True)


def _end_failed(req: RequestScope, response_code: int | None, *, release: bool) -> None:
    assert req.key_id is not None
    if req.claims_in_transaction:
        _end_failed_in_transaction(req, response_code, release=release)
        return
    req.rollback()
    try:
        req.state.store.fail(req.autocommit_conn(), req.key_id, req.claim_token, response_code, release=release)
    except ClaimLostError:
        claim_lost(req, "fail")
        return
    except Exception as exc:
        outage(req, exc, "fail")
        return
    if release:
        req.state.metrics.record_released(req.endpoint)
    log_event(
        logging.INFO,
        "released" if release else "failed",
        endpoint=req.endpoint,
        key=req.key_hint,
        key_id=req.key_id,
        response_code=response_code,
    )


def _end_failed_in_transaction(req: RequestScope, response_code: int | None, *, release: bool) -> None:
    """An in_transaction claim's failure (contract §4e): back to the savepoint after the claim,
    then ``idem_fail`` by the token in that transaction and its COMMIT: ``keep`` commits the key
    failed alone, so a duplicate waiting on the row gets ``previous_failed``, never a free key;
    ``release`` deletes the row, and the duplicate claims the key. By the token, not by trusting
    the transaction: a handler that ran its own COMMIT (and a BEGIN and a SAVEPOINT idem_work of
    its own after it) committed the row ``in_flight``, held by nobody, and only the token's
    ``idem_fail`` ends it. A transaction already gone (its COMMIT failed, the connection lost)
    took the row with it: keep's failure is then recorded afresh (``_fail_afresh``)."""
    assert req.key_id is not None
    if req.rollback():
        try:
            req.state.store.fail(
                req.connection(), req.key_id, req.claim_token, response_code, release=release, with_work=True
            )
            req.commit()
        except ClaimLostError:
            req.abort()
            if not _claim_gone(req, response_code, release=release):
                return
        except Exception as exc:
            req.abort()
            outage(req, exc, "fail")
            return
    else:
        req.abort()
        if not _end_committed_claim(req, response_code, release=release):
            return
    if release:
        req.state.metrics.record_released(req.endpoint)
    log_event(
        logging.INFO,
        "released" if release else "failed",
        endpoint=req.endpoint,
        key=req.key_hint,
        key_id=req.key_id,
        response_code=response_code,
    )


def _end_committed_claim(req: RequestScope, response_code: int | None, *, release: bool) -> bool:
    """The claim's transaction ended before its failure (the savepoint is gone): ``idem_fail`` by
    the token in autocommit, for a row the handler's own COMMIT committed (in_flight, held by
    nobody: a retry would meet 409 in_flight until stale_after). True when the key ended as asked
    (the caller logs it)."""
    assert req.key_id is not None
    conn = req.conn
    if conn is None or conn.broken or conn.closed:  # the connection took its transaction with it
        return _claim_gone(req, response_code, release=release, prepared=False)
    try:
        req.state.store.fail(req.autocommit_conn(), req.key_id, req.claim_token, response_code, release=release)
    except ClaimLostError:
        return _claim_gone(req, response_code, release=release)
    except Exception as exc:
        outage(req, exc, "fail")
        return False
    return True


def _claim_gone(req: RequestScope, response_code: int | None, *, release: bool, prepared: bool = True) -> bool:
    """No row of the token's is visible: gone with its transaction (the usual case: a COMMIT
    that failed, a lost connection), or held by one the handler prepared (PREPARE TRANSACTION),
    which is rolled back first so that no duplicate waits on it. release has nothing left to
    free (True); keep records the failure afresh (which logs it: False)."""
    if prepared:
        _end_prepared(req)
    if release:
        return True
    _fail_afresh(req, response_code)
    return False


def _end_prepared(req: RequestScope) -> bool:
    """An in_transaction claim whose handler ran PREPARE TRANSACTION: its transaction, the key's
    uncommitted row in it, outlives the session (no COMMIT, kill or idle timeout ends it) and
    every duplicate would get 409 in flight until a DBA ended it. Rolled back here, found by the
    claim's transaction id; True when there was one. Never raises (an outage is logged)."""
    if req.claim_xid is None:
        return False
    try:
        ended = req.state.store.end_prepared_claim(req.autocommit_conn(), req.claim_xid)
    except Exception as exc:
        outage(req, exc, "fail")
        return False
    if ended:
        log_event(
            logging.WARNING,
            "prepared_claim_rolled_back",
            endpoint=req.endpoint,
            key=req.key_hint,
            key_id=req.key_id,
            hint="the handler ran PREPARE TRANSACTION on the claim's transaction: its writes are rolled back",
        )
    return ended


def _fail_afresh(req: RequestScope, response_code: int | None) -> None:
    """keep's failed row after the claim's transaction is gone: claimed and failed in a
    transaction of its own, unless another request took the key meanwhile (then it is theirs)."""
    assert req.claim_request is not None
    try:
        recorded = req.state.store.fail_afresh(req.autocommit_conn(), req.claim_request, response_code)
    except Exception as exc:
        outage(req, exc, "fail")
        return
    log_event(
        logging.INFO if recorded else logging.WARNING,
        "failed" if recorded else "failed_not_recorded",
        endpoint=req.endpoint,
        key=req.key_hint,
        key_id=req.key_id,
        response_code=response_code,
        hint=None if recorded else "another request holds or answered the key since: its outcome stands",
    )


def end_unstored(req: RequestScope, response_code: int) -> None:
    """A finished execution whose answer cannot be stored (a stream): its writes commit together
    with the key failed, or freed under ``on_failure="release"``, in one transaction (a work that
    never touched the connection: in autocommit). Raises what ``Store.fail`` raises; the caller
    rolls back and answers."""
    assert req.key_id is not None
    release = req.policy.on_failure == "release"
    in_work = req.in_open_transaction()
    conn = req.connection() if in_work else req.autocommit_conn()
    req.state.store.fail(conn, req.key_id, req.claim_token, response_code, release=release, with_work=in_work)
    req.commit()
    if release:
        req.state.metrics.record_released(req.endpoint)


def claim_lost(req: RequestScope, stage: str) -> None:
    """Log a lost claim and record it in idempotency_events (best effort, after the rollback)."""
    assert req.key_id is not None
    log_event(logging.ERROR, "claim_lost", endpoint=req.endpoint, key=req.key_hint, key_id=req.key_id, stage=stage)
    _end_prepared(req)
    try:
        req.state.store.record_lost_claim(req.autocommit_conn(), req.key_id, req.claim_token, req.endpoint)
    except Exception as exc:  # the event is for the DBA; the answer to the caller stands
        log_event(
            logging.DEBUG, "record_lost_claim_failed", endpoint=req.endpoint, key_id=req.key_id, error=error_text(exc)
        )


def outage(req: RequestScope, exc: BaseException, stage: str) -> None:
    """The store failed a held claim's completion or failure: an ERROR naming the token."""
    store_outage(
        req.state.metrics, logging.ERROR, exc, endpoint=req.endpoint, stage=stage, key=req.key_hint, key_id=req.key_id
    )
