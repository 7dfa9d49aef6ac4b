-- idem_schema_version
-- Why: the shim refuses to start against an older schema, so code deployed ahead of its
-- migration fails loudly at boot rather than on the first order. Bump it whenever a
-- signature, an outcome or a SQLSTATE changes (sql/README.md, "Changing a signature"). The
-- body stays `SELECT <n>`: the app role may not execute this function (contract §3a), so the shim
-- reads the number from pg_proc.prosrc (queries.SCHEMA_VERSION), which is why this one routine
-- pins its path rather than take a SQL-standard body (whose text prosrc does not keep).
CREATE OR REPLACE FUNCTION public.idem_schema_version()
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 15 $$;

COMMENT ON FUNCTION public.idem_schema_version IS
    'The idem SQL API version (3: response headers: idem_complete(p_response_headers), '
    'idem_claim_result.response_headers, idem_export_user and idem_inspect show them, non-object bodies '
    'stored as {"idem_raw": ...}; 4: 22023 only for a malformed key, IDM00 for a bad argument, IDM04 for a '
    'refused response; one message prefix per routine; 5: the privilege boundary: idem_claim_result.claim_token, '
    'which idem_complete, idem_fail, idem_heartbeat and idem_record_lost_claim take as p_claim_token; p_now '
    'for the owner only; idem_admin holds cleanup, rotation, inspect, health and scheduling; erasure removes '
    'the user''s events; the nil UUID is refused; 6: idem_fail(p_release) frees a failed key, event "released"; '
    '7: idem_cleanup(p_max_rows_per_second) paces itself, default batch 1000, and idem_cleanup_plan; '
    '8: exactly-once past the database: idem_claim_result.attempt (1 + the stale heals before this claim), '
    'idem_downstream_key; 9: the second privilege round: claim tokens bound to the claim (key_id and claim time, '
    '48 hex digits), tokenless only for claims marked by migration 0012 (idempotency_keys.legacy_token); '
    'idem_export_user and idem_erase_user are idem_dsr''s, not idem_app''s; idem_health is idem_monitor''s too; '
    'p_stale_after below 1 second for the owner and idem_admin only; every routine pins its path or leaves no '
    'name to resolve; 10: what clients meet: idem_claim_result.holder_elapsed_ms, and p_key_format (''uuid'' or '
    '''opaque'') on idem_claim, idem_downstream_key, idem_inspect and idem_canonical_key, with the CHECK on idem_key '
    'admitting opaque keys; 11: a distributed store across changes of nodes: idem_complete_in_scope answers 57P03 '
    'while Citus cannot delegate it (a worker''s metadata stale after a promotion), idem_new_key_id refuses '
    'a claim that reached a worker (IDM00), a delegated completion of a healed claim is IDM01; 12: bounded observability: idem_claim, idem_downstream_key and '
    'idem_record_lost_claim refuse an endpoint over 200 characters or with a control character (IDM00), idem_health '
    'takes p_scopes and p_top and folds every other endpoint into rows whose scope_endpoint is NULL; 13: a data '
    'subject''s export in pages: idem_export_user returns one row per key (its twelve columns) instead of one jsonb '
    'array, which jsonb''s 256 MiB limit refused for a user with large responses; 14: p_key_format '
    '''opaque_short'' (opaque keys from 1 character, the caller''s minimum), the CHECK on idem_key admitting '
    'them; 15: the host''s '
    'users table: p_user_id and scope_user_id are public.idem_user_id, a domain over the id type (integer, bigint or '
    'uuid) of the users table fixed at install (public.idem_host_users); idem_downstream_key encodes a bigint or uuid '
    'user by its type). The Python '
    'shim checks it at start-up.';
