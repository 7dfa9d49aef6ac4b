-- idem_canonical_key
-- Only the 36-character UUID form: keys like 'all' or 'admin' would let a client enumerate
-- the key space (ADR-0138, key entropy); never the nil UUID, which every client that leaves its
-- key unset would share. A SQL-standard expression: its names are resolved when it is created,
-- and idem_claim inlines it (no call on the request path); a refused key raises in
-- idem_refuse_key (005). Pure: reads no table, takes no lock.
CREATE OR REPLACE FUNCTION public.idem_canonical_key(p_key text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN CASE WHEN p_key OPERATOR(pg_catalog.~) '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'
                 AND p_key OPERATOR(pg_catalog.<>) '00000000-0000-0000-0000-000000000000'
            THEN pg_catalog.lower(p_key)
            ELSE public.idem_refuse_key(p_key) END;

COMMENT ON FUNCTION public.idem_canonical_key IS
    'Returns the canonical (lower-case, hyphenated) form of an Idempotency-Key: 8-4-4-4-12 hexadecimal '
    'digits in either case; braces, URNs, unhyphenated hex, the nil UUID (all zeros) and anything else are refused. '
    'Errors: 22023 "Idempotency-Key must be a UUID string" (SPEC; the only 22023 idem raises).';
