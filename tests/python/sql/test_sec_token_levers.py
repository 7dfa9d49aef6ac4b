"""The claim token and the header set after the request path's levers, attacked (contract §3, §3a, §4).

The levers: the token's formula is ``idem_token_hash`` (never granted), inlined by ``idem_claim``
and ``idem_complete`` beside a read of ``idem_secret`` of their own, and called through
``idem_claim_token`` by the other routines; ``idem_token_claimed_at`` checks the token's shape by
its length, its 33rd digit and an unbounded regex; ``idem_complete`` compares the header set of a
JSON answer instead of screening it. The attackers: a plain member of ``idem_app`` (a handler
with SQL injection), and a login role that is one and owns its database (its app's migrations
ran before ``idem migrate``). Each test asserts the safe outcome, so it fails while a hole is open.
"""

from __future__ import annotations

import random
import subprocess

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import testdb
from tests.python.support.owned import pinned
from tests.python.support.roles import login_role
from tests.python.support.sqlapi import DictConnection, claim, connect, new_key, one

#: The shape idem_token_claimed_at accepted before its levers (48 lower-case hex digits, the 33rd 0).
BOUNDED = "^[0-9a-f]{32}0[0-9a-f]{15}$"

#: Every routine that acts on a claim by its token, each in a transaction the test rolls back.
ROUTINES = {
    "idem_heartbeat": "SELECT public.idem_heartbeat(p_key_id => %(id)s, p_claim_token => %(token)s)",
    "idem_complete": "SELECT public.idem_complete(p_key_id => %(id)s, p_response_code => 201,"
    " p_response_body => '{\"order_id\": 1}', p_claim_token => %(token)s)",
    "idem_fail": "SELECT public.idem_fail(p_key_id => %(id)s, p_response_code => 500, p_claim_token => %(token)s)",
    "idem_fail release": "SELECT public.idem_fail(p_key_id => %(id)s, p_claim_token => %(token)s, p_release => true)",
    "idem_record_lost_claim": "SELECT public.idem_record_lost_claim(p_key_id => %(id)s, p_claim_token => %(token)s)",
}


def tokens_like(token: str) -> list[str]:
    """Tokens an attacker makes from one it holds: every shape the old regex refused or accepted."""
    digits = "0123456789abcdef"
    rng = random.Random(32)
    made = [
        token.upper(),
        token[:-1],
        token + "0",
        token + "\n",
        " " + token[1:],
        token[:47] + "\n",
        token[:32],  # the key_id-only token of before claim-bound tokens
        token[:32] + "1" + token[33:],  # a time past 2^60 microseconds
        token[:32] + "\u0660" + token[34:],  # an Arabic-Indic zero: 2 bytes, 47 characters
        token[:46] + "\u00e9",  # 48 bytes, 47 characters
        token[:45] + "\u00e9a",
        token[:16] + "\uff10" * 2 + token[22:],  # full-width zeros: 48 bytes, 44 characters
        token[:47] + "G",
        token[:47] + "\u0430",  # a Cyrillic a: 49 bytes
        token.replace("a", "A", 1) if "a" in token else token[:47] + "A",
        "0" * 48,
        "0" * 32 + "0" * 16,
        "f" * 32 + "0" + "f" * 15,
        token[:32] + "0" * 16,
        "",
        "x" + token,
        token[:40] + "%00" + token[43:],
    ]
    for _ in range(40):
        chars = list(token)
        chars[rng.randrange(48)] = rng.choice(digits + "ABCDEFgz-_ \t\u00e9\u0660")
        made.append("".join(chars))
        made.append("".join(rng.choice(digits) for _ in range(rng.choice((47, 48, 49)))))
    return [t for t in made if t != token]


