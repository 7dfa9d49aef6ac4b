-- 000_schema: the structure every function relies on (contract §2, §3).
-- Cases:
--   idempotency_keys: exists, exact columns, column types, NOT NULLs, defaults, primary key;
--     the unique constraint is (idem_key, scope_user_id, scope_endpoint) NULLS NOT DISTINCT;
--     the canonical-key, non-empty-endpoint, status and 7-day retention CHECKs exist;
--     scope_user_id references users(id) ON DELETE CASCADE;
--     contract §2's indexes: the expiry index over every row, the partial user index, no in-flight index.
--   idempotency_events: exists, exact columns, its event CHECK, its time and key indexes, and
--     at most one lost_claim event per token.
--   idem_claim_result: a composite type with the six columns contract §3 names, in order, then
--     response_headers, claim_token and attempt; idempotency_keys.response_headers is jsonb and nullable.
--   host tables users and audit_log exist (minimal versions).
--   every documented idem_* routine exists, none is overloaded, each returns what the
--     contract says (the ops and encryption helpers too); idem_cleanup is a procedure;
--     idem_schema_version() is 6; idem_complete takes p_response_headers and p_claim_token by name, with defaults;
--     the idem_health view and pgcrypto exist.
--   every idem_* routine carries a COMMENT of at least a sentence that documents its errors,
--     idem_claim's names all six outcomes, and idempotency_keys has a table comment.
BEGIN;
SELECT plan(99);
-- Where the citus extension exists (make test-citus) the distributed forms of sql/citus/ are
-- installed, and the same number of checks asserts them instead.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS distributed \gset

-- idempotency_keys ---------------------------------------------------------------------
SELECT has_table('public', 'idempotency_keys', 'the store table idempotency_keys exists');
SELECT columns_are('public', 'idempotency_keys',
    ARRAY['id', 'idem_key', 'scope_user_id', 'scope_endpoint', 'request_hash', 'response_code',
          'response_body', 'status', 'created_at', 'locked_at', 'expires_at', 'response_headers', 'legacy_token'],
    'idempotency_keys has exactly contract §2''s columns, the replayed headers (SQL API 3) and the mark of claims an upgrade left in flight (SQL API 9)');
SELECT col_type_is('public', 'idempotency_keys', 'id', 'bigint', 'id is a bigint');
SELECT col_type_is('public', 'idempotency_keys', 'idem_key', 'text', 'idem_key is text');
SELECT col_type_is('public', 'idempotency_keys', 'scope_user_id',
                   CASE WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN 'integer' ELSE 'idem_user_id' END,
                   'scope_user_id is the user scope''s domain (migration 0017; on Citus its integer base, colocated with users)');
SELECT is(public.idem_user_id_type(), 'integer'::regtype, 'the default install''s user scope is integer, as public.users.id (SQL API 15)');
SELECT col_type_is('public', 'idempotency_keys', 'scope_endpoint', 'text', 'scope_endpoint is text');
SELECT col_type_is('public', 'idempotency_keys', 'request_hash', 'text', 'request_hash is text');
SELECT col_type_is('public', 'idempotency_keys', 'response_code', 'smallint', 'response_code is a smallint');
SELECT col_type_is('public', 'idempotency_keys', 'response_body', 'jsonb', 'response_body is jsonb');
SELECT col_type_is('public', 'idempotency_keys', 'response_headers', 'jsonb', 'response_headers is jsonb');
SELECT col_is_null('public', 'idempotency_keys', 'response_headers',
    'response_headers may be NULL (rows completed before SQL API 3, no body stored)');
