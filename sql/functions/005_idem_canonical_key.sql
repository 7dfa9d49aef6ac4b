-- idem_canonical_key
-- Only the 36-character UUID form: keys like 'all' or 'admin' would let a client enumerate
-- the key space (ADR-0138, key entropy). Pure: reads no table, takes no lock.
CREATE OR REPLACE FUNCTION public.idem_canonical_key(p_key text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    -- GUARD: anything but a hyphenated UUID, in either case. The operator is qualified: with
    -- no SET clause here, the caller's search_path would otherwise pick it.
    IF p_key IS NULL
       OR p_key OPERATOR(pg_catalog.!~) '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'Idempotency-Key must be a UUID string',
            DETAIL  = 'expected 8-4-4-4-12 hexadecimal digits, e.g. 0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b';
    END IF;
    -- GUARD: the nil UUID is a placeholder, not a key: every client that sends it unset would
    -- share one key per user and endpoint, and get another request's answer.
    IF p_key OPERATOR(pg_catalog.=) '00000000-0000-0000-0000-000000000000' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'Idempotency-Key must be a UUID string',
            DETAIL  = 'the nil UUID (all zeros) is a placeholder, not a key: generate a random (version 4) UUID per request';
    END IF;
    RETURN pg_catalog.lower(p_key);
END
$$;

COMMENT ON FUNCTION public.idem_canonical_key IS
    'Returns the canonical (lower-case, hyphenated) form of an Idempotency-Key: 8-4-4-4-12 hexadecimal '
    'digits in either case; braces, URNs, unhyphenated hex, the nil UUID (all zeros) and anything else are refused. '
    'Errors: 22023 "Idempotency-Key must be a UUID string" (SPEC; the only 22023 idem raises).';
