"""Real processes for the end-to-end tests: a private PostgreSQL cluster, PgBouncer, and
Raptor under gunicorn, all on 127.0.0.1 and free ports.

The suite owns its cluster (not `make db-up`'s) because some tests stop and restart it.
Everything here is plain subprocess work; the tests only speak HTTP and SQL.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
import requests
from psycopg import sql

from tests.python.support import databases
from tests.python.support.races import delayed_worker_pid
from tests.python.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
PYTHON = os.environ.get("E2E_PYTHON", sys.executable)
IS_ROOT = os.geteuid() == 0
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def as_postgres(cmd: list[str]) -> list[str]:
    """initdb, postgres and pgbouncer refuse to run as root: run them as `postgres` there."""
    return ["runuser", "-u", "postgres", "--", *cmd] if IS_ROOT else cmd


# --- PostgreSQL ------------------------------------------------------------------------------


class Cluster:
    """A throwaway cluster: trust auth, its own port and directory.

    By default fsync, synchronous_commit and full_page_writes are off (speed: the e2e tests
    judge logic, not durability). `durable=True` turns all three on, as in production: the
    chaos soak (tests/python/chaos/) restarts the server with an immediate shutdown and counts on
    every acknowledged commit surviving the crash recovery. `extra_conf` adds settings.
    """

    def __init__(self, durable: bool = False, extra_conf: str = "") -> None:
        self.durable = durable
        self.dir = Path(tempfile.mkdtemp(prefix="raptor-e2e-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if IS_ROOT:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(
            as_postgres(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        on_off = "on" if durable else "off"
        conf = f"""