def test_the_token_shape_accepts_and_refuses_exactly_what_the_bounded_regex_did(fresh_admin_url: str) -> None:
    """The length is in bytes and the regex unbounded: a multi-byte character that makes a
    47-character token 48 bytes long, a digit of another script, an upper-case or a trailing
    newline must each be as refused as the bounded regex refused them; a 48-digit token of any
    time below 2^60 microseconds as accepted, naming the same time."""
    with connect(fresh_admin_url) as conn:
        real = claim(conn, new_key())["claim_token"]
        candidates = [real, *tokens_like(real), *("%048x" % (1 << n) for n in range(0, 192, 7))]
        for token in candidates:
            row = one(
                conn,
                "SELECT public.idem_token_claimed_at(%(t)s) IS NOT NULL AS accepted,"
                " %(t)s OPERATOR(pg_catalog.~) %(bounded)s AS shaped,"
                " public.idem_token_claimed_at(%(t)s) IS NOT DISTINCT FROM CASE WHEN %(t)s OPERATOR(pg_catalog.~)"
                " %(bounded)s THEN pg_catalog.to_timestamp((('x' || pg_catalog.substr(%(t)s, 33, 16))::bit(64)::bigint"
                " / 1000000)::double precision)"
                " + (('x' || pg_catalog.substr(%(t)s, 33, 16))::bit(64)::bigint %% 1000000)"
                " * interval '1 microsecond' END AS same_time",
                {"t": token, "bounded": BOUNDED},
            )
            assert row == {"accepted": row["shaped"], "shaped": row["shaped"], "same_time": True}, token


def outcomes(conn: DictConnection, key_id: int, token: str | None) -> dict[str, str]:
    """What each routine answers this token (its SQLSTATE, or ok), nothing of it kept."""
    seen = {}
    for name, statement in ROUTINES.items():
        conn.execute("BEGIN")
        try:
            conn.execute(statement, {"id": key_id, "token": token})
            seen[name] = "ok"
        except psycopg.Error as exc:
            seen[name] = str(exc.sqlstate)
        finally:
            conn.execute("ROLLBACK")
    return seen


def test_every_routine_refuses_a_token_its_claim_was_not_given(fresh_admin_url: str) -> None:
    """The inlined formula (idem_claim, idem_complete) and idem_claim_token's (idem_fail,
    idem_heartbeat, idem_record_lost_claim) must agree: a forged shape, another claim's token,
    and a token of the same key_id under the true secret but another claim time (what a claim
    that gets the key_id again after a heal holds) are IDM01 on every path; the claim's own
    token is accepted by each, and the claim stays in flight for its holder."""
    with connect(fresh_admin_url) as admin, login_role(fresh_admin_url, "idem_app") as (_, url), connect(url) as app:
        mine, other = claim(app, new_key()), claim(app, new_key())
        at = one(admin, "SELECT created_at FROM public.idempotency_keys WHERE id = %s", (mine["key_id"],))["created_at"]
        moved = [
            one(
                admin,
                "SELECT public.idem_token_hash(s.secret, %s, %s::timestamptz + %s::interval) AS t"
                " FROM public.idem_secret s",
                (mine["key_id"], at, shift),
            )["t"]
            for shift in ("1 microsecond", "-1 microsecond", "-1 second", "1 day")
        ]
        assert mine["claim_token"] not in moved
        for token in [*tokens_like(mine["claim_token"]), other["claim_token"]]:
            assert set(outcomes(app, mine["key_id"], token).values()) == {"IDM01"}, token
        # a true token of another claim time: that claim is gone (reported so), this one untouched
        for token in moved:
            seen = outcomes(app, mine["key_id"], token)
            assert seen.pop("idem_record_lost_claim") == "ok", token
            assert set(seen.values()) == {"IDM01"}, token
        assert set(outcomes(app, mine["key_id"], None).values()) == {"IDM00"}
        assert set(outcomes(app, mine["key_id"], mine["claim_token"]).values()) == {"ok"}
        assert set(outcomes(app, other["key_id"], other["claim_token"]).values()) == {"ok"}
        rows = admin.execute("SELECT status FROM public.idempotency_keys ORDER BY id").fetchall()
        assert [r["status"] for r in rows] == ["in_flight", "in_flight"]


def test_an_upgraded_claims_older_token_is_accepted_alike_on_every_path(fresh_admin_url: str) -> None:
    """A claim an upgrade left in flight (marked legacy_token = 'key_id') takes the key_id-only
    token it was given: every path accepts it, through the check the inlined formula falls back
    to, and refuses the same token on a claim not so marked."""
    with connect(fresh_admin_url) as admin, login_role(fresh_admin_url, "idem_app") as (_, url), connect(url) as app:
        old, new = claim(app, new_key()), claim(app, new_key())
        admin.execute("UPDATE public.idempotency_keys SET legacy_token = 'key_id' WHERE id = %s", (old["key_id"],))
        older = {
            c["key_id"]: one(
                admin,
                "SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(s.secret || pg_catalog.convert_to('claim:',"
                " 'UTF8') || pg_catalog.int8send(%s::bigint)), 'hex'), 32) AS t FROM public.idem_secret s",
                (c["key_id"],),
            )["t"]
            for c in (old, new)
        }
        seen = outcomes(app, old["key_id"], older[old["key_id"]])
        assert seen.pop("idem_record_lost_claim") == "ok"  # false: it still holds its key
        assert set(seen.values()) == {"ok"}
        assert set(outcomes(app, new["key_id"], older[new["key_id"]]).values()) == {"IDM01"}
        assert set(outcomes(app, old["key_id"], older[new["key_id"]]).values()) == {"IDM01"}


