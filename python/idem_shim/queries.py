"""Every SQL statement the shim sends, in one place. Each is one round trip.

Named arguments only (the SQL API has no overloads); explicit casts pin the parameter types so
psycopg's choice of int2/int4/int8 never changes which function PostgreSQL resolves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, LiteralString

#: The schema version this code is written against; ``idem_schema_version()`` must be >= it.
EXPECTED_SCHEMA_VERSION: Final = 15

#: The response keys are NULL unless IDEM_RESPONSE_KEY is set: then a replayed body stored
#: encrypted is opened with the current key or, during a rotation, the fallback.
#: The claim and the completion run on every tracked request, so they take positional
#: placeholders (psycopg maps named ones on every call, client CPU on the hot path); the
#: SQL still names every argument. Parameters in order: ClaimRequest.params() + the two keys.
#:
#: The claim commits on its own (autocommit) and asynchronously: the trailing set_config makes
#: this statement's transaction commit with synchronous_commit off, so it does not wait for a
#: WAL flush. WAL is one sequence: the handler's transaction, which commits synchronously
#: afterwards on the same server, flushes the claim's record before its own, and a claim lost in
#: a crash belongs to a request whose business transaction never committed (the client got no
#: answer; its retry executes once). A replay writes its audit row and keeps the session's
#: setting (durable). Only the shim's own statement does this: a DBA who calls idem_claim inside
#: a transaction with business writes commits as the session says.
CLAIM: Final[LiteralString] = """\
SELECT outcome, key_id, request_hash, response_code, response_body, retry_after_ms, response_headers,
       claim_token,
        pg_catalog.set_config('synchronous_commit',
                   CASE WHEN outcome OPERATOR(pg_catalog.=) 'replay'
                        THEN pg_catalog.current_setting('synchronous_commit')
                        ELSE 'off' END,
                   true),
       attempt, holder_elapsed_ms
FROM public.idem_claim(p_key => %s::pg_catalog.text,
                p_user_id => %s::public.idem_user_id,
                p_endpoint => %s::pg_catalog.text,
                p_request => %s::pg_catalog.jsonb,
                p_ttl => %s::interval,
                p_stale_after => %s::interval,
                p_wait_ms => %s::integer,
                p_on_stale => %s::pg_catalog.text,
                p_key_format => %s::pg_catalog.text,
                p_response_key => %s::pg_catalog.text,
                p_response_key_fallback => %s::pg_catalog.text)"""

#: The claim of ``claim="in_transaction"`` (contract §4e): the first statement of the handler's
#: own transaction (BEGIN, this, ``SAVEPOINT idem_work`` leave in one pipeline), so the key's row
#: commits with the business writes or not at all. A duplicate's INSERT waits on the holder's
#: uncommitted row in the unique index until it commits (the replay) or rolls back (the claim):
#: that wait is bounded by the transaction-local lock_timeout set first (wait_ms, at least 1 ms:
#: 0 would mean no bound), and its 55P03 is the 409 in flight. Each lateral reference (prior,
#: bound, idle) orders the calls: the session's lock_timeout read, the bound set, then the claim;
#: the set_config column puts the session's own lock_timeout back for the handler's statements.
#: idle_in_transaction_session_timeout (stale_after) stays for the transaction: a holder idle
#: that long (a stopped worker) has its session ended by the server, so its key is free, as a
#: stale heal frees a before-claim's.
#: No synchronous_commit here: this transaction carries the business writes. The last column is
#: the transaction's id (the claim's INSERT assigned it; NULL when nothing was written): a handler's
#: PREPARE TRANSACTION detaches the row from the session, and the shim finds it by that id
#: (PREPARED_CLAIM). Parameters: lock_timeout ms, idle timeout ms, then those of CLAIM.
CLAIM_IN_TRANSACTION: Final[LiteralString] = """\
SELECT c.outcome, c.key_id, c.request_hash, c.response_code, c.response_body, c.retry_after_ms,
       c.response_headers, c.claim_token,
       pg_catalog.set_config('lock_timeout', prior, true),
       c.attempt, c.holder_elapsed_ms, pg_catalog.pg_current_xact_id_if_assigned()::pg_catalog.text
