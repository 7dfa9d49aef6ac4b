-- idem_encrypt_response
-- Still JSONB, so the column keeps its type; a DBA without the key sees only ciphertext (and
-- can open it with gpg and the key). The key arrives as an argument, never stored.
CREATE OR REPLACE FUNCTION public.idem_encrypt_response(p_body jsonb, p_key text)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_kid text;
BEGIN
    -- GUARD: nothing to encrypt, or encryption is off
    IF p_body IS NULL OR p_key IS NULL THEN
        RETURN p_body;
    END IF;
    v_kid := public.idem_response_key_id(p_key);
    RETURN pg_catalog.jsonb_build_object(
        'idem_enc', 'pgp-sym-v1',
        'kid', v_kid,
        'data', public.armor(public.pgp_sym_encrypt(p_body::text, p_key,
                                                    'cipher-algo=aes256, s2k-count=1024')));
END
$$;

COMMENT ON FUNCTION public.idem_encrypt_response IS
    'Returns p_body encrypted under p_key as {"idem_enc":"pgp-sym-v1","kid":...,"data":<armored>} '
    '(pgcrypto, AES-256); p_body unchanged when p_key or p_body is NULL. Errors: IDM00 weak key.';
