"""Behind PgBouncer in transaction mode, no client's session state reaches the shim's requests.

PgBouncer hands a server connection to one client per transaction, and a ``SET`` (not ``SET
LOCAL``) stays on that server connection for the next client of the pool: every client that logs
in as the app's role, so a handler's SQL injection on any route (contract §3a's threat model), a
worker's own connection, a script. By default PgBouncer resets nothing in transaction mode, and:

- ``SET default_transaction_read_only = on``: every claim on that server connection fails
  25006, which the shim takes for a failover: it closes its connection and the retry lands on
  the same server connection. 503 for every request (Tier 2: no deduplication) until PgBouncer
  closes it (``server_lifetime``, an hour);
- ``SET statement_timeout = 1``: the claims on it are cancelled (503);
- ``SET ROLE idem_app``: the handlers after it lose the login role's grants (500).

The documented PgBouncer settings (docs/shim.md, "Behind PgBouncer", its ``ini`` block) reset each
server connection as its transaction ends. The test runs PgBouncer with them (one server
connection, so every client shares it) and asserts the shim's requests are served.
"""

from __future__ import annotations

import re
import shutil
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.python.e2e.e2e_harness import PgBouncer
from tests.python.support import shim

DOCS = Path(__file__).resolve().parents[3] / "docs" / "shim.md"

POISONS = (
    "SET default_transaction_read_only = on",
    "SET statement_timeout = 1",
    "SET ROLE idem_app",
)


def documented_settings() -> str:
    """The ``ini`` block of docs/shim.md's "Behind PgBouncer" paragraph ("" when it has none)."""
    text = DOCS.read_text()
    start = text.index("**Behind PgBouncer**")
    block = re.search(r"```ini\n(.*?)```", text[start : start + 4000], re.S)
    return block.group(1) if block else ""


@pytest.fixture
def bouncer_for(shim_web_url: str, admin_url: str) -> Iterator[Callable[[str], str]]:
    """``bouncer_for(settings)``: the app role's URL through a PgBouncer of its own (transaction
    mode, ``settings`` added, one server connection for every client); stopped after the test."""
    if not shutil.which("pgbouncer") and not Path("/usr/sbin/pgbouncer").exists():
        pytest.fail("pgbouncer not installed: run `make deps`")
    host, port = shim.server_address(admin_url)
    assert host in ("127.0.0.1", "localhost"), "PgBouncer's [databases] entry names 127.0.0.1"
    bouncers: list[PgBouncer] = []

    def start(settings: str) -> str:
        # the harness's own reset off: ``settings`` alone decide (the later line wins)
        config = "default_pool_size = 1\nserver_reset_query_always = 0\n" + settings
        bouncers.append(PgBouncer(types.SimpleNamespace(port=port), users=(shim.APP_ROLE,), settings=config))
        return shim.with_host_port(shim_web_url, "127.0.0.1", bouncers[-1].port)

    yield start
    for bouncer in bouncers:
        bouncer.stop()


@pytest.mark.parametrize("poison", POISONS)
def test_a_clients_set_never_reaches_the_next_clients_requests(
    bouncer_for: Callable[[str], str], make_app: shim.AppFactory, poison: str
) -> None:
    through_bouncer = bouncer_for(documented_settings())
    with psycopg.connect(through_bouncer, autocommit=True, prepare_threshold=None) as attacker:
        attacker.execute(poison)  # its own transaction; the server connection goes back to the pool
    app = make_app(url=through_bouncer, IDEM_PREPARE_THRESHOLD=None, IDEM_STATEMENT_TIMEOUT_MS=None)
    client = app.test_client()
    answers = [shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"v{i}"}, user=2) for i in range(3)]
    assert [a.status_code for a in answers] == [201] * 3, f"the requests ran under another client's {poison!r}"
