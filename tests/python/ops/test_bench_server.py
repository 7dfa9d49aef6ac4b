"""The benchmark's gunicorn servers start even when the free port they were given is taken before
gunicorn binds it (another process's connection may pick it as its source port meanwhile)."""

from __future__ import annotations

import socket

from bench.http_path import Server


def test_a_server_whose_port_was_taken_before_it_bound_starts_on_another(fresh_admin_url: str) -> None:
    server = Server("taken", "bench.app:create_app()", {"DATABASE_URL": fresh_admin_url, "BENCH_IDEMPOTENCY": "off"}, 1)
    taken = server.port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        server.start()
        try:
            server.wait_ready(timeout=60)
            assert server.port != taken
        finally:
            server.stop()
