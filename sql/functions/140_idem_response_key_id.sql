-- idem_response_key_id
-- Why the strength check: encryption uses a light key derivation (s2k-count 1024), so a
-- memorable passphrase would be weak. Never echoes the key. Pure.
CREATE OR REPLACE FUNCTION public.idem_response_key_id(p_key text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: a generated secret, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'
    IF p_key IS NULL OR pg_catalog.length(p_key) OPERATOR(pg_catalog.<) 32
       OR (SELECT pg_catalog.count(DISTINCT c) FROM pg_catalog.regexp_split_to_table(p_key, '') AS c)
          OPERATOR(pg_catalog.<) 12 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_response_key_id: a response key must be a generated secret of at least 32 characters',
            HINT = 'generate one with: python -c ''import secrets; print(secrets.token_urlsafe(32))''';
    END IF;
    RETURN pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        pg_catalog.textcat('idem-response-key:', p_key), 'UTF8')), 'hex'), 8);
END
$$;

COMMENT ON FUNCTION public.idem_response_key_id IS
    'Returns the 8-hex-digit id (kid) of response key p_key: what an encrypted body records, never the '
    'key, so a replay knows which key opens it and a rotation knows what is left. Errors: IDM00 when p_key is NULL, shorter than 32 characters or has fewer than 12 distinct ones.';