SELECT col_type_is('public', 'idempotency_keys', 'status', 'text', 'status is text');
SELECT col_type_is('public', 'idempotency_keys', 'created_at', 'timestamp with time zone', 'created_at is a timestamptz');
SELECT col_type_is('public', 'idempotency_keys', 'locked_at', 'timestamp with time zone', 'locked_at is a timestamptz');
SELECT col_type_is('public', 'idempotency_keys', 'expires_at', 'timestamp with time zone', 'expires_at is a timestamptz');
\if :distributed
SELECT col_is_pk('public', 'idempotency_keys', ARRAY['scope_user_id', 'id'],
    'on Citus the primary key is (scope_user_id, id): a distributed key must hold the distribution column');
\else
SELECT col_is_pk('public', 'idempotency_keys', 'id', 'id is the primary key of idempotency_keys');
\endif
SELECT col_not_null('public', 'idempotency_keys', 'idem_key', 'idem_key is NOT NULL');
\if :distributed
SELECT col_not_null('public', 'idempotency_keys', 'scope_user_id',
    'on Citus scope_user_id is NOT NULL (the distribution column; service calls use the reserved user 0)');
\else
SELECT col_is_null('public', 'idempotency_keys', 'scope_user_id', 'scope_user_id may be NULL (service calls have no user)');
\endif
SELECT col_not_null('public', 'idempotency_keys', 'scope_endpoint', 'scope_endpoint is NOT NULL');
SELECT col_not_null('public', 'idempotency_keys', 'request_hash', 'request_hash is NOT NULL');
SELECT col_not_null('public', 'idempotency_keys', 'status', 'status is NOT NULL');
SELECT col_not_null('public', 'idempotency_keys', 'expires_at', 'expires_at is NOT NULL');
SELECT col_default_is('public', 'idempotency_keys', 'status', 'in_flight', 'a new row defaults to status in_flight');

SELECT has_index('public', 'idempotency_keys', 'uq_idem_key_user_endpoint',
    ARRAY['idem_key', 'scope_user_id', 'scope_endpoint'],
    'the unique index covers (idem_key, scope_user_id, scope_endpoint) in that order');
SELECT index_is_unique('public', 'idempotency_keys', 'uq_idem_key_user_endpoint',
    'uq_idem_key_user_endpoint is a unique index');
SELECT ok((SELECT i.indnullsnotdistinct
             FROM pg_catalog.pg_constraint c
             JOIN pg_catalog.pg_index i ON i.indexrelid = c.conindid
            WHERE c.conrelid = 'public.idempotency_keys'::regclass
              AND c.conname = 'uq_idem_key_user_endpoint'
              AND c.contype = 'u'),
    'the unique constraint is NULLS NOT DISTINCT, so calls with no user scope dedupe too');

SELECT has_check('public', 'idempotency_keys', 'idempotency_keys has CHECK constraints');
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_constraint
            WHERE conrelid = 'public.idempotency_keys'::regclass AND contype = 'c'
              AND conname IN ('ck_idem_key_canonical', 'ck_idem_endpoint_not_empty', 'ck_idem_retention_cap')),
    3, 'the canonical-key, non-empty-endpoint and retention-cap CHECKs are all in place');
SELECT matches((SELECT pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint
                 WHERE conrelid = 'public.idempotency_keys'::regclass AND conname = 'ck_idem_retention_cap'),
    'expires_at <= \(created_at \+ ''168:00:00''',
    'the retention CHECK caps expires_at at created_at + 168 hours (elapsed time, whatever the TimeZone)');
SELECT matches((SELECT pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint
                 WHERE conrelid = 'public.idempotency_keys'::regclass AND contype = 'c'
                   AND pg_catalog.pg_get_constraintdef(oid) LIKE '%status%'),
    'in_flight.*completed.*failed',
    'status is limited to in_flight, completed and failed');

SELECT fk_ok('public', 'idempotency_keys', 'scope_user_id', 'public', 'users', 'id',
    'scope_user_id references users(id)');
SELECT is((SELECT confdeltype::text FROM pg_catalog.pg_constraint
            WHERE conrelid = 'public.idempotency_keys'::regclass AND contype = 'f'),
    'c', 'deleting a user cascades to their idempotency rows (ON DELETE CASCADE)');