listen_addresses = '127.0.0.1'
port = {self.port}
unix_socket_directories = '{self.dir}'
max_connections = 300
fsync = {on_off}
synchronous_commit = {on_off}
full_page_writes = {on_off}
timezone = 'UTC'
log_min_messages = warning
{extra_conf}
"""
        subprocess.run(
            as_postgres(["tee", "-a", str(self.data / "postgresql.conf")]),
            input=conf.encode(),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.start()

    def start(self) -> None:
        subprocess.run(
            as_postgres(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.dir / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str, template: str | None = None) -> None:
        databases.create_database(self.admin_url, name, template)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run_python(*args: str, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}  # idem_shim: the venv's
    out = subprocess.run([PYTHON, *args], cwd=ROOT, env=full_env, check=True, capture_output=True, text=True)
    return out.stdout


def statements(path: Path) -> list[str]:
    """A SQL file's statements, one by one (as psql sends them: Citus forwards a DDL statement's
    text to the workers, so several in one query string would reach them together)."""
    text = "\n".join(ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.lstrip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def idem_migrate(url: str) -> None:
    """`idem migrate` (the venv's console script) on one database."""
    idem = Path(PYTHON).with_name("idem")
    subprocess.run(
        [str(idem) if idem.exists() else "idem", "migrate", "-q", "--database-url", url],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )


def prepare_template(cluster: Cluster, name: str) -> None:
    """A database migrated by `idem migrate`, Raptor's schema on top."""
    cluster.create_database(name)
    url = cluster.url(name)
    idem_migrate(url)
    run_python("-m", "examples.raptor", "init-db", "--database-url", url)


@dataclass
class Database:
    cluster: Cluster
    name: str

    @property
    def admin_url(self) -> str:
        return self.cluster.url(self.name)

    @property
    def app_url(self) -> str:
        return self.cluster.url(self.name, user="raptor_web")

    def query(self, text: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            cur = conn.execute(text, params)
            return cur.fetchall() if cur.description else []

    def scalar(self, text: str, params: Any = None) -> Any:
        rows = self.query(text, params)
        return rows[0][0] if rows else None

    def seed_user(self, cash_cents: int = 1_000_000_000, mode: str = "paper") -> User:
        sys.path[:0] = [str(ROOT)]
        from examples.raptor.cli import seed_user

        info = seed_user(self.admin_url, cash_cents=cash_cents, mode=mode)
        return User(info["user_id"], info["token"], info["lcc_leg_id"])

    def slow_order_worker(self, timeout: float = 10.0) -> int:
        """The pid of the gunicorn worker now sleeping in a test-delayed order."""

        return wait_until(lambda: delayed_worker_pid(self.admin_url), timeout, what="a slow order in pg_stat_activity")

    def orders_for_key(self, key: str) -> list[tuple[Any, ...]]:
        return self.query("SELECT id, status FROM raptor.paper_orders WHERE client_key = %s ORDER BY id", (key,))

    def fill_audit_rows(self, order_ids: list[int]) -> int:
        return int(
            self.scalar(
                "SELECT count(*) FROM public.audit_log WHERE action = 'paper_order_filled' "
                "AND (context->>'order_id')::bigint = ANY(%s)",
                (order_ids,),
            )
        )

    def key_rows(self, key: str) -> list[tuple[Any, ...]]:
        return self.query(
            "SELECT status, response_code FROM public.idempotency_keys WHERE idem_key = lower(%s)", (key,)
        )


@dataclass
class User:
    user_id: int
    token: str
    leg_id: int | None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def new_key() -> str:
    return str(uuid.uuid4())


# --- PgBouncer -------------------------------------------------------------------------------


class HasPort(Protocol):
    port: int


class PgBouncer:
    """Debian's pgbouncer in transaction pooling mode in front of a Cluster (or any server with a
    ``port`` on 127.0.0.1); ``users`` may log in (trust), ``settings`` are added to its own."""

    def __init__(
        self, cluster: HasPort, users: tuple[str, ...] = ("postgres", "raptor_web"), settings: str = ""
    ) -> None:
        exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self.dir = Path(tempfile.mkdtemp(prefix="raptor-e2e-pgb-"))
        self.port = free_port()
        (self.dir / "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in users))
        (self.dir / "pgbouncer.ini").write_text(f"""
[databases]
* = host=127.0.0.1 port={cluster.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
; after a PostgreSQL restart, try the next server login within a second (default 15 s)
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,options
; docs/shim.md "Behind PgBouncer": no client's SET reaches the next client of a server connection
server_reset_query = DISCARD ALL
server_reset_query_always = 1
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
{settings}
""")
        if IS_ROOT:
            for p in [self.dir, *self.dir.iterdir()]:
                shutil.chown(p, "postgres", "postgres")
        self.exe = exe
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            as_postgres([self.exe, str(self.dir / "pgbouncer.ini")]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._accepting, 10, what="pgbouncer to listen")

    def restart(self) -> None:
        """Stop pgbouncer at once (every client and server connection drops), then start it
        again on the same port with the same configuration."""
        self._terminate()
        self.start()

    def _accepting(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _terminate(self) -> None:
        """Immediate shutdown (SIGTERM; SIGINT would wait for the app's clients to leave),
        sent to pgbouncer itself, not to the runuser wrapper around it."""
        if self.proc.poll() is None:
            try:
                pid = int((self.dir / "pgbouncer.pid").read_text().strip())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --- Raptor under gunicorn -------------------------------------------------------------------


#: The app the suite serves unless a test names another (``Server.app``).
RAPTOR_APP = "examples.raptor:create_app()"
RAPTOR_CONF = ROOT / "examples/raptor/gunicorn.conf.py"


@dataclass
class Server:
    database_url: str
    env: dict[str, str] = field(default_factory=dict)
    workers: int = 4
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    app: str = RAPTOR_APP
    #: gunicorn's config file; another than Raptor's gets the bind and the workers on the command line
    conf: Path = RAPTOR_CONF

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Server:
        fd, log = tempfile.mkstemp(prefix="raptor-e2e-gunicorn-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": self.database_url,
            "PORT": str(self.port),
            "WEB_CONCURRENCY": str(self.workers),
            "GUNICORN_LOGLEVEL": "warning",
            **self.env,
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self._log = open(self.log_path, "ab")
        options = (
            [] if self.conf == RAPTOR_CONF else ["--bind", f"127.0.0.1:{self.port}", "--workers", str(self.workers)]
        )
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "gunicorn", "-c", str(self.conf), *options, self.app],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        proc = self.process

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited ({proc.returncode}):\n{self.log()}")
            try:
                return requests.get(self.base + "/healthz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_until(ready, timeout, 0.1, what="gunicorn /healthz")
        except TimeoutError as exc:  # say why: the end of the server's own log
            raise TimeoutError(f"{exc}; the end of its log:\n{self.log()[-4000:]}") from None
        wait_until(lambda: len(self.worker_pids()) == self.workers, timeout, what="all gunicorn workers")

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The gunicorn master (after ``start``)."""
        assert self.proc is not None, "the server was not started"
        return self.proc

    def worker_pids(self) -> list[int]:
        master = self.process.pid
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master and fields[0] not in ("Z", "X"):
                pids.append(int(stat.parent.name))
        return sorted(pids)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            for pid in self.worker_pids():  # a frozen worker would never hear SIGTERM
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
        if self.log_path and not os.environ.get("E2E_KEEP_LOGS"):
            self.log_path.unlink(missing_ok=True)

    # HTTP helpers ----------------------------------------------------------------------------

    def post(
        self,
        path: str,
        user: User,
        body: Any,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        session: requests.Session | None = None,
    ) -> requests.Response:
        h = {**user.auth, **(headers or {})}
        if key is not None:
            h["Idempotency-Key"] = key
        return (session or requests).post(self.base + path, json=body, headers=h, timeout=timeout)

    def order(
        self, user: User, key: str | None, body: dict[str, Any] | None = None, **kwargs: Any
    ) -> requests.Response:
        return self.post(
            "/api/trading/orders", user, body or {"symbol": "AAPL", "side": "buy", "qty": 1}, key, **kwargs
        )


class StartServer(Protocol):
    """The ``start_server`` fixture: Raptor under a running gunicorn on ``database_url``, stopped
    after the test."""

    def __call__(self, database_url: str, workers: int = 4, app: str = RAPTOR_APP, **env: object) -> Server: ...


#: The ``run_server`` fixture: ``run_server(Server(...))`` starts that server (any ``app``) and
#: stops it after the test.
RunServer = Callable[[Server], Server]
