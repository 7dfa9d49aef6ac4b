"""Fixtures of the end-to-end suite: one private cluster for the session, a database per test
cloned from a migrated template, and gunicorn servers that are always stopped after a test."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.simulators.process import Simulator
from tests.python.e2e.e2e_harness import (
    PG_BIN,
    RAPTOR_APP,
    Cluster,
    Database,
    PgBouncer,
    RunServer,
    Server,
    StartServer,
    prepare_template,
)

TEMPLATE = "raptor_e2e_template"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a longer end-to-end test (still part of make test)")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL server binaries not found in {PG_BIN}: run `make deps`")
    c = Cluster()
    try:
        prepare_template(c, TEMPLATE)
        yield c
    finally:
        c.destroy()


@pytest.fixture
def db(cluster: Cluster) -> Iterator[Database]:
    name = f"raptor_e2e_{uuid.uuid4().hex[:8]}"
    cluster.create_database(name, template=TEMPLATE)
    yield Database(cluster, name)
    with contextlib.suppress(Exception):  # the cluster may be down after a failed test
        cluster.drop_database(name)


@pytest.fixture
def run_server() -> Iterator[RunServer]:
    """run_server(Server(...)) -> that server, started; stopped after the test (any app)."""
    servers: list[Server] = []

    def run(server: Server) -> Server:
        servers.append(server)
        return server.start()

    yield run
    for server in servers:
        server.stop()


@pytest.fixture
def start_server(run_server: RunServer) -> StartServer:
    """start_server(database_url, **env) -> Raptor (or ``app``) under a running gunicorn; stopped
    after the test."""

    def start(database_url: str, workers: int = 4, app: str = RAPTOR_APP, **env: object) -> Server:
        return run_server(Server(database_url, env={k: str(v) for k, v in env.items()}, workers=workers, app=app))

    return start


@pytest.fixture
def pgbouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    if not shutil.which("pgbouncer") and not Path("/usr/sbin/pgbouncer").exists():
        pytest.fail("pgbouncer not installed: run `make deps`")
    bouncer = PgBouncer(cluster)
    yield bouncer
    bouncer.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Simulator]:
    """The broker simulator (its own process and SQLite file), stopped after the test."""
    sim = Simulator("broker", tmp_path / "broker").start()
    yield sim
    sim.stop()


@pytest.fixture
def stripe(tmp_path: Path) -> Iterator[Simulator]:
    """The Stripe simulator (its own process and SQLite file), stopped after the test."""
    sim = Simulator("stripe", tmp_path / "stripe").start()
    yield sim
    sim.stop()
