"""Which WSGI workers serve one request at a time (workers.serves_one_at_a_time): there a
waiting duplicate would hold the whole worker, so no claim waits."""

from __future__ import annotations

import pytest

from idem_shim.workers import serves_one_at_a_time


@pytest.mark.parametrize(
    ("environ", "one_at_a_time"),
    [
        ({"wsgi.multithread": False, "wsgi.multiprocess": True, "SERVER_SOFTWARE": "gunicorn/27.0.1"}, True),
        ({"wsgi.multithread": False, "wsgi.multiprocess": False, "SERVER_SOFTWARE": "gunicorn/27.0.1"}, True),
        ({"wsgi.multithread": False, "wsgi.multiprocess": True}, True),  # uWSGI's processes
        ({"wsgi.multithread": True, "wsgi.multiprocess": True, "SERVER_SOFTWARE": "gunicorn/27.0.1"}, False),
        ({"wsgi.multithread": True, "wsgi.multiprocess": False, "SERVER_SOFTWARE": "Werkzeug/3.1"}, False),
        ({"wsgi.multithread": False, "wsgi.multiprocess": False}, False),  # Werkzeug's test client
        ({}, False),
    ],
)
def test_which_workers_serve_one_request_at_a_time(environ: dict[str, object], one_at_a_time: bool) -> None:
    assert serves_one_at_a_time(environ) is one_at_a_time
