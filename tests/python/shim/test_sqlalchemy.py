"""Flask-SQLAlchemy and plain SQLAlchemy on the request's connection (contract §4d), in process: the
app is tests/python/e2e/orm_app.py, a payments app written as such apps are (``db.session.add``,
``db.session.commit``), wired with ``Idem(app, sqlalchemy=db)``. Payments are counted in the
database per key. The same cases under gunicorn, with a stale heal and a SIGKILL, are in
tests/python/e2e/test_orm.py.

``ORM_TEST_NAIVE=1`` builds the naive app instead (``Idem(app)``, the ORM on its own connection):
the cases that are the point then fail (2 payments, a payment committed under a failed key).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from psycopg_pool import ConnectionPool
from sqlalchemy import text

from idem_shim import Idem, connection, idempotency_key, idempotent
from idem_shim.queries import RESET_SESSION
from idem_shim.sqlalchemy import session as sqlalchemy_session
from tests.python.e2e import orm_app
from tests.python.support.shim import APP_ROLE, PgProxy, server_address, settled, shim_db

NAIVE = os.environ.get("ORM_TEST_NAIVE") == "1"


@pytest.fixture
def orm_url(fresh_admin_url: str) -> str:
    url = shim_db(fresh_admin_url)
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(orm_app.ORM_DDL.format(role=APP_ROLE))
    return url


@pytest.fixture
def make_orm_app(orm_url: str) -> Iterator[Any]:
    apps: list[Flask] = []

    def make(url: str | None = None, *, joined: bool = not NAIVE) -> Flask:
        app = orm_app.create_app(url or orm_url, joined=joined, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=4)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["idem"].store.close()
        with app.app_context():
            orm_app.db.engine.dispose()


def payments(url: str, key: str) -> list[int]:
    """The amounts committed for a key."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT amount_cents FROM public.orm_payments WHERE client_key = %s ORDER BY id", (key,)
        ).fetchall()
    return [row[0] for row in rows]


def post(app: Flask, path: str, key: str, **headers: str) -> Any:
    """POST with the key; an exception the handler raised is Flask's 500, as a server answers."""
    app.config["PROPAGATE_EXCEPTIONS"] = False
    return app.test_client().post(path, json={"lines": ["a", "b", "c"]}, headers={"Idempotency-Key": key, **headers})


def test_exception_after_commit_under_release_then_retry_pays_once(make_orm_app: Any, orm_url: str) -> None:
    app, key = make_orm_app(), str(uuid.uuid4())
    assert post(app, "/payments/release", key, **{"X-Test-Fail": "1"}).status_code == 500
    assert payments(orm_url, key) == []  # db.session.commit() did not end the transaction
    retried = post(app, "/payments/release", key)
    assert retried.status_code == 201
    assert payments(orm_url, key) == [100]


def test_exception_after_commit_under_keep_commits_nothing_and_answers_alike(make_orm_app: Any, orm_url: str) -> None:
    app, key = make_orm_app(), str(uuid.uuid4())
    assert post(app, "/payments", key, **{"X-Test-Fail": "1"}).status_code == 500
    retried = post(app, "/payments", key)
    assert (retried.status_code, retried.json["error"]) == (409, "idempotency_previous_failed")
    assert payments(orm_url, key) == []  # the key says failed, and nothing was paid


def test_a_5xx_answer_rolls_the_orm_back(make_orm_app: Any, orm_url: str) -> None:
    app, key = make_orm_app(), str(uuid.uuid4())
    assert post(app, "/payments", key, **{"X-Test-Fail": "500"}).status_code == 500
    assert payments(orm_url, key) == []


def test_rollback_in_the_handler_undoes_the_orm_part_only(make_orm_app: Any, orm_url: str) -> None:
    app, key = make_orm_app(), str(uuid.uuid4())
    answer = post(app, "/payments/corrected", key)
    assert (answer.status_code, answer.json) == (201, {"amounts": [1, 3], "counted": 2, "first": 1})
    assert payments(orm_url, key) == [1, 3]
    replay = post(app, "/payments/corrected", key)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert payments(orm_url, key) == [1, 3]