FROM pg_catalog.current_setting('lock_timeout') AS prior
CROSS JOIN LATERAL pg_catalog.set_config('lock_timeout',
                CASE WHEN prior IS NOT NULL THEN %s::pg_catalog.text END, true) AS bound
CROSS JOIN LATERAL pg_catalog.set_config('idle_in_transaction_session_timeout',
                CASE WHEN bound IS NOT NULL THEN %s::pg_catalog.text END, true) AS idle
CROSS JOIN LATERAL public.idem_claim(
                p_key => CASE WHEN idle IS NOT NULL THEN %s::pg_catalog.text END,
                p_user_id => %s::public.idem_user_id,
                p_endpoint => %s::pg_catalog.text,
                p_request => %s::pg_catalog.jsonb,
                p_ttl => %s::interval,
                p_stale_after => %s::interval,
                p_wait_ms => %s::integer,
                p_on_stale => %s::pg_catalog.text,
                p_key_format => %s::pg_catalog.text,
                p_response_key => %s::pg_catalog.text,
                p_response_key_fallback => %s::pg_catalog.text) AS c"""

#: An in_transaction claim whose transaction ended before its failure could be recorded (its
#: COMMIT failed: a deferred constraint): on_failure keep's failed row, recorded afresh in a
#: transaction of its own (autocommit), claimed and failed in one statement. lock_timeout 1 ms:
#: a duplicate that took the key in between holds it, runs, and is not waited for (nothing is
#: recorded then). Parameters: the response code, then those of CLAIM.
FAIL_AFRESH: Final[LiteralString] = """\
SELECT public.idem_fail(p_key_id => c.key_id, p_response_code => %s::integer, p_claim_token => c.claim_token)
FROM pg_catalog.set_config('lock_timeout', '1', true) AS bound
CROSS JOIN LATERAL public.idem_claim(
                p_key => CASE WHEN bound IS NOT NULL THEN %s::pg_catalog.text END,
                p_user_id => %s::public.idem_user_id,
                p_endpoint => %s::pg_catalog.text,
                p_request => %s::pg_catalog.jsonb,
                p_ttl => %s::interval,
                p_stale_after => %s::interval,
                p_wait_ms => %s::integer,
                p_on_stale => %s::pg_catalog.text,
                p_key_format => %s::pg_catalog.text,
                p_response_key => %s::pg_catalog.text,
                p_response_key_fallback => %s::pg_catalog.text) AS c
