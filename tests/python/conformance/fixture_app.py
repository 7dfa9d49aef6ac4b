"""anyonce's fixture contract (tests/conformance/anyonce/README.md) as a Flask app behind idem's
decorator, in the one configuration docs/shim.md's **Conformance** section documents.

Every POST route requires the key and bumps one process-wide counter; ``GET /counter`` is behind
the layer too (a key on it is ignored: a safe method); ``POST /reset`` is the one route outside it.
Served by ``serve()``: werkzeug's threaded server in a thread, so a slow request and its
duplicate run at once on separate connections to the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from flask import Flask, Response, request
from werkzeug.serving import WSGIRequestHandler, make_server

from idem_shim import Idem, idempotency_key
from idem_shim.state import get_state

#: The documented configuration (docs/shim.md, **Conformance**).
CONFORMANCE_CONFIG: Final[dict[str, Any]] = {
    "IDEM_KEY_FORMAT": "opaque",  # the draft's keys are any sf-string, not only UUIDs
    "IDEM_OPAQUE_KEY_MIN_LENGTH": 1,  # the draft sets no minimum ("k-post-once-1" is 13)
    "IDEM_ERROR_FORMAT": "problem+json",  # RFC 9457 answers (the draft's §2.7)
    "IDEM_REPLAYED_HEADERS": ["Idempotent-Replayed", "Idempotency-Replayed"],  # Stripe's and anyonce's
    "IDEM_MAX_STORED_RESPONSE_BYTES": 1024 * 1024,  # anyonce's cap (D12): above it, no body stored
    "IDEM_REPLAY_BODY_MARKER": False,  # a replay is the stored bytes; the header marks it
}


class Counter:
    """The fixture's one process-global count of handler runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def bump(self) -> None:
        with self._lock:
            self.count += 1

    def reset(self) -> None:
        with self._lock:
            self.count = 0


def make_fixture_app(database_url: str, **overrides: Any) -> Flask:
    """The fixture routes on ``database_url`` (the app role's), in the conformance configuration
    (``overrides`` change a key of it)."""
    app = Flask("anyonce_fixture")
    app.config.update(IDEM_DATABASE_URL=database_url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=8)
    app.config.update(CONFORMANCE_CONFIG)
    app.config.update(overrides)
    counter = Counter()
    app.extensions["anyonce_counter"] = counter
    layer = idempotency_key(required=True, service=True)  # a service's route: no user scope

    @app.post("/echo")
    @layer
    def echo() -> Response:
        counter.bump()
        content_type = request.headers.get("Content-Type") or "application/octet-stream"
        return Response(request.get_data(), status=201, content_type=content_type)

    @app.post("/status/<int:code>")
    @layer
    def status(code: int) -> Response:
        counter.bump()
        return Response(f"status:{code}", status=code, content_type="text/plain")

    @app.post("/slow")
    @layer
    def slow() -> Response:
        counter.bump()
        ms = int(request.args.get("ms", "0"))
        time.sleep(ms / 1000)
        return Response(f"slept:{ms}", status=200, content_type="text/plain")

    @app.post("/large")
    @layer
    def large() -> Response:
        counter.bump()
        size = int(request.args.get("bytes", "0"))
        return Response(b"x" * size, status=200, content_type="application/octet-stream")

    @app.get("/counter")
    @layer
    def count() -> dict[str, int]:
        return {"count": counter.count}

    @app.post("/reset")
    def reset() -> Response:
        counter.reset()
        return Response(status=204)

    Idem(app)
    return app


class _Quiet(WSGIRequestHandler):
    """No access log line per request: a run's output is the test report."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


@contextmanager
def serve(app: Flask) -> Iterator[str]:
    """``app`` under werkzeug's threaded server on a free local port; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="anyonce-fixture", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()
        get_state(app).store.close()
