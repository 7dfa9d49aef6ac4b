"""The FastAPI app of fastidempotent: POST /orders with @idempotent, POST /orders/raw without it.

    python -m bench.peers.fastapi_app init     # its table (PostgresBackend.init: create_all)
    GUNICORN_CMD_ARGS='--worker-class uvicorn_worker.UvicornWorker' \\
      gunicorn -c examples/raptor/gunicorn.conf.py bench.peers.fastapi_app:app

As fastidempotent's README sets it up: its PostgresBackend (SQLAlchemy's async engine on
asyncpg) and the `@idempotent(backend=...)` decorator on the route (its per-route way; its
middleware would answer the raw route's keyless requests 400). The table is named
fastidempotent_keys, not its example's idempotency_keys, which is idem's table in the same
database. An ASGI app runs in gunicorn's uvicorn worker, the same number of workers as the
others' sync ones. Its errors are plain exceptions (FastAPI would answer 500), so the app maps
them to the statuses their docstrings name: 409, 422, 400. The handler: the same INSERT on a
psycopg async pool of the worker's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastidempotent import PostgresBackend, idempotent
from fastidempotent.exceptions import DuplicateRequestError, FingerprintMismatchError, KeyTooLongError, MissingKeyError
from psycopg_pool import AsyncConnectionPool

from bench.peers import orders

URL = os.environ["DATABASE_URL"]


def _sqlalchemy_url(url: str) -> str:
    """DATABASE_URL for SQLAlchemy's asyncpg dialect (its query options go to asyncpg.connect)."""
    parts = urlsplit(url)
    query = [("ssl", v) if k == "sslmode" else (k, v) for k, v in parse_qsl(parts.query)]
    return urlunsplit(parts._replace(scheme="postgresql+asyncpg", query=urlencode(query)))


backend = PostgresBackend(url=_sqlalchemy_url(URL), table_name="fastidempotent_keys")
pool = AsyncConnectionPool(URL, min_size=1, max_size=2, kwargs={"prepare_threshold": 5}, open=False)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await pool.open()
    yield
    await pool.close()
    await backend.close()


app = FastAPI(lifespan=lifespan)
for error, status in (
    (DuplicateRequestError, 409),
    (FingerprintMismatchError, 422),
    (MissingKeyError, 400),
    (KeyTooLongError, 400),
):

    async def answer(request: Request, exc: Exception, status: int = status) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    app.add_exception_handler(error, answer)


async def _insert(request: Request) -> JSONResponse:
    seconds = orders.handler_seconds(request.query_params)
    if seconds:
        await asyncio.sleep(seconds)
    body = json.dumps(await request.json())
    async with pool.connection() as conn:  # commits on a clean exit
        cur = await conn.execute(orders.INSERT, (request.headers.get("Idempotency-Key"), body))
        row = await cur.fetchone()
    assert row is not None
    return JSONResponse({"id": row[0]}, status_code=201)


@app.post(orders.PROTECTED)
@idempotent(backend=backend)
async def create_order(request: Request) -> Any:
    return await _insert(request)


@app.post(orders.RAW)
async def create_order_raw(request: Request) -> Any:
    return await _insert(request)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__" and sys.argv[1:] == ["init"]:
    asyncio.run(backend.init())
