"""The store's server stopped and started under gunicorn, with an app of one's own
(tests/python/e2e/outage_app.py: no session lookup, so the store is all that goes away):

- under load on four workers: no 503 while the store is up; every answer during the outage at
  once (never the pool timeout); no 503 once a probe interval has passed after the restart; the
  first request after a restart served; one ``store_down`` and one ``store_back`` line per
  worker, none per request, and none of psycopg_pool's own;
- fail-open whose handler shares the store's database: Tier 1's clean 503 (problem+json, with
  Retry-After), never a 500; fail-open whose business database is another server: the handler
  runs without dedup, and dedups again once the store is back;
- the metrics of docs/adopting.md's gunicorn.conf.py: every scrape of two workers shows both.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import requests

from tests.python.e2e.e2e_harness import RAPTOR_CONF, ROOT, Cluster, Database, RunServer, Server, new_key
from tests.python.e2e.outage_app import SCHEMA, install
from tests.python.support import docrunner
from tests.python.support.waiting import wait_until

APP = "tests.python.e2e.outage_app:create_app()"
POOL_TIMEOUT = 5.0  # what each request waited for before the breaker: "at once" is well below it
PROBE_INTERVAL = 0.5


def serve(run_server: RunServer, db: Database, workers: int = 4, conf: Path = RAPTOR_CONF, **env: object) -> Server:
    """outage_app on ``db`` (the store, and the business tables of the routes that share it)."""
    user_id = install(db)
    settings = {
        "IDEM_DATABASE_URL": db.app_url,
        "E2E_USER_ID": user_id,
        "IDEM_POOL_TIMEOUT": POOL_TIMEOUT,
        "IDEM_STORE_PROBE_INTERVAL": PROBE_INTERVAL,
        **env,
    }
    environment = {k: str(v) for k, v in settings.items()}
    return run_server(Server(db.app_url, env=environment, workers=workers, app=APP, conf=conf))


def post(server: Server, path: str, key: str | None, timeout: float = 30.0) -> requests.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return requests.post(server.base + path, json={"qty": 1}, headers=headers, timeout=timeout)


@dataclass(frozen=True)
class Answer:
    sent: float
    seconds: float
    status: int

    @property
    def answered(self) -> float:
        return self.sent + self.seconds


class Load:
    """Client threads posting fresh keys to ``path`` until stopped; every answer is kept."""

    def __init__(self, server: Server, path: str = "/orders", threads: int = 6) -> None:
        self.server, self.path, self.threads = server, path, threads
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []

    def _client(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                status = session.post(
                    self.server.base + self.path, json={"qty": 1}, headers={"Idempotency-Key": new_key()}, timeout=30
                ).status_code
            except requests.RequestException:
                status = 0
            with self._lock:
                self.answers.append(Answer(sent, time.monotonic() - sent, status))

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._client) for _ in range(self.threads)]
        for t in self._workers:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(60)

    def between(self, start: float, end: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if start <= a.sent < end]


def lines_by_worker(log: str, event: str) -> Counter[int]:
    return Counter(int(pid) for pid in re.findall(rf"\[(\d+)\] \w+ idem_shim: idempotency {event}\b", log))


@pytest.mark.slow
def test_a_store_outage_under_load_is_answered_at_once_and_recovered_from_in_a_probe(
    db: Database, run_server: RunServer
) -> None:
    server = serve(run_server, db)
    workers = set(server.worker_pids())
    with Load(server) as load:
        time.sleep(2.0)
        stopping = time.monotonic()
        db.cluster.stop("fast")
        stopped = time.monotonic()
        time.sleep(4.0)
        starting = time.monotonic()
        db.cluster.start()
        started = time.monotonic()
        time.sleep(2.5)
    up = [a for a in load.between(0, stopping) if a.answered < stopping]  # not caught by the stop
    down = load.between(stopped, starting)
    back = load.between(started + PROBE_INTERVAL + 0.5, time.monotonic())
    assert len(up) > 20 and all(a.status == 201 for a in up), Counter(a.status for a in up)
    assert len(down) > 20, f"only {len(down)} answers during the outage"
    assert {a.status for a in down} == {503}, Counter(a.status for a in down)
    slowest = max(a.seconds for a in down)
    assert slowest < POOL_TIMEOUT / 2, f"an answer during the outage took {slowest:.2f} s: it waited for the pool"
    assert len(back) > 20 and {a.status for a in back} == {201}, Counter(a.status for a in back)
    assert not [a for a in load.answers if a.status not in (201, 503)], "a 5xx other than 503, or a lost answer"

    # one line per change of state and worker, none per request, none of psycopg_pool's attempts
    log = server.log()
    downs, backs = lines_by_worker(log, "store_down"), lines_by_worker(log, "store_back")
    assert set(downs) <= workers and downs and all(n == 1 for n in downs.values()), downs
    assert backs == downs, (downs, backs)
    assert "error connecting in 'idem'" not in log
    # (a request caught in its handler by the stop may log its completion's failure: not a claim)
    assert not re.search(r"(WARNING|ERROR) idem_shim: idempotency store_unavailable .*stage=claim", log), log[-3000:]

    # the store down again with no request in flight, back, and one request: it is served
    db.cluster.stop("fast")
    try:
        for _ in range(8):  # every worker finds it down
            assert post(server, "/orders", new_key()).status_code == 503
        time.sleep(PROBE_INTERVAL + 0.2)
    finally:
        db.cluster.start()
    first = post(server, "/orders", new_key())
    assert first.status_code == 201, first.text
    assert set(server.worker_pids()) == workers, "recovered without restarting a worker"


@pytest.fixture
def elsewhere() -> Iterator[Cluster]:
    """Another server, for a business database that is not the store's."""
    cluster = Cluster()
    try:
        with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
            conn.execute(SCHEMA)
        yield cluster
    finally:
        cluster.destroy()


