"""A data subject's export is one row per key (issue 39): a member of idem_app who stores a few
large responses under a user (three of ~95 MB, over jsonb's 256 MiB together), or one body just
under jsonb's limit, must not make that user's GDPR export fail, in psql or through the CLI.

The bodies are made on the server (repeat()) and compress to almost nothing in TOAST, so the
store stays small; what the export moves is their full size. The CLI runs as a process of its
own, so its peak memory is its own (wait4's rusage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.python.support.roles import login_role
from tests.python.support.sqlapi import claim, connect, new_key, one

ROOT = Path(__file__).resolve().parents[3]
BODY = 95_000_000
#: jsonb's limit on one value is 2^28 - 1 bytes; a body object {"blob": <this many x>} fits,
#: a key's object holding it besides eleven other fields does not.
NEAR_LIMIT = 268_435_400
FIELDS = {
    "id",
    "idem_key",
    "scope_user_id",
    "scope_endpoint",
    "request_hash",
    "status",
    "response_code",
    "response_body",
    "response_headers",
    "created_at",
    "locked_at",
    "expires_at",
}
#: A completed key whose body is {"blob": <%(size)s times x>}, made on the server.
STORE_LARGE = (
    "UPDATE public.idempotency_keys SET status = 'completed', response_code = 200,"
    " response_body = pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('x', %(size)s::integer))"
    " WHERE scope_user_id OPERATOR(pg_catalog.=) ANY(%(users)s::integer[])"
)
FLASK = [sys.executable, "-m", "flask", "--app", "hostapp", "idempotency"]
COUNT = "SELECT pg_catalog.count(*) AS n FROM public.idem_export_user(p_user_id => %s)"


def export_cli(tmp_path: Path, app_url: str, dsr_url: str, user_id: int) -> tuple[Path, int]:
    """``flask idempotency export-user USER_ID --out FILE`` as the GDPR job runs it: the file and
    the process's peak resident memory in bytes."""
    (tmp_path / "hostapp.py").write_text(
        "from flask import Flask\nfrom idem_shim import Idem\n"
        "app = Flask(__name__)\napp.config.from_prefixed_env('HOST')\nIdem(app)\n"
    )
    out = tmp_path / "export.json"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{ROOT / 'python'}",
        "HOST_IDEM_DATABASE_URL": app_url,
        "HOST_IDEM_DSR_DATABASE_URL": dsr_url,
    }
    with (tmp_path / "cli.log").open("w+") as log:
        proc = subprocess.Popen(
            [*FLASK, "export-user", str(user_id), "--out", out],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        watchdog = threading.Timer(300, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage, not every child's
        finally:
            watchdog.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    assert proc.returncode == 0, output
    assert output.strip().endswith(f"idempotency keys of user {user_id} to {out}"), output
    return out, usage.ru_maxrss * 1024


def test_three_responses_over_256_mib_export_as_three_keys(fresh_admin_url: str, tmp_path: Path) -> None:
    """Before: ``total size of jsonb array elements exceeds the maximum of 268435455 bytes`` (54000)
    from idem_export_user and the CLI alike, for every export of that user."""
    with (
        connect(fresh_admin_url) as admin,
        login_role(fresh_admin_url, "idem_app") as (_, web_url),
        login_role(fresh_admin_url, "idem_dsr", prefix="gdpr") as (_, dsr_url),
    ):
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        with connect(web_url) as web:  # the request path's role, as a handler's injected SQL would
            for _ in range(3):
                held = claim(web, new_key(), user_id=uid)
                web.execute(
                    "SELECT public.idem_complete(p_key_id => %s, p_response_code => 200, p_response_body =>"
                    " pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('x', %s::integer)), p_claim_token => %s)",
                    (held["key_id"], BODY, held["claim_token"]),
                )
        with connect(dsr_url) as job:
            assert one(job, COUNT, (uid,)) == {"n": 3}
            rows = job.execute(
                "SELECT e.scope_user_id, e.status,"
                " pg_catalog.length(e.response_body OPERATOR(pg_catalog.->>) 'blob') AS n"
                " FROM public.idem_export_user(p_user_id => %s) AS e",
                (uid,),
            ).fetchall()
        assert rows == [{"scope_user_id": uid, "status": "completed", "n": BODY}] * 3

        out, _ = export_cli(tmp_path, web_url, dsr_url, uid)
        exported = json.loads(out.read_text())
        assert isinstance(exported, list) and len(exported) == 3
        assert all(set(key) == FIELDS and len(key["response_body"]["blob"]) == BODY for key in exported)


def test_one_body_just_under_the_jsonb_limit_exports(fresh_admin_url: str, tmp_path: Path) -> None:
    """A body jsonb can store, which no key's object can hold beside the key's other fields: an
    export that wraps each key in one jsonb (``total size of jsonb object elements exceeds …``)
    still fails for that user. idem_complete takes such a body from idem_app (16 s); the owner
    writes it here, faster."""
    with (
        connect(fresh_admin_url) as admin,
        login_role(fresh_admin_url, "idem_app") as (_, web_url),
        login_role(fresh_admin_url, "idem_dsr", prefix="gdpr") as (_, dsr_url),
    ):
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        claim(admin, new_key(), user_id=uid)
        admin.execute(STORE_LARGE, {"size": NEAR_LIMIT, "users": [uid]})
        with connect(dsr_url) as job:
            assert one(job, COUNT, (uid,)) == {"n": 1}
            row = one(
                job,
                "SELECT pg_catalog.length(e.response_body OPERATOR(pg_catalog.->>) 'blob') AS n"
                " FROM public.idem_export_user(p_user_id => %s) AS e",
                (uid,),
            )
        assert row == {"n": NEAR_LIMIT}
        out, _ = export_cli(tmp_path, web_url, dsr_url, uid)
        exported = json.loads(out.read_text())
        assert len(exported) == 1 and len(exported[0]["response_body"]["blob"]) == NEAR_LIMIT


def test_the_cli_holds_one_key_at_a_time(fresh_admin_url: str, tmp_path: Path) -> None:
    """Twelve keys of 8 MB cost the CLI no more memory than one: it fetches, parses and writes
    them one by one (a server-side cursor), so what a GDPR job can export is bounded by the
    largest key, not by the user. Read whole, they were a few hundred MB more."""
    size, many = 8_000_000, 12
    with (
        connect(fresh_admin_url) as admin,
        login_role(fresh_admin_url, "idem_app") as (_, web_url),
        login_role(fresh_admin_url, "idem_dsr", prefix="gdpr") as (_, dsr_url),
    ):
        users = [one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"] for _ in range(2)]
        for uid, keys in zip(users, (1, many), strict=True):
            for _ in range(keys):
                claim(admin, new_key(), user_id=uid)
        admin.execute(STORE_LARGE, {"size": size, "users": users})
        peaks = []
        for uid, keys in zip(users, (1, many), strict=True):
            out, peak = export_cli(tmp_path, web_url, dsr_url, uid)
            assert len(json.loads(out.read_text())) == keys
            peaks.append(peak)
        assert peaks[1] < peaks[0] + 3 * size, f"one key: {peaks[0] / 1e6:.0f} MB, {many}: {peaks[1] / 1e6:.0f} MB"
