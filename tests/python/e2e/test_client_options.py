"""What a client of a decorated route meets under gunicorn (several workers, a real database),
through real HTTP clients: a Retry-After that fits the handler (contract §4's in-flight row), a
fingerprint the route chose, a streamed answer, a multipart upload, and a failure replayed
(contract §4b). The app is tests/python/e2e/options_app.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self

import pytest
import requests
from requests.adapters import HTTPAdapter
from urllib3 import BaseHTTPResponse
from urllib3.connectionpool import ConnectionPool
from urllib3.util.retry import Retry

from tests.python.e2e.e2e_harness import Database, Server, StartServer, new_key
from tests.python.e2e.options_app import NOTES_DDL
from tests.python.support.races import wait_for_claim
from tests.python.support.waiting import wait_until

OPTIONS_APP = "tests.python.e2e.options_app:create_app()"


@pytest.fixture
def options_db(db: Database) -> Database:
    db.query(NOTES_DDL)
    return db


def notes(db: Database, route: str) -> int:
    return int(db.scalar("SELECT count(*) FROM public.e2e_notes WHERE route = %s", (route,)))


def key_rows(db: Database, key: str) -> list[tuple[Any, ...]]:
    return db.query("SELECT status, response_code FROM public.idempotency_keys WHERE idem_key = %s", (key,))


class Seen:
    """The answers a retrying client saw before its last one (urllib3 keeps no headers of them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: list[tuple[int, dict[str, str], bytes]] = []

    def retry_class(self) -> type[Retry]:
        seen = self

        class RecordingRetry(Retry):
            def increment(
                self,
                method: str | None = None,
                url: str | None = None,
                response: BaseHTTPResponse | None = None,
                error: Exception | None = None,
                _pool: ConnectionPool | None = None,
                _stacktrace: TracebackType | None = None,
            ) -> Self:
                if response is not None:
                    with seen.lock:
                        seen.answers.append((response.status, dict(response.headers), response.data))
                return super().increment(method, url, response, error, _pool, _stacktrace)

        return RecordingRetry


def retrying_session(seen: Seen) -> requests.Session:
    """A client configured the usual way for in-flight keys: retry 409 after Retry-After."""
    retry = seen.retry_class()(
        total=10,
        status_forcelist=[409],
        allowed_methods=None,  # POST included: the key makes the retry safe
        respect_retry_after_header=True,
        backoff_factor=0,
        raise_on_status=False,
    )
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    return session


# -- a Retry-After that fits --------------------------------------------------------------------


def test_duplicates_of_a_half_second_handler_are_told_one_second_and_all_replay_within_1_5_s(
    options_db: Database, start_server: StartServer
) -> None:
    server = start_server(options_db.app_url, workers=4, app=OPTIONS_APP)
    with ThreadPoolExecutor(max_workers=4) as warm:  # each worker sees the route run a few times
        assert {r.status_code for r in warm.map(lambda _: _post(server, "/slow", new_key()), range(8))} == {201}

    seen = Seen()
    key = new_key()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=21) as pool:
        first = pool.submit(_post, server, "/slow", key)
        wait_for_claim(options_db.admin_url, key)  # the first one claims the key
        sessions = [retrying_session(seen) for _ in range(20)]
        duplicates = [pool.submit(_post, server, "/slow", key, s) for s in sessions]
        answers = [d.result(timeout=30) for d in duplicates]
        done = time.monotonic() - started
        assert first.result(timeout=30).status_code == 201

    assert [a.status_code for a in answers] == [201] * 20
    assert all(a.headers.get("Idempotent-Replayed") == "true" for a in answers)
    assert len({a.json()["note_id"] for a in answers} | {first.result().json()["note_id"]}) == 1
    assert notes(options_db, "slow") == 8 + 1, "one execution for 21 requests"
    assert done < 1.5, f"the duplicates got their replay {done:.2f} s after the first request"
    in_flight = [(h, b) for status, h, b in seen.answers if status == 409]
    assert in_flight, "the duplicates met the holder in flight"
    for headers, body in in_flight:
        assert headers["Retry-After"] == "1"
        assert b'"idempotency_in_flight"' in body
        assert 0 < json.loads(body)["retry_after_ms"] < 1000


