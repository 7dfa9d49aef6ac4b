"""
Configuration mistakes a DBA makes with the CLIs end in one clear line and a non-zero
exit, never a traceback: a weak IDEM_RESPONSE_KEY, no DATABASE_URL, a database that does not
exist, a server that does not answer — for `flask idempotency …` and for `idem migrate`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.python.support.shim import closed_port

ROOT = Path(__file__).resolve().parents[3]
FLASK = [sys.executable, "-m", "flask", "--app", "examples.raptor", "idempotency", "stats"]
#: The console script the package installs beside this interpreter (`idem migrate`).
IDEM_MIGRATE = [str(Path(sys.executable).with_name("idem")), "migrate"]


def run(cmd: list[str], **env: str | None) -> tuple[int, list[str]]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("IDEM_RESPONSE_KEY", "RAPTOR_"))}
    full["PYTHONPATH"] = f"{ROOT / 'python'}:{ROOT}"
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    proc = subprocess.run(
        cmd, cwd=ROOT, env=full, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and " WARNING " not in ln]
    return proc.returncode, lines


def assert_one_line(code: int, lines: list[str], *needles: str) -> None:
    assert code != 0, lines
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines)
    assert len(lines) == 1, "\n".join(lines)
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_weak_response_key_is_one_line(admin_url: str) -> None:
    code, lines = run(FLASK, DATABASE_URL=admin_url, IDEM_RESPONSE_KEY="short")
    assert_one_line(code, lines, "IDEM_RESPONSE_KEY must be a generated secret", "secrets.token_urlsafe")


def test_no_database_url_is_one_line() -> None:
    code, lines = run(FLASK, DATABASE_URL=None)
    assert_one_line(code, lines, "DATABASE_URL")


def test_a_database_that_does_not_exist_is_one_line(admin_url: str) -> None:
    url = admin_url.rsplit("/", 1)[0] + "/idem_no_such_db"
    code, lines = run(FLASK, DATABASE_URL=url)
    assert_one_line(code, lines, 'database "idem_no_such_db" does not exist')
    code, lines = run([*IDEM_MIGRATE, "--database-url", url])
    assert_one_line(code, lines, 'database "idem_no_such_db" does not exist', "CREATE DATABASE")


@pytest.mark.parametrize("tool", ["flask", "migrate"])
def test_an_unreachable_server_is_one_line(admin_url: str, tool: str) -> None:
    parts = urlsplit(admin_url)
    url = urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{closed_port()}"))
    cmd = FLASK if tool == "flask" else [*IDEM_MIGRATE, "--database-url", url]
    code, lines = run(cmd, DATABASE_URL=url)
    assert_one_line(code, lines, "Connection refused")


def test_migrate_with_a_url_that_is_not_one_is_one_line() -> None:
    code, lines = run([*IDEM_MIGRATE, "--database-url", "host=127.0.0.1 dbname=idem"])
    assert_one_line(code, lines, "postgresql://")


def test_migrate_without_a_database_is_one_line() -> None:
    code, lines = run(IDEM_MIGRATE, DATABASE_URL=None)
    assert code != 0 and any("DATABASE_URL" in ln for ln in lines) and not any("Traceback" in ln for ln in lines)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("IDEM_REPLAY_HEADERS", "Set-Cookie", "IDEM_REPLAY_HEADERS may not list 'Set-Cookie'"),
        ("IDEM_REPLAY_HEADERS", "not a header", "is not an HTTP header name"),
        ("IDEM_POOL_MAX_SIZE", "lots", "IDEM_POOL_MAX_SIZE (from the environment): invalid literal for int()"),
        ("IDEM_STALE_AFTER_SECONDS", "soon", "IDEM_STALE_AFTER_SECONDS"),
    ],
)
def test_a_bad_idem_value_is_one_line(admin_url: str, key: str, value: str, needle: str) -> None:
    code, lines = run(FLASK, DATABASE_URL=admin_url, **{key: value})
    assert_one_line(code, lines, needle)
    assert code == 1


@pytest.mark.parametrize("cli", ["idem", "flask"])
def test_an_unknown_verb_is_one_line_and_exit_2(admin_url: str, cli: str) -> None:
    cmd = [IDEM_MIGRATE[0], "migrat"] if cli == "idem" else [*FLASK[:-1], "stat"]
    code, lines = run(cmd, DATABASE_URL=admin_url)
    assert_one_line(code, lines, "No such command", "--help")
    assert code == 2


def test_a_bad_database_url_option_is_one_line() -> None:
    code, lines = run([*IDEM_MIGRATE[:1], "status", "--database-url", "mysql://h/db"], DATABASE_URL=None)
    assert_one_line(code, lines, "postgresql://")


@pytest.mark.parametrize("verb", ["migrate", "sql"])
@pytest.mark.parametrize("value", ["-1", "soon"])
def test_a_bad_wait_timeout_is_one_line_and_exit_2(verb: str, value: str) -> None:
    code, lines = run([IDEM_MIGRATE[0], verb, "--wait-timeout", value], DATABASE_URL="postgresql://127.0.0.1/x")
    assert_one_line(code, lines, "--wait-timeout")
    assert code == 2


def test_the_wait_timeout_is_documented_with_the_schema_tools_default() -> None:
    from idem_shim.schema import GUARD_WAIT_TIMEOUT_S

    for verb in ("migrate", "sql"):
        code, lines = run([IDEM_MIGRATE[0], verb, "--help"])
        text = " ".join(" ".join(lines).split())
        assert code == 0 and "--wait-timeout" in text and "IDEM_MIGRATE_WAIT_TIMEOUT" in text, text
        assert f"default: {GUARD_WAIT_TIMEOUT_S}" in text, text