def test_relationship_flush_order_and_expire_on_commit(make_orm_app: Any, orm_url: str) -> None:
    """A payment and its three lines (four INSERTs, parent first); after commit() the expired
    attributes load again on the request's connection, and the ids are the committed rows'."""
    app, key = make_orm_app(), str(uuid.uuid4())
    answer = post(app, "/payments", key)
    assert answer.status_code == 201
    with psycopg.connect(orm_url) as conn:
        rows = conn.execute(
            "SELECT p.id, l.id, l.label FROM public.orm_payments p JOIN public.orm_payment_lines l "
            "ON l.payment_id = p.id WHERE p.client_key = %s ORDER BY l.id",
            (key,),
        ).fetchall()
    assert [row[2] for row in rows] == ["a", "b", "c"]
    assert answer.json == {"payment_id": rows[0][0], "lines": [row[1] for row in rows]}


def test_outside_decorated_routes_db_session_is_the_apps_own(make_orm_app: Any, orm_url: str) -> None:
    app, key = make_orm_app(), str(uuid.uuid4())
    assert post(app, "/payments", key).status_code == 201
    seen = app.test_client().get(f"/payments/{key}")
    assert seen.json == {"payments": 1, "app_engine": True}
    # a session the app context held before the view (a user loader's) is its own again after it
    other = str(uuid.uuid4())
    answer = post(app, "/payments", other, **{"X-Test-Outer-Session": "1"})
    assert (answer.status_code, answer.headers["X-Test-Outer-Session-Kept"]) == (201, "True")
    assert payments(orm_url, other) == [100]


def test_the_joined_session_keeps_the_session_options_db_was_made_with(orm_url: str) -> None:
    """``SQLAlchemy(session_options={"expire_on_commit": False})``: the joined session too; it is
    bound to the request's connection inside the route, the app's engine outside."""
    db = SQLAlchemy(session_options={"expire_on_commit": False})
    app = Flask("orm_options")
    app.config.update(IDEM_DATABASE_URL=orm_url, SQLALCHEMY_DATABASE_URI=orm_app.sqlalchemy_url(orm_url))
    db.init_app(app)
    seen: dict[str, Any] = {}

    @app.post("/probe")
    @idempotency_key(service=True)
    def probe() -> Any:
        bind = db.session.get_bind()
        assert isinstance(bind, sqlalchemy.Connection)
        seen.update(expire=db.session().expire_on_commit, driver=bind.connection.driver_connection, conn=connection())
        db.session.execute(text("SELECT 1"))
        return {"ok": True}, 200

    Idem(app, sqlalchemy=db)
    try:
        assert post(app, "/probe", str(uuid.uuid4())).status_code == 200
        assert seen["expire"] is False
        assert seen["driver"] is seen["conn"]  # the session's connection is idem's own, not a proxy
        with app.app_context():
            assert db.session.get_bind() is db.engine and db.session().expire_on_commit is False
    finally:
        app.extensions["idem"].store.close()
        with app.app_context():
            db.engine.dispose()


def test_plain_sqlalchemy_session_joins_the_request(make_orm_app: Any, orm_url: str) -> None:
    app, key = make_orm_app(joined=False), str(uuid.uuid4())  # idem_shim.sqlalchemy.session() needs no db
    assert post(app, "/payments/plain-sqlalchemy", key, **{"X-Test-Fail": "1"}).status_code == 500
    assert payments(orm_url, key) == []
    retried = post(app, "/payments/plain-sqlalchemy", key)
    assert (retried.status_code, retried.json) == (201, {"same": True})
    assert payments(orm_url, key) == [7]