SELECT has_index('public', 'idempotency_keys', 'idx_idem_keys_expires', 'expires_at',
    'the expiry index exists on expires_at');
SELECT is((SELECT indpred FROM pg_catalog.pg_index
            WHERE indexrelid = 'public.idx_idem_keys_expires'::regclass), NULL,
    'the expiry index covers every row (no status predicate: the completion stays HOT, 0007)');
SELECT has_index('public', 'idempotency_keys', 'idx_idem_keys_user', 'scope_user_id',
    'contract §2''s user index exists on scope_user_id');
SELECT matches((SELECT pg_catalog.pg_get_expr(indpred, indrelid) FROM pg_catalog.pg_index
                 WHERE indexrelid = 'public.idx_idem_keys_user'::regclass),
    'scope_user_id IS NOT NULL', 'the user index is partial: rows with a user only');
SELECT hasnt_index('public', 'idempotency_keys', 'idx_idem_keys_in_flight',
    'no in-flight index: the expiry index finds orphans (0007)');
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_index i
             JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attname = 'status'
            WHERE i.indrelid = 'public.idempotency_keys'::regclass
              AND (a.attnum = ANY (i.indkey)
                   OR pg_catalog.pg_get_expr(i.indpred, i.indrelid) LIKE '%status%')),
    0, 'no index names status, so the completion (status in_flight -> completed) can be HOT');
SELECT is((SELECT c.reloptions FROM pg_catalog.pg_class c WHERE c.oid = 'public.idempotency_keys'::regclass),
    ARRAY['fillfactor=90'], 'idempotency_keys keeps 10 % of each page free for HOT completions');
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_index WHERE indrelid = 'public.idempotency_keys'::regclass),
    4, 'idempotency_keys has exactly four indexes (pk, unique, expiry, user): each costs every claim');

-- idempotency_events ---------------------------------------------------------------------
SELECT has_table('public', 'idempotency_events', 'the event log idempotency_events exists');
SELECT columns_are('public', 'idempotency_events',
    ARRAY['id', 'occurred_at', 'event', 'key_id', 'scope_user_id', 'scope_endpoint', 'detail'],
    'idempotency_events has exactly its documented columns');
SELECT col_type_is('public', 'idempotency_events', 'detail', 'jsonb', 'an event''s detail is jsonb');
SELECT matches((SELECT pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint
                 WHERE conrelid = 'public.idempotency_events'::regclass AND contype = 'c'),
    'stale_heal.*erasure', 'the event kinds are a closed set including stale_heal and erasure');
SELECT has_index('public', 'idempotency_events', 'idx_idem_events_occurred', 'occurred_at',
    'the event log is indexed by time for trimming');

-- idem_claim_result -----------------------------------------------------------------------
SELECT has_composite('public', 'idem_claim_result', 'the composite type idem_claim_result exists');
SELECT results_eq(
    $$SELECT a.attname::text COLLATE "default", pg_catalog.format_type(a.atttypid, a.atttypmod)
        FROM pg_catalog.pg_attribute a
       WHERE a.attrelid = 'public.idem_claim_result'::regclass AND a.attnum > 0 AND NOT a.attisdropped
       ORDER BY a.attnum$$,
    $$VALUES ('outcome', 'text'), ('key_id', 'bigint'), ('request_hash', 'text'),
             ('response_code', 'smallint'), ('response_body', 'jsonb'), ('retry_after_ms', 'integer'),
             ('response_headers', 'jsonb'), ('claim_token', 'text'), ('attempt', 'integer'),
             ('holder_elapsed_ms', 'integer')$$,
    'idem_claim_result has the contract''s six columns, in order, with their types, then response_headers, claim_token, attempt and holder_elapsed_ms');

