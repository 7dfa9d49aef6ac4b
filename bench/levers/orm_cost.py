"""Lever: the ORM path's cost against the plain connection's, in one process (issue 40, item 7).

    python -m bench.levers.orm_cost URL [ROUNDS] [REQUESTS]      # or: make bench-orm

Three Flask apps with one decorated POST /orders route each (user 1's key, as bench/peers'), the
same INSERT of bench/peers/orders.py's ``orders`` row, served straight through the WSGI call (no
gunicorn, no HTTP):

- plain: the INSERT on ``idem_shim.connection()``, as the README's route;
- joined: Flask-SQLAlchemy, ``db.session.add(order); db.session.commit()``, wired with
  ``Idem(app, sqlalchemy=db)`` (the session on the request's connection: one SAVEPOINT more);
- naive: the same handler, ``Idem(app)`` alone (the ORM on a pool of its own: it commits apart
  from the key, which is what issue 40 found broken; here for its price only).

Rounds alternate the order of the three. Per request: the worker's CPU (``time.process_time_ns``:
this thread and the pools' threads), the database's CPU (/proc/PID/schedstat of every client
backend of URL's database, read before and after a batch, so run it on the database's machine),
medians of the rounds. The round trips are counted in a pass of their own, after the rounds, the
three apps on bench/proxy.py (no delay) so the proxy's thread is in none of the CPU figures: every
round trip a request causes, the pools' resets of a returned connection included.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from flask import Flask, g, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column
from werkzeug.test import EnvironBuilder

from bench.cpu_per_call import backend_cpu_us
from bench.levers.wsgi_cpu import cpu_per_request
from bench.peers import orders
from bench.proxy import Proxy
from tests.python.e2e.orm_app import sqlalchemy_url

CELLS = ("plain", "joined", "naive")
LABELS = {
    "plain": "plain: `idem_shim.connection()`",
    "joined": "Flask-SQLAlchemy joined: `Idem(app, sqlalchemy=db)`",
    "naive": "Flask-SQLAlchemy naive: `Idem(app)` (its own connection)",
}
#: The backends of URL's database but the one reading them.
BACKENDS = (
    "SELECT pid FROM pg_catalog.pg_stat_activity"
    " WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()"
    " AND backend_type OPERATOR(pg_catalog.=) 'client backend'"
    " AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()"
)


def orm_handler(db: SQLAlchemy) -> Callable[[], Any]:
    """A Flask-SQLAlchemy app's handler for the row, written as such apps write it (the model on
    this ``db``'s own ``Model``: each app its own)."""

    class Order(db.Model):  # type: ignore[name-defined,misc]  # db.Model is made at run time
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(primary_key=True)
        idem_key: Mapped[str | None]
        payload: Mapped[Any] = mapped_column(JSONB)

    def create_order() -> Any:
        order = Order(idem_key=request.headers.get("Idempotency-Key"), payload=request.get_json())
        db.session.add(order)
        db.session.commit()
        return jsonify(id=order.id), 201

    return create_order


def make_app(cell: str, url: str) -> Flask:
    from idem_shim import Idem, connection, idempotency_key

    app = Flask(f"orm_cost_{cell}")
    app.config["IDEM_DATABASE_URL"] = url
    db: SQLAlchemy | None = None
    if cell == "plain":

        def create_order() -> Any:
            body = json.dumps(request.get_json())
            row = connection().execute(orders.INSERT, (request.headers.get("Idempotency-Key"), body)).fetchone()
            assert row is not None  # INSERT ... RETURNING
            return jsonify(id=row[0]), 201

    else:
        db = SQLAlchemy()
        app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(url)
        create_order = orm_handler(db)
        db.init_app(app)
    # writes_elsewhere on the naive route: its price without the once-per-process WARNING
    decorated = idempotency_key(ttl_hours=24, fail_closed=True, writes_elsewhere=cell == "naive")(create_order)
    app.add_url_rule(orders.PROTECTED, endpoint="create_order", view_func=decorated, methods=["POST"])

    @app.before_request
    def user() -> None:
        g.current_user_id = 1

    Idem(app, sqlalchemy=db if cell == "joined" else None)
    return app


