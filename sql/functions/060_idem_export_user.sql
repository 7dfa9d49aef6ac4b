-- idem_export_user
-- Decrypts only with keys the caller passes: a DBA's export without them stays ciphertext, so
-- the app's keys never have to reach the DBA. Reads only; takes no lock beyond a snapshot.
CREATE OR REPLACE FUNCTION public.idem_export_user(
    p_user_id                integer,
    p_response_key           text DEFAULT NULL,
    p_response_key_fallback  text DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_response_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_export_user', pg_catalog.pg_collation_for(p_response_key));
    v_rows jsonb;
BEGIN
    -- GUARD: NULL is no data subject
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_export_user: p_user_id must not be NULL';
    END IF;

    SELECT COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'id', k.id,
               'idem_key', k.idem_key,
               'scope_user_id', k.scope_user_id,
               'scope_endpoint', k.scope_endpoint,
               'request_hash', k.request_hash,
               'status', k.status,
               'response_code', k.response_code,
               'response_body', CASE WHEN p_response_key IS NULL AND p_response_key_fallback IS NULL
                                     THEN k.response_body
                                     ELSE public.idem_decrypt_response(k.response_body, p_response_key,
                                                                       p_response_key_fallback) END,
               'response_headers', CASE WHEN k.response_headers IS NULL
                                          OR (p_response_key IS NULL AND p_response_key_fallback IS NULL)
                                        THEN k.response_headers
                                        ELSE public.idem_decrypt_response(k.response_headers, p_response_key,
                                                                          p_response_key_fallback) END,
               'created_at', k.created_at,
               'locked_at', k.locked_at,
               'expires_at', k.expires_at) ORDER BY k.created_at, k.id), '[]'::jsonb)
      INTO v_rows
      FROM public.idempotency_keys k
     WHERE k.scope_user_id = p_user_id;
    RETURN v_rows;
END
$$;

COMMENT ON FUNCTION public.idem_export_user IS
    'GDPR access/portability: returns all idempotency_keys rows of p_user_id as a JSON array '
    '(oldest first, bodies and response_headers included). Encrypted bodies and headers are decrypted '
    'when p_response_key and/or p_response_key_fallback are given, else exported as stored (ciphertext). '
    'Errors: IDM00 when p_user_id is NULL; IDM03 a body is under neither given key; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