-- host tables -------------------------------------------------------------------------------
SELECT has_table('public', 'users', 'the host table users exists');
SELECT has_table('public', 'audit_log', 'the host table audit_log exists');
SELECT has_column('public', 'audit_log', 'context', 'audit_log has a context column for the replay''s details');

-- the API surface ---------------------------------------------------------------------------
SELECT is_empty(
    $$SELECT p.proname FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
       GROUP BY p.proname HAVING count(*) > 1$$,
    'no idem_* routine is overloaded: one signature per name (pgmq #364)');
SELECT ok(pg_catalog.to_regproc(name) IS NOT NULL
          AND pg_catalog.pg_function_is_visible(pg_catalog.to_regproc(name)),
          format('the documented routine %s exists', name))
  FROM unnest(ARRAY[
    'public.idem_canonical_key',
    'public.idem_claim',
    'public.idem_cleanup',
    'public.idem_cleanup_batch',
    'public.idem_complete',
    'public.idem_erase_user',
    'public.idem_export_user',
    'public.idem_fail',
    'public.idem_heartbeat',
    'public.idem_schema_version']) name;
SELECT function_returns('public', 'idem_schema_version', 'integer',
    'idem_schema_version returns an integer');
SELECT function_returns('public', 'idem_canonical_key', 'text',
    'idem_canonical_key returns text');
SELECT function_returns('public', 'idem_claim',
    'idem_claim_result', 'idem_claim returns one idem_claim_result row');
SELECT function_returns('public', 'idem_complete', 'void',
    'idem_complete returns void');
SELECT is((SELECT proargnames FROM pg_catalog.pg_proc
            WHERE oid = 'public.idem_complete'::regproc),
    ARRAY['p_key_id', 'p_response_code', 'p_response_body', 'p_response_key', 'p_response_headers', 'p_claim_token'],
    'idem_complete''s parameters carry the documented names (p_response_headers, then p_claim_token, by name)');
SELECT function_returns('public', 'idem_fail', 'void',
    'idem_fail returns void');
SELECT function_returns('public', 'idem_heartbeat', 'timestamp with time zone',
    'idem_heartbeat returns the new locked_at as a timestamptz');
SELECT function_returns('public', 'idem_erase_user', 'bigint',
    'idem_erase_user returns the erased count as a bigint');
SELECT function_returns('public', 'idem_export_user', 'setof record',
    'idem_export_user returns a set of rows, one per key of the user');
SELECT function_returns('public', 'idem_cleanup_batch', 'integer',
    'idem_cleanup_batch returns the number of rows it deleted');
-- day-two operations and encrypted responses
SELECT function_returns('public', 'idem_schedule_cleanup', 'text',
    'idem_schedule_cleanup returns what it did (scheduled, unchanged, other_database, absent)');
SELECT function_returns('public', 'idem_health', 'setof record',
    'idem_health returns a set of aggregate rows');
SELECT function_returns('public', 'idem_inspect', 'setof record',
    'idem_inspect returns a set of rows, one per scope of the key');
SELECT function_returns('public', 'idem_record_lost_claim', 'boolean',
    'idem_record_lost_claim returns whether it recorded an event');
SELECT function_returns('public', 'idem_response_key_id', 'text',
    'idem_response_key_id returns the key''s short id');
SELECT function_returns('public', 'idem_encrypt_response', 'jsonb',
    'idem_encrypt_response returns the stored (jsonb) form');
SELECT function_returns('public', 'idem_decrypt_response', 'jsonb',
    'idem_decrypt_response returns the plain jsonb body');
SELECT function_returns('public', 'idem_reencrypt_responses', 'setof record',
    'idem_reencrypt_responses returns its progress (last_id, rewritten)');
SELECT function_returns('public', 'idem_response_key_census', ARRAY['text'], 'setof record',
    'idem_response_key_census returns bodies per key id (kid, bodies, is_current)');