def test_a_stuck_holder_is_never_waited_for_past_its_lease(options_db: Database, start_server: StartServer) -> None:
    # A 3 s lease, a worker timeout well past it, and a holder that hangs for 6 s: whatever the
    # route's usual time (a few ms here), a duplicate is told at most the lease left.
    server = start_server(
        options_db.app_url, workers=2, app=OPTIONS_APP, IDEM_STALE_AFTER_SECONDS=3, GUNICORN_TIMEOUT=30
    )
    for _ in range(4):
        assert _post(server, "/slow", new_key(), delay_ms=10).status_code == 201
    key = new_key()
    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(_post, server, "/slow", key, None, 6000)
        wait_until(lambda: key_rows(options_db, key), 10, 0.02, what="the holder's claim")
        told = []
        for pause in (0.3, 0.9, 1.0):
            time.sleep(pause)
            asked = time.monotonic()
            answer = _post(server, "/slow", key)
            assert answer.status_code == 409, answer.text
            lease_left_ms = float(
                options_db.scalar(
                    "SELECT extract(epoch FROM locked_at + interval '3 seconds' - clock_timestamp()) * 1000 "
                    "FROM public.idempotency_keys WHERE idem_key = %s",
                    (key,),
                )
            )
            since_asked_ms = (time.monotonic() - asked) * 1000
            retry_ms = answer.json()["retry_after_ms"]
            assert 0 <= retry_ms <= lease_left_ms + since_asked_ms, (retry_ms, lease_left_ms, since_asked_ms)
            assert answer.headers["Retry-After"] == str(max(1, -(-retry_ms // 1000)))
            told.append(retry_ms)
        assert told[-1] < 1500, f"late in its lease the holder is given what is left of it: {told}"
        holder.result(timeout=30)


def _post(
    server: Server,
    path: str,
    key: str,
    session: requests.Session | None = None,
    delay_ms: int | None = None,
    **kwargs: Any,
) -> requests.Response:
    headers = {"Idempotency-Key": key, **kwargs.pop("headers", {})}
    if delay_ms is not None:
        headers["X-Test-Delay-Ms"] = str(delay_ms)
    if "json" not in kwargs and "data" not in kwargs and "files" not in kwargs:
        kwargs["json"] = {"n": 1}
    return (session or requests).post(server.base + path, headers=headers, timeout=30, **kwargs)


# -- the fingerprint a route chose --------------------------------------------------------------


@pytest.fixture
def options_server(options_db: Database, start_server: StartServer) -> Iterator[Server]:
    yield start_server(options_db.app_url, workers=2, app=OPTIONS_APP)


def test_an_excluded_member_changed_replays_and_anything_else_is_a_422(
    options_db: Database, options_server: Server
) -> None:
    key = new_key()
    body = {"amount": 1200, "client_ts": "2026-12-01T10:00:00Z", "trace": {"id": "t-1", "span": 1}}
    first = _post(options_server, "/payments", key, json=body)
    assert first.status_code == 201
    retried = {**body, "client_ts": "2026-12-01T10:00:07Z", "trace": {"id": "t-2", "span": 1}}
    replay = _post(options_server, "/payments", key, json=retried)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["note_id"] == first.json()["note_id"]
    without = {"amount": 1200, "trace": {"span": 1}}  # the excluded members left out altogether
    assert _post(options_server, "/payments", key, json=without).headers.get("Idempotent-Replayed") == "true"
    other = _post(options_server, "/payments", key, json={**retried, "amount": 1300})
    assert other.status_code == 422 and other.json() == {"error": "idempotency_key_body_mismatch"}
    span = _post(options_server, "/payments", key, json={**body, "trace": {"id": "t-1", "span": 2}})
    assert span.status_code == 422, "only /trace/id is excluded, not the rest of /trace"
    assert notes(options_db, "payments") == 1


def test_only_included_members_make_the_request(options_db: Database, options_server: Server) -> None:
    key = new_key()
    first = _post(options_server, "/transfers", key, json={"amount": 5, "to": "acct_9", "memo": "rent"})
    assert first.status_code == 201
    memo = _post(options_server, "/transfers", key, json={"to": "acct_9", "amount": 5, "memo": "rent, june"})
    assert memo.status_code == 201 and memo.headers["Idempotent-Replayed"] == "true"
    amount = _post(options_server, "/transfers", key, json={"amount": 6, "to": "acct_9"})
    assert amount.status_code == 422
    missing = _post(options_server, "/transfers", new_key(), json={"amount": 5})
    assert missing.status_code == 400
    assert missing.json()["error"] == "invalid_request_fingerprint" and "/to" in missing.json()["detail"]
    text = _post(options_server, "/transfers", new_key(), data=b"amount=5&to=acct_9")
    assert text.status_code == 400 and text.json()["error"] == "invalid_request_fingerprint"
    assert notes(options_db, "transfers") == 1


# -- a streamed answer -------------------------------------------------------------------------


def test_a_streamed_answer_is_sent_once_never_stored_and_its_key_follows_on_failure(
    options_db: Database, options_server: Server
) -> None:
    key = new_key()
    with requests.post(
        options_server.base + "/export", headers={"Idempotency-Key": key}, json={}, stream=True, timeout=30
    ) as first:
        assert first.status_code == 200 and first.headers.get("Transfer-Encoding") == "chunked"
        lines = [line for line in first.iter_lines() if line]
    assert len(lines) == 3 and lines[0].endswith(b",0,/export")
    # its writes committed (they were made before the stream), the key failed in the same
    # transaction: a retry is never a second run, and never a replay of half a stream
    assert notes(options_db, "export") == 1
    assert key_rows(options_db, key) == [("failed", 200)]
    retry = _post(options_server, "/export", key, json={})
    assert retry.status_code == 409 and retry.json() == {"error": "idempotency_previous_failed"}
    assert notes(options_db, "export") == 1

    key = new_key()  # on_failure="release": the key is freed with the commit; the retry runs again
    assert _post(options_server, "/export-release", key, json={}).text.count("\n") == 3
    assert key_rows(options_db, key) == []
    again = _post(options_server, "/export-release", key, json={})
    assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers
    assert notes(options_db, "export-release") == 2


# -- a multipart upload -----------------------------------------------------------------------


def test_the_same_upload_sent_again_replays_and_another_file_is_a_422(
    options_db: Database, options_server: Server
) -> None:
    key = new_key()
    statement = b"date,amount\r\n2026-12-01,1200\r\n--not-a-boundary\r\n"

    def upload(content: bytes, name: str = "statement.csv", kind: str = "text/csv") -> requests.Response:
        files = {"document": (name, content, kind)}
        return _post(options_server, "/upload", key, files=files, data={"note": "december"})

    first = upload(statement)
    assert first.status_code == 201, first.text
    again = upload(statement)  # requests draws a new random boundary for every request
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {**first.json(), "idempotency_replayed": True}
    assert upload(statement + b"2026-12-02,5\r\n").status_code == 422, "another file"
    assert upload(statement, name="other.csv").status_code == 422, "another file name"
    assert upload(statement, kind="application/octet-stream").status_code == 422, "another part type"
    raw = _post(options_server, "/upload", key, data=statement, headers={"Content-Type": "text/csv"})
    assert raw.status_code == 422, "the same bytes under another media type"
    assert notes(options_db, "upload") == 1


# -- one key per request ----------------------------------------------------------------------


def _raw_post(server: Server, path: str, header_lines: list[str]) -> int:
    """A POST written by hand, so its header fields reach gunicorn exactly as listed (an HTTP
    library folds a repeated header into one line)."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", "Content-Length: 2"]
    request = "\r\n".join([*head, *header_lines, "Connection: close", "", ""]).encode() + b"{}"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_a_key_sent_on_two_field_lines_runs_the_handler_once(options_db: Database, options_server: Server) -> None:
    """Issue 39's F4: gunicorn joins two Idempotency-Key lines into `K,K`, which an opaque route
    took for a new key and ran again."""
    key = f"order-{new_key()}"
    assert _raw_post(options_server, "/opaque", [f"Idempotency-Key: {key}"]) == 201
    assert _raw_post(options_server, "/opaque", [f"Idempotency-Key: {key}", f"Idempotency-Key: {key}"]) == 400
    assert _raw_post(options_server, "/opaque", [f"Idempotency-Key: {key}"]) == 201, "the single key replays"
    assert notes(options_db, "opaque") == 1, "the handler ran once"


# -- a failure replayed -----------------------------------------------------------------------


def test_a_replayed_failure_reaches_a_retrying_client_as_the_first_answer(
    options_db: Database, options_server: Server
) -> None:
    key = new_key()
    seen = Seen()
    session = retrying_session(seen)
    first = _post(options_server, "/fails", key, session)
    assert first.status_code == 500 and "Idempotent-Replayed" not in first.headers
    retry = _post(options_server, "/fails", key, session)
    assert retry.status_code == 500 and retry.headers["Idempotent-Replayed"] == "true"
    assert retry.content == first.content and retry.headers["Content-Type"] == first.headers["Content-Type"]
    assert notes(options_db, "fails") == 0, "the failed handler's writes rolled back"
    assert key_rows(options_db, key) == [("completed", 500)]
    assert seen.answers == [], "no 409 to retry: never previous_failed"