WHERE c.outcome OPERATOR(pg_catalog.=) 'claimed'"""

#: Sent with an in_transaction claim (prepared.begin_with) when the connection holds statements the
#: shim prepared: how many of those names the session still holds. psycopg deallocates every
#: statement of the session (DEALLOCATE ALL) when it rolls back a block after it prepared a
#: handler's statements, and the default shape's claim, a prepared statement itself, finds that
#: out (26000) and prepares again; this claim is unnamed, so it asks. Parameter: the names, as a
#: text array.
PREPARED_PRESENT: Final[LiteralString] = """\
SELECT pg_catalog.count(*)::pg_catalog.int4 FROM pg_catalog.pg_prepared_statements AS p
 WHERE p.name OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[]) AND NOT p.from_sql"""

#: The prepared transaction that holds an in_transaction claim's row (a handler's PREPARE
#: TRANSACTION: no COMMIT, kill or idle timeout of the session ends it, and every duplicate would
#: wait on the row): its gid, where the session's role prepared it in this database. Parameter:
#: the claim's transaction id (CLAIM_IN_TRANSACTION's last column).
PREPARED_CLAIM: Final[LiteralString] = """\
SELECT p.gid FROM pg_catalog.pg_prepared_xacts AS p
 WHERE p.transaction OPERATOR(pg_catalog.=) %s::pg_catalog.xid8::pg_catalog.xid
   AND p.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
   AND p.owner OPERATOR(pg_catalog.=) CURRENT_USER"""

#: After an in_transaction claim's wait bound fired (55P03): whether it was the table, not a holder.
#: A lock on idempotency_keys that conflicts with the claim's ROW EXCLUSIVE, held or queued by
#: another session (a DBA's LOCK TABLE, a migration's ALTER TABLE, a VACUUM FULL), is the store
#: being unavailable, as the default shape's statement timeout says it; none is a holder in flight.
#: pg_locks is every role's to read. No parameters.
STORE_LOCKED: Final[LiteralString] = """\
SELECT EXISTS (SELECT FROM pg_catalog.pg_locks AS l
                WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'
                  AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database AS d
                                                          WHERE d.datname OPERATOR(pg_catalog.=)
                                                                pg_catalog.current_database())
                  AND l.relation OPERATOR(pg_catalog.=) 'public.idempotency_keys'::pg_catalog.regclass
                  AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
                  AND l.mode OPERATOR(pg_catalog.=) ANY (ARRAY['ShareLock', 'ShareRowExclusiveLock',
                                                                'ExclusiveLock', 'AccessExclusiveLock']))"""

#: The savepoint after an in_transaction claim: a failure under on_failure keep or replay rolls
#: back to it (the handler's writes gone, the claim's row kept) and records its outcome in the
#: same transaction, so a duplicate waiting on the row sees the failure, never a free key.
WORK_SAVEPOINT: Final[LiteralString] = "SAVEPOINT idem_work"
ROLLBACK_TO_WORK: Final[LiteralString] = "ROLLBACK TO SAVEPOINT idem_work"

#: What the own pool runs on each connection given back (pool.py), on its maintenance thread,
#: not the request's: the session as it was opened (its start-up options, ALTER ROLE/DATABASE
#: defaults) but for its prepared statements, which prepared.py checks before each use. A
#: handler shares the session, and its committed SET (client_encoding, statement_timeout,
#: search_path, role), temp tables, held cursors, LISTENs and advisory locks would otherwise meet
#: the next request, any user's. No parameters: one simple-protocol round trip.
RESET_SESSION: Final[LiteralString] = (
    "RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL; CLOSE ALL; UNLISTEN *;"
    " SELECT pg_catalog.pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES"
)

#: Sent unnamed before a statement the shim prepared on an earlier call (prepared.py), in the same
#: pipeline: it fails (22012) when the session holds another statement under that name (a
#: handler's PREPARE after its DEALLOCATE), and the pipeline's abort then skips the EXECUTE, so
#: that statement never runs and never sees the parameters. A name the session lost passes (the
#: EXECUTE's 26000 prepares again). Parameters: the name, the statement's text as prepared.
PREPARED_IS_OURS: Final[LiteralString] = """\
SELECT 1 OPERATOR(pg_catalog./) (NOT EXISTS (
    SELECT FROM pg_catalog.pg_prepared_statements AS p
    WHERE p.name OPERATOR(pg_catalog.=) %s::pg_catalog.text
      AND (p.from_sql OR p.statement OPERATOR(pg_catalog.<>) %s::pg_catalog.text)))::pg_catalog.int4"""

#: With a response key the body and headers are stored encrypted; NULL stores them as they are.
#: Parameters: key_id, response_code, response_body, response_key, response_headers,
#: claim_token (the claim's token, without which the app role may not complete it).
COMPLETE: Final[LiteralString] = """\
SELECT public.idem_complete(p_key_id => %s::bigint,
                     p_response_code => %s::integer,
                     p_response_body => %s::pg_catalog.jsonb,
                     p_response_key => %s::pg_catalog.text,
                     p_response_headers => %s::pg_catalog.jsonb,
                     p_claim_token => %s::pg_catalog.text)"""

#: On a distributed store (Citus, sql/citus/021): the same completion, delegated to the worker
#: that holds the claim's shard, so the handler's writes (as the app's role) and the completion
#: (idem_complete runs as its owner) commit there together. The first parameter is the claim's
#: scope, key_id >> 31; then those of COMPLETE.
COMPLETE_IN_SCOPE: Final[LiteralString] = """\
SELECT public.idem_complete_in_scope(p_scope => %s::integer,
                              p_key_id => %s::bigint,
                              p_response_code => %s::integer,
                              p_response_body => %s::pg_catalog.jsonb,
                              p_response_key => %s::pg_catalog.text,
                              p_response_headers => %s::pg_catalog.jsonb,
                              p_claim_token => %s::pg_catalog.text)"""

#: idem_fail and idem_heartbeat commit asynchronously too (autocommit, set_config local to the
#: statement's transaction): a failure lost in a crash leaves the key in flight until the stale
#: heal frees it (the failed handler's writes were rolled back, so a retry runs once); a lost
#: heartbeat only makes the lease look older, and the holder's connection died with the server.
FAIL: Final[LiteralString] = """\
SELECT public.idem_fail(p_key_id => %(key_id)s::bigint, p_response_code => %(response_code)s::integer,
                 p_claim_token => %(claim_token)s::pg_catalog.text),
       pg_catalog.set_config('synchronous_commit', 'off', true)"""

#: on_failure="release": the same call frees the key instead of failing it, in the same
#: one round trip; the next claim of the key runs again.
RELEASE: Final[LiteralString] = """\
SELECT public.idem_fail(p_key_id => %(key_id)s::bigint, p_response_code => %(response_code)s::integer,
                 p_claim_token => %(claim_token)s::pg_catalog.text, p_release => true),
       pg_catalog.set_config('synchronous_commit', 'off', true)"""

#: The same two inside the work's own transaction, which then commits (a streamed answer, which
#: is never stored: the writes commit with the key failed or freed). No set_config here: the
#: transaction carries the handler's writes and commits durably, as the session says.
FAIL_WITH_WORK: Final[LiteralString] = """\
SELECT public.idem_fail(p_key_id => %(key_id)s::bigint, p_response_code => %(response_code)s::integer,
                 p_claim_token => %(claim_token)s::pg_catalog.text)"""
RELEASE_WITH_WORK: Final[LiteralString] = """\
SELECT public.idem_fail(p_key_id => %(key_id)s::bigint, p_response_code => %(response_code)s::integer,
                 p_claim_token => %(claim_token)s::pg_catalog.text, p_release => true)"""

HEARTBEAT: Final[LiteralString] = """\
SELECT public.idem_heartbeat(p_key_id => %(key_id)s::bigint, p_claim_token => %(claim_token)s::pg_catalog.text),
       pg_catalog.set_config('synchronous_commit', 'off', true)"""

RECORD_LOST_CLAIM: Final[LiteralString] = """\
SELECT public.idem_record_lost_claim(p_key_id => %(key_id)s::bigint, p_endpoint => %(endpoint)s::pg_catalog.text,
                              p_claim_token => %(claim_token)s::pg_catalog.text)"""

#: The key a handler forwards to a broker or to Stripe: only when the handler asks,
#: so the claimed path pays nothing for it. Parameters: key, user_id, endpoint, namespace,
#: key_format (the claim's).
DOWNSTREAM_KEY: Final[LiteralString] = """\
SELECT public.idem_downstream_key(p_key => %s::pg_catalog.text, p_user_id => %s::public.idem_user_id,
                           p_endpoint => %s::pg_catalog.text,
                           p_namespace => %s::pg_catalog.text, p_key_format => %s::pg_catalog.text)"""

#: The installed SQL API version, read from the catalog (which every role may read), and whether
#: this role is a member of idem_app or idem_admin: the app role executes the request path and
#: nothing else (contract §3a), idem_schema_version() included. NULL version: not installed.
SCHEMA_VERSION: Final[LiteralString] = """\
SELECT (SELECT pg_catalog.substring(p.prosrc, '[0-9]+')::integer FROM pg_catalog.pg_proc p
         WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('public.idem_schema_version()')),
       EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                WHERE r.rolname OPERATOR(pg_catalog.=) ANY ('{idem_app,idem_admin}'::pg_catalog.name[])
                  AND pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER'))"""

