"""bench/peers (`make bench-peers`) without its own venv: the peers' pins stay out of the main venv,
and idem's app of that harness protects one route and leaves the other raw.

The harness itself needs .venv-peers and minutes of load, so `make test` does not run it.
"""

from __future__ import annotations

import re
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psycopg
import pytest

from bench.peers import orders

ROOT = Path(__file__).resolve().parents[3]


def _peers_group() -> list[str]:
    text = (ROOT / "requirements.txt").read_text()
    group = text[text.index("\n# peers:") :]
    return [line for line in group.splitlines() if line and not line.startswith("#")]


def test_the_peers_are_pinned_exactly_and_absent_from_the_main_venv() -> None:
    pins = _peers_group()
    assert {"idemkit", "drf-idempotency", "fastidempotent"} <= {p.split("==")[0] for p in pins}, pins
    for pin in pins:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", pin), f"not an exact pin: {pin}"
        with pytest.raises(PackageNotFoundError):  # make venv stops at the group's header
            version(pin.split("==")[0])


def test_the_idem_app_replays_its_protected_route_and_runs_the_raw_one_each_time(
    fresh_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.peers.flask_apps import idem_app

    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(orders.SCHEMA)
        conn.execute("INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")
    monkeypatch.setenv("DATABASE_URL", fresh_admin_url)
    client = idem_app().test_client()
    key = str(uuid.uuid4())
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    first = client.post(orders.PROTECTED, data=orders.BODY, headers=headers)
    again = client.post(orders.PROTECTED, data=orders.BODY, headers=headers)
    assert (first.status_code, again.status_code) == (201, 201), again.get_data(as_text=True)
    assert again.get_json()["id"] == first.get_json()["id"]
    raw = [client.post(orders.RAW, data=orders.BODY, headers={"Content-Type": "application/json"}) for _ in range(2)]
    assert [r.status_code for r in raw] == [201, 201]
    with psycopg.connect(fresh_admin_url) as conn:
        rows = conn.execute("SELECT idem_key, count(*) FROM orders GROUP BY idem_key ORDER BY idem_key").fetchall()
    assert rows == [(key, 1), (None, 2)]
