-- idem_refuse_key
-- The refusal of a key that idem_canonical_key does not accept, in its own routine so that the
-- rule itself is a SQL-standard expression that the request path inlines (no call) and only a
-- refused key pays for PL/pgSQL. Raises, always; reads nothing, locks nothing.
CREATE OR REPLACE FUNCTION public.idem_refuse_key(p_key text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: the nil UUID is a placeholder, not a key: every client that sends it unset would
    -- share one key per user and endpoint, and get another request's answer.
    IF p_key = '00000000-0000-0000-0000-000000000000' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'Idempotency-Key must be a UUID string',
            DETAIL  = 'the nil UUID (all zeros) is a placeholder, not a key: generate a random (version 4) UUID per request';
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = '22023',
        MESSAGE = 'Idempotency-Key must be a UUID string',
        DETAIL  = 'expected 8-4-4-4-12 hexadecimal digits, e.g. 0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b';
END
$$;

COMMENT ON FUNCTION public.idem_refuse_key IS
    'Raises SPEC''s 22023 "Idempotency-Key must be a UUID string" for p_key, a key idem_canonical_key refused '
    '(its DETAIL says whether it is the nil UUID or not 8-4-4-4-12 hexadecimal digits); never returns. '
    'Internal to idem_canonical_key. Errors: 22023, always.';