#: Whether the store is distributed and completes through idem_complete_in_scope (sql/citus/021).
HAS_COMPLETE_IN_SCOPE: Final[LiteralString] = """SELECT pg_catalog.to_regprocedure(
           'public.idem_complete_in_scope(integer,bigint,integer,jsonb,text,jsonb,text)') IS NOT NULL"""

# The statements below the request path's run in the owner's and a DBA's sessions (the CLI's
# admin and data-subject verbs, `idem status`), whose path is pinned to pg_catalog, pg_temp:
# they name idem's routines in public.

#: ``CALL idem_cleanup()`` takes the procedure's own defaults (pg_cron's command); each argument
#: the CLI was given is added by ``cleanup_call``; an unpaced run passes p_max_rows_per_second => NULL.
CLEANUP_ARGUMENTS: Final[Mapping[str, LiteralString]] = {
    "batch_size": "p_batch_size => %(batch_size)s::integer",
    "max_rows_per_second": "p_max_rows_per_second => %(max_rows_per_second)s::integer",
}


def cleanup_call(given: Mapping[str, object]) -> LiteralString:
    """``CALL public.idem_cleanup(...)`` naming only the arguments in ``given`` (keys of CLEANUP_ARGUMENTS)."""
    named: LiteralString = ", ".join(text for name, text in CLEANUP_ARGUMENTS.items() if name in given)
    return "CALL public.idem_cleanup(" + named + ")"


