-- idem_canonical_key
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- 'uuid' (contract §4b's key rule): only the 36-character UUID form, so keys like 'all' or
-- 'admin' cannot enumerate the key space. 'opaque' (Stripe's bound): a UUID as under 'uuid', so a
-- route that switches formats keeps its keys, else 16 to 255 visible ASCII characters, as sent
-- (case-sensitive): the 16 keep the entropy rule's intent. 'opaque_short': the same from 1
-- character, for a caller that enforces a minimum of its own (the shim's
-- IDEM_OPAQUE_KEY_MIN_LENGTH; the IETF draft sets none). Not '"', '\', ',' nor ';', the
-- characters that give an Idempotency-Key field a structure (RFC 8941: a string, a list,
-- parameters), the shim's rule (fingerprint.OPAQUE_KEY_PATTERN): a header sent twice, which a
-- server joins with a comma, is never one key. Never the nil UUID, which every client
-- that leaves its key unset would share. A SQL-standard expression: its names are resolved when
-- it is created, and idem_claim inlines it (no call on the request path); a refused key raises
-- in idem_refuse_key (005). Pure: reads no table, takes no lock.
CREATE OR REPLACE FUNCTION public.idem_canonical_key(p_key text, p_key_format text DEFAULT 'uuid')
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN CASE WHEN (p_key_format OPERATOR(pg_catalog.=) 'uuid' OR p_key_format OPERATOR(pg_catalog.=) 'opaque'
                  OR p_key_format OPERATOR(pg_catalog.=) 'opaque_short')
                 AND p_key OPERATOR(pg_catalog.~) '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'
                 AND p_key OPERATOR(pg_catalog.<>) '00000000-0000-0000-0000-000000000000'
            THEN pg_catalog.lower(p_key)
            WHEN p_key_format OPERATOR(pg_catalog.=) 'opaque'
                 AND p_key OPERATOR(pg_catalog.~) '^[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]{16,255}$'
                 AND p_key OPERATOR(pg_catalog.!~) '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'
            THEN p_key
            WHEN p_key_format OPERATOR(pg_catalog.=) 'opaque_short'
                 AND p_key OPERATOR(pg_catalog.~) '^[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]{1,255}$'
                 AND p_key OPERATOR(pg_catalog.!~) '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'
            THEN p_key
            ELSE public.idem_refuse_key(p_key, p_key_format) END;

COMMENT ON FUNCTION public.idem_canonical_key IS
    'Returns the canonical form of an Idempotency-Key under p_key_format. ''uuid'' (the default): 8-4-4-4-12 '
    'hexadecimal digits in either case, lower-cased; braces, URNs, unhyphenated hex, the nil UUID (all zeros) and '
    'anything else are refused. ''opaque'': a UUID as under ''uuid'' (lower-cased, so switching formats keeps keys), '
    'else 16 to 255 visible ASCII characters (0x21-0x7E) but a comma, a semicolon, a double quote or a backslash '
    '(what makes an Idempotency-Key field a list, parameters or a string: not one key), returned as sent '
    '(case-sensitive). ''opaque_short'': as ''opaque'' from 1 character, for a caller that enforces a minimum of its '
    'own (the shim''s IDEM_OPAQUE_KEY_MIN_LENGTH). Keys stored under the earlier rule (any visible character) stay valid rows; only a new claim '
    'of one is refused. '
    'Errors: 22023 "Idempotency-Key must be a UUID string" (contract §3; the only 22023 idem raises; its DETAIL says the '
    'format''s rule); IDM00 when p_key_format is not ''uuid'', ''opaque'' or ''opaque_short''.';
