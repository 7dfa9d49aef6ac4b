-- idem_export_user
-- One row per key, each body its own column: no value wraps two keys or a body, so no user's
-- export meets jsonb's 256 MiB limit (issue 39). Decrypts only with keys the caller passes, so
-- the app's keys never have to reach the DBA. Reads only; takes no lock beyond a snapshot.
CREATE OR REPLACE FUNCTION public.idem_export_user(
    p_user_id                public.idem_user_id,
    p_response_key           text DEFAULT NULL,
    p_response_key_fallback  text DEFAULT NULL
)
RETURNS TABLE (
    id                bigint,
    idem_key          text,
    scope_user_id     public.idem_user_id,
    scope_endpoint    text,
    request_hash      text,
    status            text,
    response_code     smallint,
    response_body     jsonb,
    response_headers  jsonb,
    created_at        timestamptz,
    locked_at         timestamptz,
    expires_at        timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_response_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_export_user', pg_catalog.pg_collation_for(p_response_key));
BEGIN
    -- GUARD: NULL is no data subject
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_export_user: p_user_id must not be NULL';
    END IF;

    RETURN QUERY
    SELECT k.id, k.idem_key, k.scope_user_id::public.idem_user_id, k.scope_endpoint, k.request_hash, k.status,
           k.response_code,
           CASE WHEN p_response_key IS NULL AND p_response_key_fallback IS NULL
                THEN k.response_body
                ELSE public.idem_decrypt_response(k.response_body, p_response_key, p_response_key_fallback) END,
           CASE WHEN k.response_headers IS NULL OR (p_response_key IS NULL AND p_response_key_fallback IS NULL)
                THEN k.response_headers
                ELSE public.idem_decrypt_response(k.response_headers, p_response_key, p_response_key_fallback) END,
           k.created_at, k.locked_at, k.expires_at
      FROM public.idempotency_keys k
     WHERE k.scope_user_id OPERATOR(pg_catalog.=) p_user_id
     ORDER BY k.created_at, k.id;
END
$$;

COMMENT ON FUNCTION public.idem_export_user IS
    'GDPR access/portability: returns one row per idempotency_keys row of p_user_id, oldest first '
    '(created_at, then id), with its twelve columns, bodies and response_headers included; '
    'pg_catalog.row_to_json(e) of a row e is that key as JSON (json, which has no 256 MiB limit, not jsonb). '
    'Encrypted bodies and headers are decrypted '
    'when p_response_key and/or p_response_key_fallback are given, else exported as stored (ciphertext). '
    'Errors: IDM00 when p_user_id is NULL; IDM03 a body is under neither given key; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