#: What `idem status` says of the cleanup's pace: the default pace's plan (pg_cron's command).
CLEANUP_PLAN: Final[LiteralString] = (
    "SELECT expired, max_rows_per_second, takes, every, fits FROM public.idem_cleanup_plan()"
)

ERASE_USER: Final[LiteralString] = "SELECT public.idem_erase_user(p_user_id => %(user_id)s::public.idem_user_id)"

#: A user's keys, one row each, oldest first (the function's order), as JSON text: json, since
#: jsonb would refuse a key whose body is near its 256 MiB limit, read as text so that psycopg
#: decodes it once and the shim parses it once. Parameters: user_id, then the two response keys
#: (as for CLAIM).
EXPORT_USER: Final[LiteralString] = """\
SELECT pg_catalog.row_to_json(e)::pg_catalog.text
  FROM public.idem_export_user(p_user_id => %s::public.idem_user_id,
                               p_response_key => %s::pg_catalog.text,
                               p_response_key_fallback => %s::pg_catalog.text) AS e"""

HEALTH_FUNCTION_EXISTS: Final[LiteralString] = "SELECT pg_catalog.to_regproc('public.idem_health') IS NOT NULL"

HEALTH: Final[LiteralString] = (
    "SELECT * FROM public.idem_health(p_stale_after => %(stale_after)s::interval, p_recent => %(recent)s::interval)"
)

#: The store gauges' reading (health_gauges.py): the app's declared scopes by name, every other
#: endpoint folded into one NULL one, bounded by its own statement timeout inside one transaction
#: (set_config(..., true) is SET LOCAL, gone at its end).
HEALTH_GAUGES_TIMEOUT: Final[LiteralString] = "SELECT pg_catalog.set_config('statement_timeout', '2000', true)"
HEALTH_GAUGES: Final[LiteralString] = (
    "SELECT kind, scope_endpoint, state, total, stale, expired, oldest, oldest_lease, latest"
    " FROM public.idem_health(p_scopes => %(scopes)s::pg_catalog.text[])"
)

#: Stored bodies per response key id after a rotation: what no given key could open.
RESPONSE_KEY_CENSUS: Final[LiteralString] = (
    "SELECT kid, bodies, is_current FROM public.idem_response_key_census(p_current_key => %(key)s::pg_catalog.text)"
)

#: One batch of a key rotation; the CLI loops, one commit per batch.
REENCRYPT_RESPONSES: Final[LiteralString] = """\
SELECT last_id, rewritten
FROM public.idem_reencrypt_responses(p_old_key => %(old_key)s::pg_catalog.text,
                                     p_new_key => %(new_key)s::pg_catalog.text,
                                     p_after_id => %(after_id)s::bigint,
                                     p_batch_size => %(batch_size)s::integer)"""