SELECT function_returns('public', 'idem_lost_claim_state', ARRAY['bigint', 'timestamp with time zone'], 'text',
    'idem_lost_claim_state returns what became of a lost claim''s row, in words');
SELECT ok(pg_catalog.obj_description('public.idem_claim(text,public.idem_user_id,text,jsonb,interval,interval,integer,text,timestamptz,text,text,text)'::regprocedure, 'pg_proc') ~ '23503.*42883',
    'idem_claim''s comment names the errors a DBA meets first: 23503 (unknown user), 42883 (a misspelt argument)');
SELECT has_view('public', 'idem_health', 'the idem_health view exists for psql');
SELECT has_extension('pgcrypto', 'pgcrypto is installed for encrypted responses');
SELECT has_index('public', 'idempotency_events', 'idx_idem_events_key_id', 'key_id',
    'events are indexed by the key they concern');
SELECT index_is_unique('public', 'idempotency_events', 'uq_idem_events_lost_claim',
    'at most one lost_claim event per claim token (a unique partial index)');
SELECT is((SELECT prokind::text FROM pg_catalog.pg_proc WHERE oid = 'public.idem_cleanup'::regproc),
    'p', 'idem_cleanup is a procedure (it commits between batches)');
SELECT is((SELECT proargmodes::text[] FROM pg_catalog.pg_proc WHERE oid = 'public.idem_cleanup'::regproc),
    ARRAY['i', 'b', 'i', 'i'], 'idem_cleanup reports its count through INOUT p_deleted');
SELECT is((SELECT proargnames FROM pg_catalog.pg_proc
            WHERE oid = 'public.idem_claim'::regproc),
    ARRAY['p_key', 'p_user_id', 'p_endpoint', 'p_request', 'p_ttl', 'p_stale_after', 'p_wait_ms', 'p_on_stale', 'p_now',
          'p_response_key', 'p_response_key_fallback', 'p_key_format'],
    'idem_claim''s parameters carry the documented names, for named-argument calls');
SELECT is((SELECT pronargdefaults::int FROM pg_catalog.pg_proc
            WHERE oid = 'public.idem_claim'::regproc),
    8, 'idem_claim defaults p_ttl, p_stale_after, p_wait_ms, p_on_stale, p_now, the two response keys and p_key_format');
SELECT is(public.idem_schema_version(), 15, 'the SQL API version is 15');
SELECT volatility_is('public', 'idem_canonical_key', 'immutable',
    'idem_canonical_key is immutable (pure validation)');
SELECT volatility_is('public', 'idem_claim',
    'volatile', 'idem_claim is volatile (it writes)');

-- comments ----------------------------------------------------------------------------------
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND COALESCE(pg_catalog.btrim(pg_catalog.obj_description(p.oid, 'pg_proc')), '') = ''$$,
    'every idem_* routine has a non-empty COMMENT for \df+');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND COALESCE(pg_catalog.length(pg_catalog.obj_description(p.oid, 'pg_proc')), 0) < 40$$,
    'every idem_* routine''s comment is at least a sentence long');
SELECT ok((SELECT bool_and(pg_catalog.obj_description(
                  'public.idem_claim'::regproc,
                  'pg_proc') LIKE '%' || o || '%')
             FROM unnest(ARRAY['claimed', 'mismatch', 'replay', 'in_flight', 'stale', 'previous_failed', 'Errors']) o),
    'idem_claim''s comment names all six outcomes and its errors');
SELECT isnt(pg_catalog.obj_description('public.idempotency_keys'::regclass, 'pg_class'), NULL,
    'idempotency_keys has a table comment');
SELECT ok((SELECT bool_and(COALESCE(pg_catalog.obj_description(p.oid, 'pg_proc'), '') LIKE '%Errors%')
             FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
              AND p.proname <> 'idem_schema_version'),
    'every idem_* routine that can raise documents its errors in its comment');

SELECT * FROM finish();
ROLLBACK;