#: What the database's owner plants before idem migrate: every operator the token's formula and
#: shape check use, look-alikes in public, each logging that it ran; and default privileges.
PLANTED = """
CREATE TABLE public.spy_log (who text, what text);
GRANT INSERT, SELECT ON public.spy_log TO PUBLIC;
CREATE FUNCTION public.spy_bytea(bytea, bytea) RETURNS bytea LANGUAGE plpgsql AS
  $f$ BEGIN INSERT INTO public.spy_log VALUES (current_user, 'bytea ||'); RETURN '\\x00'::bytea; END $f$;
CREATE OPERATOR public.|| (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = public.spy_bytea);
CREATE FUNCTION public.spy_text(text, text) RETURNS text LANGUAGE plpgsql AS
  $f$ BEGIN INSERT INTO public.spy_log VALUES (current_user, 'text ||'); RETURN 'x0'; END $f$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = public.spy_text);
CREATE FUNCTION public.spy_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $f$ BEGIN INSERT INTO public.spy_log VALUES (current_user, 'text ='); RETURN true; END $f$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.spy_eq);
CREATE FUNCTION public.spy_mul(numeric, integer) RETURNS numeric LANGUAGE plpgsql AS
  $f$ BEGIN INSERT INTO public.spy_log VALUES (current_user, 'numeric *'); RETURN 0; END $f$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.spy_mul);
CREATE FUNCTION public.spy_ne(jsonb, jsonb) RETURNS boolean LANGUAGE plpgsql AS
  $f$ BEGIN INSERT INTO public.spy_log VALUES (current_user, 'jsonb <>'); RETURN false; END $f$;
CREATE OPERATOR public.<> (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = public.spy_ne);
CREATE FUNCTION public.sha256(bytea) RETURNS bytea LANGUAGE plpgsql AS
  $f$ BEGIN INSERT INTO public.spy_log VALUES (current_user, 'sha256'); RETURN $1; END $f$;
ALTER DEFAULT PRIVILEGES GRANT ALL ON FUNCTIONS TO PUBLIC;
ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON FUNCTIONS TO PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO PUBLIC;
"""


