"""A handler's session state leaves with its request: the shim's pool hands the next request a
connection as it was opened.

``connection()`` is the shim's pooled connection, and a ``SET`` (not ``SET LOCAL``) that commits
stays with the session. A handler's SQL injection (contract §3a's threat model) that runs
``SET client_encoding = 'SQL_ASCII'`` made every later request on that connection, any user's,
a 500 (psycopg decodes nothing as text any more: the claim's row is bytes) until the connection
was recycled, an hour later; one such request per pooled connection and every decorated route
was down. A ``SET statement_timeout`` of a few milliseconds stayed for the next users' claims,
a ``search_path`` and a temp table for their handlers' unqualified names (their orders went to
the attacker's table, dropped with the session), and a ``SET ROLE idem_app`` cost their handlers
the login role's grants (500).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flask import g
from psycopg_pool import ConnectionPool

import idem_shim
from idem_shim import idempotent
from idem_shim.pool import reset_session
from tests.python.support import shim

POISON = (
    "SET client_encoding = 'SQL_ASCII'",
    "SET statement_timeout = 3",
    "SET search_path = pg_temp, public",
    "SET application_name = 'injected'",
    # pg_temp is searched first for relations: the next handlers' orders would land here.
    "CREATE TEMP TABLE shim_orders (LIKE public.shim_orders INCLUDING ALL)",
)


#: After the handler's own writes: the next handlers' would lose the login role's grants.
POISON_AFTER_WRITES = ("SET ROLE idem_app",)


def _injected(order: shim.Order) -> Any:
    """A handler whose query an attacker controls (``inject`` in the body: before or after its
    writes)."""
    inject = order.body.get("inject")
    for statement in POISON if inject == "before" else ():
        idem_shim.connection().execute(statement)
    answer = shim.places_order(order)
    for statement in POISON_AFTER_WRITES if inject == "after" else ():
        idem_shim.connection().execute(statement)
    return answer


def _session(app: Any) -> tuple[Any, ...]:
    with shim.state_of(app).store.pool.connection() as conn:
        row = conn.execute(
            "SELECT pg_catalog.current_setting('client_encoding'), pg_catalog.current_setting('statement_timeout'),"
            " pg_catalog.current_setting('search_path'), pg_catalog.current_setting('application_name'),"
            " current_user"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_the_next_request_gets_the_session_as_it_was_opened(make_app: shim.AppFactory, shim_web_url: str) -> None:
    app = make_app(_injected, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_STATEMENT_TIMEOUT_MS=5000)
    client = app.test_client()
    assert shim.post(client, "/orders", str(uuid.uuid4()), {"item": "warm-up"}, user=2).status_code == 201
    opened = _session(app)
    for inject in ("after", "before"):  # the attacker's requests
        shim.post(client, "/orders", str(uuid.uuid4()), {"item": "x", "inject": inject}, user=1)
    answers = [shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"v{i}"}, user=2) for i in range(3)]
    assert [a.status_code for a in answers] == [201] * 3, "another user's requests ran under the handler's SET"
    assert _session(app) == opened
    stored = shim.scalar(
        shim_web_url, "SELECT pg_catalog.count(*) FROM public.shim_orders WHERE user_id OPERATOR(pg_catalog.=) 2"
    )
    assert stored == 4, "another user's orders went to the handler's temp table"


RESPONSE_KEY = "Zq3vX9pLm2Rt8sWb4Ky7Hn1Jd6Fc5Ga0"
#: What a session holds that outlives a transaction and a query can read: its settings, its
#: prepared statements and cursors.
SESSION_TEXT = """\
SELECT pg_catalog.concat_ws(' ',
    (SELECT pg_catalog.string_agg(s.name OPERATOR(pg_catalog.||) '=' OPERATOR(pg_catalog.||) s.setting, ' ')
       FROM pg_catalog.pg_settings s WHERE s.source OPERATOR(pg_catalog.=) 'session'),
    (SELECT pg_catalog.string_agg(p.statement, ' ') FROM pg_catalog.pg_prepared_statements p),
    (SELECT pg_catalog.string_agg(c.statement, ' ') FROM pg_catalog.pg_cursors c))"""


def _reads_its_session(order: shim.Order) -> Any:
    """A handler that reads what its session holds once the claim has run on it."""
    scope = g._idem_scope
    left = idem_shim.connection().execute(SESSION_TEXT).fetchone()
    return {"left": left[0] if left else "", "fence": scope.claim_token, "key": scope.key}, 201


def test_a_claim_leaves_nothing_of_its_request_on_the_session(make_app: shim.AppFactory) -> None:
    """Held: the claim's key, token, body and the response key are bound parameters, and its one
    ``set_config`` is local to its transaction, so nothing of them stays for the session's next
    user (a later request on the pooled connection, PgBouncer's next client of the server one)."""
    app = make_app(_reads_its_session, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_RESPONSE_KEY=RESPONSE_KEY)
    for _ in range(7):  # past IDEM_PREPARE_THRESHOLD (5): the claim runs prepared too
        answer = shim.post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "card 4242"}, user=2)
        assert answer.status_code == 201, answer.get_json()
        seen = answer.get_json()
        for secret in (seen["key"], seen["fence"], RESPONSE_KEY, "4242"):
            assert secret and secret not in seen["left"], f"the claim left {secret!r} on the session: {seen['left']}"


ROOT = Path(__file__).resolve().parents[3]


def _set_config_calls(text: str) -> Iterator[str]:
    """Each ``set_config(...)`` call in ``text``, its parentheses matched."""
    for match in re.finditer(r"set_config\s*\(", text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        yield text[match.start() : end + 1]


def test_every_set_config_of_idem_is_local_to_its_transaction() -> None:
    """Held: a placeholder setting (``idem.anything``) is in neither ``pg_settings`` nor ``SHOW
    ALL``, so the session test above cannot see one; no set_config of the request path's (the
    shim's modules but ``schema/``, whose sessions are the migration tool's own) or of the SQL
    API's is session-wide (its third argument is ``true``), so none outlives its transaction."""
    sources = [*(ROOT / "python" / "idem_shim").glob("*.py"), *(ROOT / "sql").rglob("*.sql")]
    calls = [(path, call) for path in sources for call in _set_config_calls(path.read_text())]
    assert len(calls) >= 5, "found no set_config: the pattern is stale"
    session_wide = [
        f"{path.relative_to(ROOT)}: {call}" for path, call in calls if not re.search(r",\s*true\s*\)$", call, re.I)
    ]
    assert session_wide == []


def test_a_callers_pool_given_the_shims_reset_forgets_the_works_set(shim_web_url: str) -> None:
    """What docs/shim.md tells a caller of ``idempotent(db=<a pool>)``: its pool, given
    ``reset=idem_shim.pool.reset_session``, hands the next call the session as it was opened."""
    with ConnectionPool(shim_web_url, min_size=1, max_size=1, reset=reset_session, open=True) as pool:

        @idempotent(scope="jobs.reset", db=pool)
        def job(key: str, poison: bool) -> str:
            conn = idem_shim.connection()
            if poison:
                # Long enough that the job's own completion never hits it on a loaded machine.
                conn.execute("SET statement_timeout = '42min'")
            row = conn.execute("SELECT pg_catalog.current_setting('statement_timeout')").fetchone()
            return str(row[0]) if row else ""

        opened = job(key=str(uuid.uuid4()), poison=False)
        assert job(key=str(uuid.uuid4()), poison=True) == "42min"
        assert job(key=str(uuid.uuid4()), poison=False) == opened
