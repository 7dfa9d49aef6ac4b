"""
The completion is pipelined with the COMMIT. When idem_complete fails there, psycopg may raise
PipelineAborted (the COMMIT's fate) in place of the statement's own error; the shim must judge
the statement's error, never take it for a store outage (it once answered 503 for a refused
body, about one run in five). shim/test_encryption.py sends twenty refused completions in a row through the shim; these
tests pin the rule itself on real errors.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from idem_shim.sqlstates import pipeline_cause


def failing_pipeline(url: str, statement: str) -> psycopg.Error:
    """The shim's shape: a transaction block held open for the handler, then idem_complete
    and the block's COMMIT in one pipeline."""
    with psycopg.connect(url) as conn:
        tx = conn.transaction()
        tx.__enter__()
        conn.execute("SELECT 1")  # the handler's writes
        with pytest.raises(psycopg.Error) as caught, conn.pipeline():
            conn.execute(statement)
            time.sleep(0.2)  # the error is in before the COMMIT is queued
            tx.__exit__(None, None, None)
        return caught.value


def test_a_pipeline_aborted_error_is_judged_by_the_statement_behind_it(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT 1 / 0")
    try:
        raise psycopg.errors.PipelineAborted("pipeline aborted") from None
    except psycopg.errors.PipelineAborted as aborted:
        aborted.__context__ = caught.value  # what Python records when __exit__ raises anew
        assert pipeline_cause(aborted) is caught.value
    assert pipeline_cause(psycopg.errors.PipelineAborted("pipeline aborted")).sqlstate is None


def test_a_lost_claim_is_recognised_through_the_pipeline(fresh_admin_url: str) -> None:
    raised = failing_pipeline(
        fresh_admin_url, "SELECT idem_complete(p_key_id => 424242, p_response_code => 201, p_response_body => '{}')"
    )
    assert pipeline_cause(raised).sqlstate == "IDM01"


def test_other_errors_are_judged_as_they_are(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT 1 / 0")
    assert pipeline_cause(caught.value) is caught.value
