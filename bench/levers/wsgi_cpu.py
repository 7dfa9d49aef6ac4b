"""CPU per request of a Flask app served straight through its WSGI call (no gunicorn, no HTTP),
for the levers that time the worker's Python: worker_buckets, floor_worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def cpu_per_request(app: Any, environs: list[dict[str, Any]], clock: Callable[[], int], who: str) -> float:
    """CPU µs per request of ``clock`` over ``environs`` (built beforehand, untimed); every
    answer must be a 201, else ``who`` stops the run naming the first other one."""
    statuses: list[str] = []
    spent = 0
    for env in environs:
        start = clock()
        body = app.wsgi_app(env, lambda status, headers, exc_info=None: statuses.append(status))
        b"".join(body)
        getattr(body, "close", lambda: None)()
        spent += clock() - start
    bad = [s for s in statuses if not s.startswith("201")]
    if bad:
        raise SystemExit(f"{who}: the route answered {bad[0]!r}, not 201")
    return spent / len(environs) / 1000
