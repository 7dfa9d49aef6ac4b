"""`IDEM_WAIT_MS` under gunicorn: a duplicate that waits for its holder holds the request slot it
came on. A sync worker has one: waiting there held the whole worker, and a storm of duplicates
as many workers, so unrelated requests queued for the whole wait (2.4 s of a 3 s wait measured,
4 workers, 4 duplicates). Under sync workers no claim waits: duplicates are answered 409 at once
(one WARNING per worker says so), and an unrelated request is served at once. Under threaded
workers (gthread) the wait works: the duplicate gets the holder's answer, replayed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.python.e2e.e2e_harness import Database, Server, StartServer, new_key
from tests.python.e2e.options_app import NOTES_DDL
from tests.python.support.races import wait_for_claim
from tests.python.support.waiting import wait_until

OPTIONS_APP = "tests.python.e2e.options_app:create_app()"
WAIT = {"IDEM_WAIT_MS": 3000, "IDEM_STATEMENT_TIMEOUT_MS": 10000}


def _post(server: Server, key: str, delay_ms: int = 0) -> tuple[int, str | None, float]:
    started = time.monotonic()
    answer = requests.post(
        server.base + "/slow",
        json={"n": 1},
        headers={"Idempotency-Key": key, "X-Test-Delay-Ms": str(delay_ms)},
        timeout=30,
    )
    return answer.status_code, answer.headers.get("Idempotent-Replayed"), time.monotonic() - started


def _storm(db: Database, server: Server, duplicates: int) -> tuple[list[tuple[int, str | None, float]], float]:
    """A holder working 2.5 s, then ``duplicates`` of it at once, then an unrelated request."""
    key = new_key()
    with ThreadPoolExecutor(duplicates + 1) as pool:
        holder = pool.submit(_post, server, key, 2500)
        wait_for_claim(db.admin_url, key)  # the holder has claimed
        storm = [pool.submit(_post, server, key, 2500) for _ in range(duplicates)]

        def all_in() -> bool:  # each duplicate answered, or waiting inside its claim (pg_sleep)
            waiting = db.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            return sum(f.done() for f in storm) + int(waiting) >= duplicates

        wait_until(all_in, 10, what="the duplicates answered or waiting inside their claims")
        started = time.monotonic()
        assert requests.get(server.base + "/healthz", timeout=30).status_code == 200
        unrelated = time.monotonic() - started
        assert holder.result()[0] == 201
        return [f.result() for f in storm], unrelated


def test_under_sync_workers_a_duplicate_does_not_hold_its_worker(db: Database, start_server: StartServer) -> None:
    db.query(NOTES_DDL)
    server = start_server(db.app_url, workers=2, app=OPTIONS_APP, **WAIT)
    answers, unrelated = _storm(db, server, duplicates=2)
    assert all(code == 409 and took < 1.0 for code, _, took in answers), answers
    assert unrelated < 1.0, f"an unrelated request queued {unrelated:.2f} s behind waiting duplicates"
    assert "idempotency wait_skipped" in server.log() and "gunicorn --threads N" in server.log()


def test_under_threaded_workers_a_duplicate_waits_and_gets_the_replay(db: Database, start_server: StartServer) -> None:
    db.query(NOTES_DDL)
    server = start_server(
        db.app_url, workers=2, app=OPTIONS_APP, GUNICORN_CMD_ARGS="--worker-class gthread --threads 4", **WAIT
    )
    answers, unrelated = _storm(db, server, duplicates=2)
    assert all(code == 201 and replayed == "true" for code, replayed, _ in answers), answers
    assert unrelated < 1.0, f"an unrelated request queued {unrelated:.2f} s"
    assert "wait_skipped" not in server.log()
    assert int(db.scalar("SELECT count(*) FROM public.e2e_notes WHERE route = 'slow'")) == 1
