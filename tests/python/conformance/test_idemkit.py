"""idemkit 1.0.2's backend conformance vectors, as the package publishes them, against idem's SQL
API through the adapter in idemkit_backend.py (run with the peers' venv, where idemkit lives:
``make peers-venv``). Ten pass; three differ by design, each listed with its reason, and each
reason has a test below of what idem does instead (docs/shim.md, **Conformance**).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
from psycopg.rows import dict_row

ROOT: Final = Path(__file__).resolve().parents[3]

#: idemkit's 13 vectors (idemkit/conformance/backend.py), those idem answers otherwise by design.
DIFFER_BY_DESIGN: Final = {
    "duplicate-claim": "a second claim on a live key must see the holder's claim_token; idem never shows a "
    "live holder's token to anyone else (it would let a duplicate complete or release the holder's claim)",
    "fenced-after-reclaim": "its last step reads the new holder's token through a duplicate claim, as above; "
    "the fencing itself holds (the reclaimed owner's completion is refused)",
    "completed-ttl-expiry": "the retention is given at completion (expires_after_seconds); idem fixes it at the "
    "claim (p_ttl), so a completed record keeps the claim's TTL",
}
PASSING: Final = {
    "atomic-claim",
    "conditional-complete",
    "fencing-wrong-token",
    "release-clears-claim",
    "lease-reclaim",
    "concurrent-claim-exactly-one",
    "in-flight-wait",
    "wait-timeout",
    "renew-extends-lease",
    "renew-fenced",
}


def _peers_python() -> Path:
    path = Path(os.environ.get("IDEM_PEERS_PYTHON") or ROOT / ".venv-peers" / "bin" / "python")
    if not path.exists():
        pytest.fail(f"{path} is missing: idemkit lives in the peers' venv (make peers-venv)")
    return path


def test_idemkits_vectors_pass_but_the_three_that_differ_by_design(fresh_admin_url: str) -> None:
    # The owner's URL: idemkit's leases are 0.1 s, and p_stale_after under 1 s is the owner's.
    run = subprocess.run(
        [str(_peers_python()), "-m", "tests.python.conformance.idemkit_backend", fresh_admin_url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    results: dict[str, dict[str, Any]] = json.loads(run.stdout)
    assert set(results) == PASSING | set(DIFFER_BY_DESIGN), "idemkit 1.0.2's 13 vectors"
    failed = {vector: r["error"] for vector, r in results.items() if not r["passed"]}
    assert set(failed) == set(DIFFER_BY_DESIGN), failed


# -- what idem does where the three differ ---------------------------------------------------------


COMPLETE: Final = (
    "SELECT public.idem_complete(p_key_id => %s, p_response_code => 200, p_response_body => '{}', p_claim_token => %s)"
)


def _claim(conn: psycopg.Connection[dict[str, Any]], key: str, **options: Any) -> dict[str, Any]:
    sql = (
        "SELECT * FROM public.idem_claim(p_key => %(key)s, p_user_id => NULL, p_endpoint => 'idemkit.conformance', "
        "p_request => '{}', p_ttl => pg_catalog.make_interval(secs => %(ttl)s), "
        "p_stale_after => pg_catalog.make_interval(secs => %(lease)s), p_key_format => 'opaque')"
    )
    row = conn.execute(sql, {"key": key, "ttl": options.get("ttl", 3600), "lease": options.get("lease", 30)}).fetchone()
    assert row is not None
    return row


def test_a_duplicate_of_a_live_claim_is_in_flight_without_the_holders_token(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url, autocommit=True, row_factory=dict_row) as conn:
        first = _claim(conn, "conformance-dup-0001")
        second = _claim(conn, "conformance-dup-0001")
    assert first["outcome"] == "claimed" and first["claim_token"]
    assert second["outcome"] == "in_flight" and second["claim_token"] is None


def test_a_reclaimed_owners_completion_is_refused_and_the_new_holders_lands(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url, autocommit=True, row_factory=dict_row) as conn:
        zombie = _claim(conn, "conformance-fence-0001", lease=0.1)
        time.sleep(0.25)  # past the 0.1 s lease: the lease is what is tested
        # One lease for every claim of the key: the route's p_stale_after.
        assert _claim(conn, "conformance-fence-0001", lease=0.1)["outcome"] == "stale", "the heal frees the key"
        holder = _claim(conn, "conformance-fence-0001", lease=0.1)
        assert (holder["outcome"], holder["attempt"]) == ("claimed", 2)
        with pytest.raises(psycopg.Error) as lost:
            conn.execute(COMPLETE, (zombie["key_id"], zombie["claim_token"]))
        assert lost.value.sqlstate == "IDM01"
        conn.execute(COMPLETE, (holder["key_id"], holder["claim_token"]))
        assert _claim(conn, "conformance-fence-0001", lease=0.1)["outcome"] == "replay"


def test_a_completed_record_expires_at_the_ttl_its_claim_gave(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url, autocommit=True, row_factory=dict_row) as conn:
        first = _claim(conn, "conformance-ttl-00001", ttl=1)
        conn.execute(COMPLETE, (first["key_id"], first["claim_token"]))
        assert _claim(conn, "conformance-ttl-00001", ttl=1)["outcome"] == "replay"
        time.sleep(1.5)  # past the 1 s TTL: the TTL is what is tested
        assert _claim(conn, "conformance-ttl-00001", ttl=1)["outcome"] == "claimed"
