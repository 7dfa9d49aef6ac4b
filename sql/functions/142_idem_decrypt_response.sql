-- idem_decrypt_response
-- Raises rather than replay ciphertext; the fallback key serves a rotation. Never echoes a
-- key. Reads nothing but its arguments.
CREATE OR REPLACE FUNCTION public.idem_decrypt_response(
    p_body          jsonb,
    p_key           text,
    p_fallback_key  text DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_kid    text;
    v_key    text;
    v_plain  text;
BEGIN
    -- GUARD: not an encrypted body (plain JSON, or no body)
    IF p_body IS NULL OR pg_catalog.jsonb_typeof(p_body) <> 'object'
       OR (p_body ->> 'idem_enc') IS DISTINCT FROM 'pgp-sym-v1' THEN
        RETURN p_body;
    END IF;

    v_kid := p_body ->> 'kid';
    IF p_key IS NOT NULL AND public.idem_response_key_id(p_key) = v_kid THEN
        v_key := p_key;
    ELSIF p_fallback_key IS NOT NULL AND public.idem_response_key_id(p_fallback_key) = v_kid THEN
        v_key := p_fallback_key;
    END IF;

    -- GUARD: the key that encrypted this body was not given
    IF v_key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM03',
            MESSAGE = pg_catalog.format('idem_decrypt_response: the stored response is encrypted under key id %s, which was not given', v_kid),
            HINT = 'configure that key as IDEM_RESPONSE_KEY or IDEM_RESPONSE_KEY_FALLBACK (see docs/operations.md, key rotation); never re-run the request';
    END IF;

    BEGIN
        v_plain := public.pgp_sym_decrypt(public.dearmor(p_body ->> 'data'), v_key);
    EXCEPTION WHEN external_routine_invocation_exception OR data_exception THEN
        -- GUARD: the kid matched but the data does not open (corrupt or tampered)
        RAISE EXCEPTION USING ERRCODE = 'IDM03',
            MESSAGE = pg_catalog.format('idem_decrypt_response: the stored response under key id %s does not decrypt', v_kid),
            HINT = 'the row is corrupt or was altered; inspect it with public.idem_inspect(p_key => ..., p_with_body => true)';
    END;
    RETURN v_plain::jsonb;
END
$$;

COMMENT ON FUNCTION public.idem_decrypt_response IS
    'Returns the plain body of a stored response: unchanged when not encrypted, else decrypted with '
    'p_key or p_fallback_key, whichever its kid names. Errors: IDM03 when neither key is the one it was '
    'encrypted under, or the data does not decrypt; IDM00 weak key.';
