"""The Django REST framework app of drf-idempotency: POST /orders and POST /orders/raw, one view each.

    python -m bench.peers.drf_app migrate              # drf-idempotency's table (manage.py migrate)
    gunicorn -c examples/raptor/gunicorn.conf.py bench.peers.drf_app:application

As drf-idempotency's README Quick Start sets it up: its middleware project-wide and its
database backend (DatabaseBackend) on DATABASE_URL, through Django's PostgreSQL backend
(psycopg 3). The middleware acts on every POST that carries an Idempotency-Key, so the raw
route's requests carry none (they pass with one header lookup). Its other way in, `@idempotent()`
under `@api_view` as its docs show it, fails on the first request: it renders DRF's Response
before DRF has chosen a renderer (AssertionError: .accepted_renderer not set on Response) and
leaves the key in progress. Persistent connections (CONN_MAX_AGE = None), as Django's deployment
notes advise for speed: with the default 0 every request of both routes would open a
connection. DEBUG off, JSON parser and renderer only, no authentication (every request is
user 1's in the other apps too; drf-idempotency's key has no user scope).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

from bench.peers import orders


def _database() -> dict[str, Any]:
    dsn = conninfo_to_dict(os.environ["DATABASE_URL"])
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dsn.get("dbname", ""),
        "USER": dsn.get("user", ""),
        "PASSWORD": dsn.get("password", ""),
        "HOST": dsn.get("host", ""),
        "PORT": dsn.get("port", ""),
        "CONN_MAX_AGE": None,
    }


settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-only",  # noqa: S106 (no sessions, no signing: a bench app on loopback)
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework", "drf_idempotency"],
    MIDDLEWARE=["drf_idempotency.middleware.IdempotencyMiddleware"],
    DATABASES={"default": _database()},
    USE_TZ=True,
    REST_FRAMEWORK={
        "DEFAULT_AUTHENTICATION_CLASSES": [],
        "DEFAULT_PERMISSION_CLASSES": [],
        "UNAUTHENTICATED_USER": None,
        "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
        "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    },
    IDEMPOTENCY={"BACKEND": "drf_idempotency.backends.database.DatabaseBackend"},
)
django.setup()

from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.decorators import api_view  # noqa: E402
from rest_framework.request import Request  # noqa: E402
from rest_framework.response import Response  # noqa: E402


def _insert(request: Request) -> Response:
    orders.handler_work(request.query_params)
    # in a transaction of its own, as the Flask apps' handlers (BEGIN, INSERT, COMMIT)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(orders.INSERT, [request.headers.get("Idempotency-Key"), json.dumps(request.data)])
        (order_id,) = cur.fetchone()
    return Response({"id": order_id}, status=201)


@api_view(["POST"])
def create_order(request: Request) -> Response:
    return _insert(request)


def healthz(request: Any) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path(orders.PROTECTED.lstrip("/"), create_order),
    path(orders.RAW.lstrip("/"), create_order),
    path("healthz", healthz),
]
application = WSGIHandler()

if __name__ == "__main__":
    from django.core.management import execute_from_command_line

    execute_from_command_line([sys.argv[0], *sys.argv[1:]])