def test_plain_sqlalchemy_session_joins_an_idempotent_call(orm_url: str) -> None:
    """A queue consumer's ``idempotent()`` writing through the ORM: its failure after
    ``session.commit()`` pays nothing, the redelivery pays once, a third replays."""
    calls: list[str] = []

    with ConnectionPool(orm_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:

        @idempotent(scope="orm.consumer", db=pool, on_failure="release")
        def consume(key: str) -> int:
            calls.append(key)
            session = sqlalchemy_session()
            payment = orm_app.Payment(client_key=key, amount_cents=9)
            session.add(payment)
            session.commit()
            if len(calls) == 1:
                raise RuntimeError("the consumer failed after session.commit()")
            return int(payment.id)

        key = str(uuid.uuid4())
        with pytest.raises(RuntimeError):
            consume(key)
        assert payments(orm_url, key) == []
        paid = consume(key)
        assert consume(key) == paid and len(calls) == 2
    assert payments(orm_url, key) == [9]


def test_the_orm_path_costs_one_round_trip_more(fresh_admin_url: str, orm_url: str, make_orm_app: Any) -> None:
    """Contract §4d: the ORM's SAVEPOINT is the one more; its commit() sends nothing (the
    decorator's COMMIT releases it), and the dialect's first-connect queries run once per app."""
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    try:
        app = make_orm_app(proxy.url(orm_url))
        trips: dict[str, int] = {}
        for path in ("/minimal/plain", "/minimal/orm"):
            assert post(app, path, str(uuid.uuid4())).status_code == 201  # warm: pool, dialect
            settled(app)
            proxy.reset()
            assert post(app, path, str(uuid.uuid4())).status_code == 201
            settled(app)  # the connection given back is reset, after the request: not its round trips
            statements = [s for s in proxy.statements if s != RESET_SESSION]
            trips[path] = proxy.ready_for_query - (len(proxy.statements) - len(statements))
            if path == "/minimal/orm":
                assert [s.split()[0].upper() for s in statements if "idem_" not in s] == [
                    "BEGIN",
                    "SAVEPOINT",
                    "INSERT",
                    "COMMIT",
                ]
        assert trips["/minimal/orm"] == trips["/minimal/plain"] + 1
    finally:
        proxy.stop()


def test_the_connection_lost_under_the_orm_is_the_store_unavailable(orm_url: str, make_orm_app: Any) -> None:
    """SQLAlchemy raises its own OperationalError from psycopg's: still the 503 of a lost store,
    never the handler's 500."""
    proxy = PgProxy(server_address(orm_url)).start()
    try:
        app = make_orm_app(proxy.url(orm_url))
        app.config["ORM_TEST_BEFORE_WORK"] = proxy.stop
        key = str(uuid.uuid4())
        answer = post(app, "/payments/cut", key)
        assert answer.status_code == 503
    finally:
        proxy.stop()
    assert payments(orm_url, key) == []


def test_a_claimed_request_that_ran_nothing_on_the_connection_warns_once(
    make_orm_app: Any, orm_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The naive app (the ORM on its own connection) is told, once per route and process, with
    the route and the fix; the joined app and a route declared writes_elsewhere are quiet."""
    caplog.set_level(logging.WARNING, logger="idem_shim")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "handler_ran_nothing_on_connection" in r.getMessage()]

    naive = make_orm_app(joined=False)
    for _ in range(3):
        assert post(naive, "/payments", str(uuid.uuid4())).status_code == 201
    assert post(naive, "/payments/release", str(uuid.uuid4())).status_code == 201
    assert post(naive, "/payments/elsewhere", str(uuid.uuid4())).status_code == 200
    lines = warnings()
    assert len(lines) == 2
    assert 'endpoint="POST /payments"' in lines[0] and 'endpoint="POST /payments/release"' in lines[1]
    assert all("Idem(app, sqlalchemy=db)" in line and "writes_elsewhere=True" in line for line in lines)

    caplog.clear()
    joined = make_orm_app(joined=True)
    for path in ("/payments", "/payments/release", "/payments/elsewhere"):
        assert post(joined, path, str(uuid.uuid4())).status_code in (200, 201)
    assert warnings() == []