def test_fail_open_whose_handler_shares_the_stores_database_answers_tier_ones_503(
    db: Database, run_server: RunServer
) -> None:
    server = serve(run_server, db, workers=2, IDEM_ERROR_FORMAT="problem+json")
    key = new_key()
    assert post(server, "/billing", key).status_code == 201
    db.cluster.stop("fast")
    try:
        for path, k in [("/billing", new_key()), ("/billing", new_key()), ("/billing", None), ("/orders", new_key())]:
            r = post(server, path, k)
            assert r.status_code == 503, f"{path}: {r.status_code} {r.text[:300]}"
            assert r.headers["Content-Type"].startswith("application/problem+json")
            assert r.headers["Retry-After"] == "1"
            body = r.json()
            assert body["error"] == "idempotency_store_unavailable" and body["status"] == 503
            assert body["type"].endswith("idempotency-store-unavailable")
    finally:
        db.cluster.start()
    # Each worker's breaker closes at its own next probe: the first 201 may come from one worker
    # while the other still answers 503, so the replay itself is what is waited for.
    wait_until(
        lambda: (r := post(server, "/billing", key)).status_code == 201 and r.headers["Idempotent-Replayed"] == "true",
        10,
        0.2,
        what="the stored 201 replayed once the store is back",
    )
    assert "Traceback" not in server.log()


def test_fail_open_whose_business_database_is_elsewhere_runs_without_dedup(
    db: Database, run_server: RunServer, elsewhere: Cluster
) -> None:
    server = serve(run_server, db, workers=2, ELSEWHERE_URL=elsewhere.admin_url)

    def rows(key: str) -> int:
        with psycopg.connect(elsewhere.admin_url) as conn:
            found = conn.execute("SELECT count(*) FROM public.outage_items WHERE idem_key = %s", (key,)).fetchone()
        return int(found[0]) if found else 0

    db.cluster.stop("fast")
    try:
        key = new_key()
        answers = [post(server, "/elsewhere", key) for _ in range(3)]
        assert [r.status_code for r in answers] == [201, 201, 201], [r.text[:200] for r in answers]
        assert all("Idempotent-Replayed" not in r.headers for r in answers)
        assert rows(key) == 3, "the store is down: each request runs, without dedup"
        assert post(server, "/orders", new_key()).status_code == 503, "Tier 1 still refuses"
    finally:
        db.cluster.start()
    # back on both workers: each closes its own breaker, and one 201 may come from the first alone
    # (then the second's fail-open ran the repeat below without dedup: a fresh-clone CI caught it)
    wait_until(
        lambda: all(post(server, "/orders", new_key()).status_code == 201 for _ in range(10)),
        10,
        0.2,
        what="the store back on both workers",
    )
    key = new_key()
    assert post(server, "/elsewhere", key).status_code == 201
    again = post(server, "/elsewhere", key)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert rows(key) == 1, "the store back: the key dedups again"


def test_every_scrape_of_two_workers_shows_both_with_the_gunicorn_conf_of_adopting_md(
    db: Database, run_server: RunServer, tmp_path: Path
) -> None:
    blocks = docrunner.parse((ROOT / "docs" / "adopting.md").read_text())
    conf_text = next(
        "\n".join(b.lines) for b in blocks if b.kind == "python" and "PROMETHEUS_MULTIPROC_DIR" in "\n".join(b.lines)
    )
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(conf_text)
    server = serve(run_server, db, workers=2, conf=conf)
    # two requests at once, each held 0.8 s: two sync workers serve one each
    with ThreadPoolExecutor(2) as pool:
        sent = [
            pool.submit(
                requests.post,
                server.base + "/orders",
                json={"qty": 1},
                headers={"Idempotency-Key": new_key(), "X-Sleep-Ms": "800"},
                timeout=30,
            )
            for _ in range(2)
        ]
        assert [f.result().status_code for f in sent] == [201, 201]
    for _ in range(6):  # whichever worker serves the scrape
        text = requests.get(server.base + "/metrics", timeout=10).text
        assert 'idempotency_miss_total{endpoint="POST /orders"} 2.0' in text, text[:2000]
        assert "idempotency_store_health_up" in text, "the store's gauges, read by the worker"
