"""What both simulators share: a threaded HTTP server over one SQLite file, JSON answers, and
the fault switches a test flips at run time (POST /_sim/faults).

Faults (each a count of the next matching requests it applies to, or a delay):
- ``fail_before_accept``: answer 503 before anything is stored (the service is down);
- ``drop_after_accept``: store the request, then close the connection without an answer
  (the client cannot tell whether it was accepted: the case the idempotency key is for);
- ``delay_ms``: wait this long after storing, before answering (a slow service; a test kills
  the caller during the wait).
Malformed requests get the real service's 400/422, never a 500: every handler runs inside one
guard that turns an unexpected exception into a 400 naming it (and logs it).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger("simulator")


class Dropped(Exception):
    """The handler asks for the connection to be closed without an answer."""


@dataclass
class Faults:
    """The switches, guarded by the store's lock (one request at a time changes them)."""

    fail_before_accept: int = 0
    drop_after_accept: int = 0
    delay_ms: int = 0
    delay_count: int = 0  # 0 with delay_ms > 0: every request is delayed
    applied: dict[str, int] = field(
        default_factory=lambda: {"fail_before_accept": 0, "drop_after_accept": 0, "delay": 0}
    )

    def set(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise ValueError("faults: expected a JSON object")
        for name in ("fail_before_accept", "drop_after_accept", "delay_ms", "delay_count"):
            if name in body:
                value = body[name]
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**7:
                    raise ValueError(f"faults: {name} must be an integer >= 0")
                setattr(self, name, value)

    def view(self) -> dict[str, Any]:
        return {
            "fail_before_accept": self.fail_before_accept,
            "drop_after_accept": self.drop_after_accept,
            "delay_ms": self.delay_ms,
            "delay_count": self.delay_count,
            "applied": dict(self.applied),
        }

    def take(self, name: str) -> bool:
        count = getattr(self, name)
        if count > 0:
            setattr(self, name, count - 1)
            self.applied[name] += 1
            return True
        return False

    def take_delay(self) -> float:
        if self.delay_ms <= 0:
            return 0.0
        if self.delay_count > 0:
            self.delay_count -= 1
            if self.delay_count == 0:
                ms, self.delay_ms = self.delay_ms, 0
                self.applied["delay"] += 1
                return ms / 1000.0
        self.applied["delay"] += 1
        return self.delay_ms / 1000.0


class Store:
    """One SQLite file, one lock: each request's read-check-write is atomic."""

    def __init__(self, path: str, schema: str) -> None:
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(schema)
        self.faults = Faults()


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any
    body: bytes


Answer = tuple[int, Any, dict[str, str]]
Route = Callable[[Request], Answer]


def json_body(req: Request) -> Any:
    """The request's JSON, or ValueError (answered 400 by the caller's route)."""
    try:
        return json.loads(req.body.decode("utf-8") or "null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the body is not JSON: {exc}") from exc


def make_handler(store: Store, routes: dict[tuple[str, str], Route], bad_request: Callable[[str], Answer]) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= 1_000_000:
                self._answer(*bad_request("the body is too large"))
                return
            req = Request(self.command, url.path, parse_qs(url.query), self.headers, self.rfile.read(length))
            route = routes.get((self.command, url.path))
            if (self.command, url.path) == ("POST", "/_sim/faults"):
                try:
                    with store.lock:
                        store.faults.set(json_body(req))
                except ValueError as exc:
                    self._answer(*bad_request(str(exc)))
                    return
            if (self.command, url.path) in (("GET", "/_sim/faults"), ("POST", "/_sim/faults")):
                with store.lock:
                    self._answer(200, store.faults.view(), {})
                return
            if url.path == "/_sim/health":
                self._answer(200, {"status": "ok"}, {})
                return
            if route is None:
                self._answer(404, {"message": f"no route {self.command} {url.path}"}, {})
                return
            try:
                answer = route(req)
            except Dropped:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            except ValueError as exc:
                answer = bad_request(str(exc))
            except Exception as exc:  # a malformed request must never be a 500
                logger.exception("simulator: unexpected error")
                answer = bad_request(f"malformed request ({type(exc).__name__})")
            self._answer(*answer)

        def _answer(self, status: int, body: Any, headers: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

    return Handler


def serve(
    name: str,
    schema: str,
    build_routes: Callable[[Store], dict[tuple[str, str], Route]],
    bad_request: Callable[[str], Answer],
    argv: list[str] | None = None,
) -> None:
    """``python -m examples.simulators.<name> --port N --db PATH``: serve until killed.

    Prints one line ``<name> listening on http://127.0.0.1:<port>`` once it accepts connections
    (``--port 0`` picks a free port: the harnesses read it from that line).
    """
    parser = argparse.ArgumentParser(prog=f"python -m examples.simulators.{name}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--db", required=True, help="the SQLite file of its state (created if absent)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name}: %(message)s")
    store = Store(args.db, schema)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(store, build_routes(store), bad_request))
    server.daemon_threads = True
    print(f"{name} listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


def now() -> float:
    return time.time()