def test_the_database_owner_reaches_neither_the_secret_nor_the_formula(owned: dict[str, str]) -> None:
    """The owner of public plants look-alike operators and default privileges, then idem is
    migrated into its database. It must not read idem_secret, execute idem_token_hash or
    idem_claim_token, grant them to itself, replace them, or have its operators bound into the
    formula: the token it is given is the secret's keyed hash, and nothing it planted ran."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute(PLANTED)
    done = subprocess.run(
        [testdb.idem_command(), "migrate", "--database-url", owned["url"]], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with pinned(owned["url"]) as conn:
        conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
    refused = []
    with psycopg.connect(owned["attacker_url"], autocommit=True) as conn:
        for statement in (
            "SELECT secret FROM public.idem_secret",
            "SELECT public.idem_token_hash('\\x00'::bytea, 1, pg_catalog.now())",
            "SELECT public.idem_claim_token(1, pg_catalog.now())",
            "CREATE OR REPLACE FUNCTION public.idem_token_hash(p_secret bytea, p_key_id bigint,"
            " p_claimed_at timestamptz) RETURNS text LANGUAGE sql RETURN 'x'",
            "ALTER FUNCTION public.idem_token_hash(bytea, bigint, timestamptz) OWNER TO CURRENT_USER",
            "GRANT EXECUTE ON FUNCTION public.idem_token_hash, public.idem_claim_token TO PUBLIC",
            "GRANT SELECT ON public.idem_secret TO PUBLIC",
        ):
            try:
                conn.execute(statement)
            except psycopg.Error as exc:
                refused.append(exc.sqlstate)
            else:
                refused.append(f"ran: {statement}")
        assert refused == ["42501"] * 7
        row = conn.execute(
            "SELECT c.key_id, c.claim_token FROM public.idem_claim(p_key => %s, p_user_id => NULL,"
            " p_endpoint => 'POST /orders', p_request => '{}') c",
            (new_key(),),
        ).fetchone()
        assert row is not None
        conn.execute("BEGIN")
        conn.execute(
            "SELECT public.idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}',"
            ' p_response_headers => \'{"Content-Type": "application/json"}\', p_claim_token => %s)',
            row,
        )
        conn.execute("ROLLBACK")
        conn.execute("SELECT public.idem_heartbeat(p_key_id => %s, p_claim_token => %s)", row)
    with pinned(owned["url"]) as conn:
        for routine in ("idem_token_hash", "idem_claim_token", "idem_token_claimed_at"):
            for role in (owned["role"], "idem_app", "pg_database_owner"):
                got = conn.execute(
                    "SELECT pg_catalog.has_function_privilege(%s, p.oid, 'EXECUTE') FROM pg_catalog.pg_proc p"
                    " WHERE p.oid = pg_catalog.to_regproc(%s)",
                    (role, f"public.{routine}"),
                ).fetchone()
                assert got == (False,), (routine, role)
        assert conn.execute(
            "SELECT pg_catalog.has_table_privilege(%s, 'public.idem_secret', 'SELECT')", (owned["role"],)
        ).fetchone() == (False,)
        expected = conn.execute(
            "SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(s.secret OPERATOR(pg_catalog.||)"
            " pg_catalog.convert_to('claim:', 'UTF8') OPERATOR(pg_catalog.||) pg_catalog.int8send(k.id)"
            " OPERATOR(pg_catalog.||) pg_catalog.int8send((EXTRACT(epoch FROM k.created_at)"
            " OPERATOR(pg_catalog.*) 1000000)::bigint)), 'hex'), 32) OPERATOR(pg_catalog.||)"
            " pg_catalog.encode(pg_catalog.int8send((EXTRACT(epoch FROM k.created_at) OPERATOR(pg_catalog.*)"
            " 1000000)::bigint), 'hex') FROM public.idem_secret s, public.idempotency_keys k WHERE k.id = %s",
            (row[0],),
        ).fetchone()
        assert expected == (row[1],)
        # what the formula and the shape check are bound to: pg_catalog's, or idem's own
        bound = conn.execute(
            "SELECT d.refobjid::regprocedure::text FROM pg_catalog.pg_depend d"
            " WHERE d.objid = ANY (ARRAY['public.idem_token_hash'::regproc, 'public.idem_claim_token'::regproc,"
            " 'public.idem_token_claimed_at'::regproc]::oid[]) AND d.classid = 'pg_catalog.pg_proc'::regclass"
            " AND d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass)"
            " AND d.refobjid >= 16384"
            " AND d.refobjid NOT IN ('public.idem_token_hash'::regproc::oid)"
        ).fetchall()
        assert bound == []
        assert conn.execute("SELECT who, what FROM public.spy_log").fetchall() == []


#: Header sets near the one compared instead of screened, and what idem_complete answers each.
NEAR = [
    ('{"Content-Type": "application/json", "Set-Cookie": "s=1"}', "IDM04"),
    ('{"Set-Cookie": "s=1", "Content-Type": "application/json"}', "IDM04"),
    ('{"Content-Type": "application/json\\r\\nSet-Cookie: s=1"}', "IDM04"),
    ('{"Content-Type": "application/json\\u000aX: 1"}', "IDM04"),
    ('{"Content-Type": "application/json", "Authorization": "Bearer x"}', "IDM04"),
    ('{"Content-Type": "application/json", "Location": "/cb?access_token=x"}', "IDM04"),
    ('{"Content-Type": "application/json", "X-Api-Key": "k"}', "IDM04"),
    ('{"Content-Type": ["application/json"]}', "IDM00"),
    ('{"Content-Type": {"application/json": true}}', "IDM00"),
    ('{"Content-Type ": "application/json"}', "IDM00"),
    ('{"Content-Type:": "application/json"}', "IDM00"),
    ('["Content-Type", "application/json"]', "IDM00"),
    ('"Content-Type: application/json"', "IDM00"),
    ("null", "IDM00"),
    ('{"Content-Type": "application/json", "X-Big": "' + "a" * 8193 + '"}', "IDM04"),
    ('{"content-type": "application/json"}', "ok"),
    ('{"Content-Type": "application/json; charset=utf-8"}', "ok"),
    ('{"Content-Type": "text/html", "Content-Type": "application/json"}', "skipped"),
    ('{"Content-Type": "application\\u002fjson"}', "skipped"),
    ('{ "Content-Type" :"application/json" }', "skipped"),
]


def test_only_the_json_answers_header_set_skips_the_screen(fresh_admin_url: str) -> None:
    """idem_complete skips the header screen for {"Content-Type": "application/json"}: a set
    with one more header, a value with a line break, a name with a space, a value that is no
    string, must each be refused as before; what compares equal to the skipped set as jsonb (a
    duplicate name, an escaped slash, other spacing) is stored and replayed as that set."""
    with connect(fresh_admin_url) as admin, login_role(fresh_admin_url, "idem_app") as (_, url), connect(url) as app:
        for headers, expected in NEAR:
            key = new_key()
            c = claim(app, key)
            try:
                app.execute(
                    "SELECT public.idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s,"
                    " p_response_headers => %s::jsonb, p_claim_token => %s)",
                    (c["key_id"], Jsonb({"order_id": 1}), headers, c["claim_token"]),
                )
                got = "ok"
            except psycopg.Error as exc:
                got = str(exc.sqlstate)
            assert got == ("ok" if expected == "skipped" else expected), headers
            stored = one(
                admin, "SELECT status, response_headers FROM public.idempotency_keys WHERE id = %s", (c["key_id"],)
            )
            if got != "ok":
                assert stored == {"status": "in_flight", "response_headers": None}, headers
                continue
            replay = claim(app, key)
            assert replay["outcome"] == "replay", headers
            if expected == "skipped":
                assert stored["response_headers"] == {"Content-Type": "application/json"}, headers


#: A collation the owner of public (or any role with CREATE on a schema) can make: case-blind,
#: so a comparison under it finds an upper-case token equal to the lower-case one.
CASE_BLIND = "CREATE COLLATION public.case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"


#: What every definer with a text parameter raises first for a collated call (idem_refuse_collation).
COLLATED = r"text arguments must not carry a collation \(got "


def test_a_callers_collation_never_makes_a_forged_token_fit(fresh_admin_url: str) -> None:
    """A PL/pgSQL routine takes its parameters' and variables' collation from the call: with
    p_claim_token => '...' COLLATE case_blind, idem_complete's comparison with the token it
    computed would be case-blind (and under an ICU rule that makes digits equal, blind to the
    hash). Every path refuses such a call before it reads the token, with a forged token and with
    the claim's own; the claim's own token, uncollated, still works."""
    with connect(fresh_admin_url) as admin, login_role(fresh_admin_url, "idem_app") as (_, url), connect(url) as app:
        admin.execute(CASE_BLIND)
        mine = claim(app, new_key())
        collated = {
            name: statement.replace("%(token)s", "%(token)s COLLATE public.case_blind")
            for name, statement in ROUTINES.items()
        }
        for token in (mine["claim_token"].upper(), mine["claim_token"]):
            for name, statement in collated.items():
                app.execute("BEGIN")
                with pytest.raises(psycopg.Error, match=COLLATED) as refused:
                    app.execute(statement, {"id": mine["key_id"], "token": token})
                app.execute("ROLLBACK")
                assert refused.value.sqlstate == "IDM00", (name, token)
                assert "case_blind" in str(refused.value.diag.message_primary), (name, token)
        app.execute(ROUTINES["idem_heartbeat"], {"id": mine["key_id"], "token": mine["claim_token"]})


def test_a_callers_collation_never_changes_a_refusal(fresh_admin_url: str) -> None:
    """The same call as the shim's but with the token collated (a nondeterministic collation
    made the credential walk's regex raise 0A000, not the contract's IDM04): it is refused as a
    misuse (IDM00) before any check runs, nothing is stored, and the same call without the
    COLLATE is IDM04 (contract §4)."""
    body = '{"user": {"password": "hunter2"}}'
    call = (
        "SELECT public.idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s::jsonb,"
        " p_claim_token => %s{})"
    )
    with connect(fresh_admin_url) as admin, login_role(fresh_admin_url, "idem_app") as (_, url), connect(url) as app:
        admin.execute(CASE_BLIND)
        mine = claim(app, new_key())
        args = (mine["key_id"], body, mine["claim_token"])
        with pytest.raises(psycopg.Error, match=COLLATED) as refused:
            app.execute(call.format(" COLLATE public.case_blind"), args)
        assert refused.value.sqlstate == "IDM00", refused.value.diag.message_primary
        stored = admin.execute("SELECT status FROM public.idempotency_keys WHERE id = %s", (mine["key_id"],)).fetchone()
        assert stored is not None and stored["status"] == "in_flight"
        with pytest.raises(psycopg.Error) as screened:
            app.execute(call.format(""), args)
        assert screened.value.sqlstate == "IDM04", screened.value.diag.message_primary


def test_every_definer_with_a_text_parameter_refuses_a_collated_call(fresh_admin_url: str) -> None:
    """The class: every SECURITY DEFINER routine of the store that takes a collatable argument,
    read from the catalog (a new one is covered, or this fails), called by its owner with one
    text argument collated and every other argument NULL, raises the collation's IDM00 before
    it reads any argument."""
    with connect(fresh_admin_url) as admin:
        routines = admin.execute(
            "SELECT p.proname AS name, p.proargnames[1:p.pronargs] AS names,"
            "       ARRAY(SELECT pg_catalog.format_type(t, NULL) FROM pg_catalog.unnest(p.proargtypes)"
            "               WITH ORDINALITY a(t, n) ORDER BY n) AS types,"
            "       ARRAY(SELECT y.typcollation <> 0 FROM pg_catalog.unnest(p.proargtypes) WITH ORDINALITY a(t, n)"
            "               JOIN pg_catalog.pg_type y ON y.oid = a.t ORDER BY a.n) AS collatable"
            "  FROM pg_catalog.pg_proc p"
            " WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef AND p.proname LIKE 'idem%'"
            "   AND EXISTS (SELECT 1 FROM pg_catalog.unnest(p.proargtypes) t JOIN pg_catalog.pg_type y ON y.oid = t"
            "                WHERE y.typcollation <> 0)"
            " ORDER BY 1"
        ).fetchall()
        assert {"idem_claim", "idem_complete", "idem_fail", "idem_heartbeat"} <= {r["name"] for r in routines}
        for r in routines:
            first = r["collatable"].index(True)
            args = [
                sql.SQL("{} => NULL::{}{}").format(
                    sql.Identifier(name), sql.SQL(kind), sql.SQL(' COLLATE "C"' if i == first else "")
                )
                for i, (name, kind) in enumerate(zip(r["names"], r["types"], strict=True))
            ]
            statement = sql.SQL("SELECT * FROM public.{}({})").format(
                sql.Identifier(r["name"]), sql.SQL(", ").join(args)
            )
            admin.execute("BEGIN")
            with pytest.raises(psycopg.Error) as refused:
                admin.execute(statement)
            admin.execute("ROLLBACK")
            assert refused.value.sqlstate == "IDM00", (r["name"], refused.value.diag.message_primary)
            assert refused.value.diag.message_primary == (
                f'{r["name"]}: text arguments must not carry a collation (got "C")'
            ), r["name"]


#: Overloads of the token's helpers that take one more, defaulted argument: a call with the
#: helper's own three (two) arguments matches both, and PostgreSQL cannot choose (42725).
SHADOWS = (
    "CREATE FUNCTION public.idem_token_hash(p_secret bytea, p_key_id bigint, p_claimed_at timestamptz,"
    " p_pad integer DEFAULT 0) RETURNS text LANGUAGE sql RETURN 'x'",
    "CREATE FUNCTION public.idem_claim_token(p_key_id bigint, p_claimed_at timestamptz,"
    " p_pad integer DEFAULT 0) RETURNS text LANGUAGE sql RETURN 'x'",
)


def test_an_overload_of_the_tokens_helpers_never_stops_the_request_path(fresh_admin_url: str) -> None:
    """idem_claim and idem_complete resolve public.idem_token_hash(s.secret, v_id, v_now) by name
    when they run, the others public.idem_claim_token (and every PL/pgSQL routine its helpers):
    an overload with one more defaulted argument matches the same call, and PostgreSQL cannot
    choose (42725) in any session after, which the drop guard then keeps. A handler's login role
    (idem_app, owning nothing) on a store whose public PUBLIC may create in (a cluster upgraded
    from PostgreSQL 14; on PostgreSQL 15 the database's owner owns public) tries to add them: it
    is refused, and the next worker's claim, completion and heartbeat answer as before."""
    with connect(fresh_admin_url) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    with login_role(fresh_admin_url, "idem_app") as (_, url):
        with psycopg.connect(url, autocommit=True) as attacker:
            for statement in SHADOWS:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard: CREATE FUNCTION"):
                    attacker.execute(statement)
            # nor by a name of its own renamed or moved into public afterwards
            attacker.execute(SHADOWS[0].replace("public.idem_token_hash", "public.my_hash"))
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard: ALTER FUNCTION"):
                attacker.execute("ALTER FUNCTION public.my_hash RENAME TO idem_token_hash")
        with connect(url) as worker:  # a new session: the definers plan their statements anew
            mine = claim(worker, new_key())
            assert mine["outcome"] == "claimed"
            worker.execute(ROUTINES["idem_heartbeat"], {"id": mine["key_id"], "token": mine["claim_token"]})
            worker.execute(ROUTINES["idem_complete"], {"id": mine["key_id"], "token": mine["claim_token"]})


def answered(url: str, calls: tuple[str, ...]) -> list[str]:
    """What each call answers in a new session of ``url``: ok, or its SQLSTATE and message."""
    seen = []
    with connect(url) as conn:
        for call in calls:
            try:
                conn.execute(call)
                seen.append("ok")
            except psycopg.Error as exc:
                seen.append(f"{exc.sqlstate}: {exc.diag.message_primary}")
    return seen


#: A routine an upgrade adds (its name is in the release's sql/functions/ before it is migrated),
#: and a PL/pgSQL routine of the store that calls it by name, as every definer calls its helpers.
UPGRADE = (
    "CREATE FUNCTION public.idem_next_helper(p_x integer) RETURNS integer LANGUAGE sql RETURN p_x",
    "CREATE FUNCTION public.idem_next_caller() RETURNS integer LANGUAGE plpgsql"
    " SET search_path = pg_catalog, pg_temp AS $f$ BEGIN RETURN public.idem_next_helper(1); END $f$",
)


def test_a_routine_under_a_name_idem_has_not_made_yet_never_overloads_it_later(fresh_admin_url: str) -> None:
    """The guard refused a routine in public under the name of one the store's owner has; a name
    of idem's that the next upgrade adds was free: a role that may create in public makes
    public.idem_next_helper(p_x integer, p_pad integer DEFAULT 0) in a transaction it holds open
    while the upgrade's superuser creates public.idem_next_helper(integer) and its caller, then
    commits. The guard judged it when no such routine existed, and owners.sql had already run:
    every call after is 42725, and the drop guard keeps the plant; and the nightly cleanup refuses
    to run beside an idem_ routine of another role (42501). Safe: every routine under an
    idem_ name in public is refused to the roles the guard judges, whether idem has made it yet or
    not (owners.sql refuses such a routine anyway), made, renamed or moved there."""
    plant = "CREATE FUNCTION public.idem_next_helper(p_x integer, p_pad integer DEFAULT 0) RETURNS integer"
    plant += " LANGUAGE sql RETURN 0"
    with connect(fresh_admin_url) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    with login_role(fresh_admin_url, "idem_app") as (_, url):
        with psycopg.connect(url, autocommit=True) as attacker:
            attacker.execute("CREATE FUNCTION public.my_helper(p_x integer) RETURNS integer LANGUAGE sql RETURN 0")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard: ALTER FUNCTION"):
                attacker.execute("ALTER FUNCTION public.my_helper RENAME TO idem_next_helper")
        with psycopg.connect(url) as attacker:  # a transaction held open across the upgrade
            planted = True
            try:
                attacker.execute(plant)
            except psycopg.errors.InsufficientPrivilege as exc:
                assert "idem_ddl_guard: CREATE FUNCTION refused" in str(exc.diag.message_primary), exc
                planted = False
                attacker.rollback()
            with connect(fresh_admin_url) as admin:
                for statement in UPGRADE:
                    admin.execute(statement)
            attacker.commit()
        # a new session: the caller plans its call anew
        called = answered(fresh_admin_url, ("SELECT public.idem_next_caller()", "CALL public.idem_cleanup()"))
        assert not planted and called == ["ok", "ok"], f"planted: {planted}; the upgrade's call, the cleanup: {called}"


def test_no_collation_passes_for_the_databases_default(fresh_admin_url: str) -> None:
    """The refusal compares what pg_collation_for prints with "default": a collation a caller
    names "default" in its own pg_temp (or in a schema it made) prints qualified under the
    definer's pinned path, so it is refused too; and a call whose text arguments carry two
    different implicit collations (columns of a temporary table) has no collation at all, so
    the definer's variables take the default and compare the token byte by byte: an upper-case
    token that a case-blind column finds equal is not the claim's (IDM01), the claim's own is."""
    with login_role(fresh_admin_url, "idem_app") as (_, url), connect(url) as app:
        mine = claim(app, new_key())
        app.execute(CASE_BLIND.replace("public.case_blind", 'pg_temp."default"'))
        with pytest.raises(psycopg.Error, match=COLLATED + r'pg_temp\."default"\)') as refused:
            app.execute(
                ROUTINES["idem_heartbeat"].replace("%(token)s", '%(token)s COLLATE pg_temp."default"'),
                {"id": mine["key_id"], "token": mine["claim_token"]},
            )
        assert refused.value.sqlstate == "IDM00"
        app.execute('CREATE TEMP TABLE tokens (token text COLLATE pg_temp."default", endpoint text COLLATE "C")')
        app.execute(
            "INSERT INTO tokens VALUES (%s, 'POST /api/trading/orders'), (%s, 'POST /api/trading/orders')",
            (mine["claim_token"].upper(), mine["claim_token"]),
        )
        seen = {}
        for token in (mine["claim_token"].upper(), mine["claim_token"]):
            try:
                row = one(
                    app,
                    "SELECT public.idem_record_lost_claim(p_key_id => %s, p_claim_token => t.token,"
                    " p_endpoint => t.endpoint) AS lost FROM tokens t WHERE t.token::bytea = %s::bytea",
                    (mine["key_id"], token),
                )
                seen[token] = str(row["lost"])
            except psycopg.Error as exc:
                seen[token] = str(exc.sqlstate)
        assert seen == {mine["claim_token"].upper(): "IDM01", mine["claim_token"]: "False"}, seen


#: Range types whose constructors PostgreSQL names after them (the range's take two bounds and
#: an optional flags text, the multirange's none, one range or VARIADIC ranges), made in public.
RANGES = (
    # public.idem_cleanup(): CALL public.idem_cleanup() (the pg_cron job, the DBA's psql) matches
    # it and the procedure with its defaults alike
    "CREATE TYPE public.my_span AS RANGE (subtype = integer, multirange_type_name = public.idem_cleanup)",
    # public.idem_reencrypt_responses(text, text): a positional rotation call matches it too
    "CREATE TYPE public.idem_reencrypt_responses AS RANGE (subtype = text)",
)


def test_a_range_types_constructors_never_overload_an_idem_routine(fresh_admin_url: str) -> None:
    """CREATE TYPE ... AS RANGE makes constructor functions under the range's and the multirange's
    names, in public, the bootstrap superuser's; the routine guard watched CREATE FUNCTION & co.
    only, so a role that may create in public made public.idem_cleanup(), and every
    CALL public.idem_cleanup() after was 42725 (the drop guard then kept it: its constructors
    bear an idem name). Safe: each is refused (42501), and the cleanup and a positional rotation
    run."""
    with connect(fresh_admin_url) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    with login_role(fresh_admin_url, "idem_app") as (_, url):
        planted = []
        with psycopg.connect(url, autocommit=True) as attacker:
            for statement in RANGES:
                try:
                    attacker.execute(statement)
                    planted.append(statement)
                except psycopg.errors.InsufficientPrivilege as exc:
                    assert "idem_ddl_guard: CREATE TYPE refused" in str(exc.diag.message_primary), exc
            attacker.execute("CREATE TYPE public.my_own_span AS RANGE (subtype = integer)")  # not idem's names
        ran = answered(  # a new session, as the nightly job's
            fresh_admin_url,
            (
                "CALL public.idem_cleanup()",
                "SELECT * FROM public.idem_reencrypt_responses('old-k3y-0123456789-abcdefghijklmnopqrstuvwxyz',"
                " 'new-k3y-0123456789-abcdefghijklmnopqrstuvwxyz')",
            ),
        )
        assert not planted and ran == ["ok", "ok"], f"planted: {planted}; then: {ran}"