def environs(n: int) -> list[dict[str, Any]]:
    return [
        EnvironBuilder(
            path=orders.PROTECTED,
            method="POST",
            data=orders.BODY,
            headers=[("Content-Type", "application/json"), ("Idempotency-Key", str(uuid.uuid4()))],
        ).get_environ()
        for _ in range(n)
    ]


def backends_cpu_us(monitor: psycopg.Connection[Any]) -> dict[int, float]:
    cpu: dict[int, float] = {}
    for (pid,) in monitor.execute(BACKENDS).fetchall():
        try:
            cpu[pid] = backend_cpu_us(pid)
        except OSError:  # gone between the listing and the read
            pass
    return cpu


def batch(app: Flask, monitor: psycopg.Connection[Any], n: int) -> tuple[float, float]:
    """(worker CPU µs, database CPU µs) per request over n requests."""
    env = environs(n)
    before = backends_cpu_us(monitor)
    worker = cpu_per_request(app, env, time.process_time_ns, f"orm_cost: {app.name}")
    time.sleep(0.05)  # the pools' resets of the last connection given back
    after = backends_cpu_us(monitor)
    return worker, sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items()) / n


def close(app: Flask) -> None:
    """The app's pools: idem's, and the ORM's engine when it has one."""
    app.extensions["idem"].store.close()
    if "sqlalchemy" in app.extensions:
        with app.app_context():
            app.extensions["sqlalchemy"].engine.dispose()


def round_trips(url: str, n: int) -> dict[str, float]:
    """Round trips per request of each app, on bench/proxy.py (a pass of its own)."""
    target = conninfo_to_dict(url)
    proxy = Proxy(
        ("127.0.0.1", 0), (str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432)), 0
    ).start()
    try:
        via = make_conninfo(url, host=proxy.listen[0], port=str(proxy.listen[1]), sslmode="disable")
        trips: dict[str, float] = {}
        for cell in CELLS:
            app = make_app(cell, via)
            cpu_per_request(app, environs(20), time.process_time_ns, "orm_cost: warm-up")
            time.sleep(0.2)
            before = proxy.counts.snapshot()[0]
            for env in environs(n):
                cpu_per_request(app, [env], time.process_time_ns, "orm_cost: round trips")
                time.sleep(0.01)  # the reset of the connection given back lands in this request's count
            time.sleep(0.2)
            trips[cell] = (proxy.counts.snapshot()[0] - before) / n
            close(app)  # its connections end before the proxy's loop does
        return trips
    finally:
        proxy.stop()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    url = args[0]
    rounds = int(args[1]) if len(args) > 1 else 6
    n = int(args[2]) if len(args) > 2 else 400
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="idem-orm-cost-"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(orders.SCHEMA)
        conn.execute("INSERT INTO public.users (id) VALUES (1) ON CONFLICT DO NOTHING")
    apps = {cell: make_app(cell, url) for cell in CELLS}
    spent: dict[str, dict[str, list[float]]] = {c: {"worker": [], "database": []} for c in CELLS}
    with psycopg.connect(url, autocommit=True) as monitor:
        for app in apps.values():  # warm-up: pools, the dialect's first connect, prepared statements
            batch(app, monitor, min(200, n))
        for i in range(rounds):
            for cell in CELLS if i % 2 else CELLS[::-1]:
                worker, database = batch(apps[cell], monitor, n)
                spent[cell]["worker"].append(worker)
                spent[cell]["database"].append(database)
    trips = round_trips(url, min(n, 100))
    med = {c: {k: statistics.median(v) for k, v in spent[c].items()} for c in CELLS}
    plain = med["plain"]
    print(f"{rounds} rounds of {n} requests, medians; µs of CPU per request (ratio to the plain route):")
    print("| route | worker CPU | database CPU | round trips |")
    print("| --- | ---: | ---: | ---: |")
    for c in CELLS:
        w, d = med[c]["worker"], med[c]["database"]
        print(
            f"| {LABELS[c]} | {w:.0f} ({w / plain['worker']:.2f}×) | {d:.0f} ({d / plain['database']:.2f}×) "
            f"| {trips[c]:g} ({trips[c] / trips['plain']:.2f}×) |"
        )


if __name__ == "__main__":
    main()
