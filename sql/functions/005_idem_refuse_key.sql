-- idem_refuse_key
-- The refusal of a key that idem_canonical_key does not accept, in its own routine so that the
-- rule itself is a SQL-standard expression that the request path inlines (no call) and only a
-- refused key pays for PL/pgSQL. Raises, always; reads nothing, locks nothing.
CREATE OR REPLACE FUNCTION public.idem_refuse_key(p_key text, p_key_format text DEFAULT 'uuid')
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: a format that is neither is the caller's mistake, not the client's key
    IF p_key_format IS NULL OR p_key_format NOT IN ('uuid', 'opaque', 'opaque_short') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_refuse_key: p_key_format must be ''uuid'', ''opaque'' or ''opaque_short'' (got %L)', p_key_format),
            HINT    = 'p_key_format is the key rule of idem_claim, idem_downstream_key, idem_inspect and idem_canonical_key; '
                      'leave it out for ''uuid''';
    END IF;
    -- GUARD: the nil UUID is a placeholder, not a key: every client that sends it unset would
    -- share one key per user and endpoint, and get another request's answer.
    IF p_key = '00000000-0000-0000-0000-000000000000' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'Idempotency-Key must be a UUID string',
            DETAIL  = 'the nil UUID (all zeros) is a placeholder, not a key: generate a random (version 4) UUID per request';
    END IF;
    -- The message is the contract's for either format (a client branches on it); the detail says the rule.
    IF p_key_format IN ('opaque', 'opaque_short') THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'Idempotency-Key must be a UUID string',
            DETAIL  = pg_catalog.format('with p_key_format %L a key is a UUID or %s to 255 visible ASCII '
                                        'characters (0x21-0x7E, no space), no comma, semicolon, double quote '
                                        'or backslash (one key, not a list); got %s',
                                        p_key_format,
                                        CASE WHEN p_key_format = 'opaque' THEN '16' ELSE '1' END,
                                        CASE WHEN p_key IS NULL THEN 'no key'
                                             ELSE pg_catalog.length(p_key)::text || ' characters' END);
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = '22023',
        MESSAGE = 'Idempotency-Key must be a UUID string',
        DETAIL  = 'expected 8-4-4-4-12 hexadecimal digits, e.g. 0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b';
END
$$;

COMMENT ON FUNCTION public.idem_refuse_key IS
    'Raises the contract''s 22023 "Idempotency-Key must be a UUID string" for p_key, a key idem_canonical_key refused '
    'under p_key_format (its DETAIL says whether it is the nil UUID, not 8-4-4-4-12 hexadecimal digits, or, with '
    '''opaque'', outside 16 to 255 visible ASCII characters (1 to 255 with ''opaque_short'') or holding a comma, a semicolon, a double quote or a '
    'backslash); never returns. Internal to idem_canonical_key. '
    'Errors: 22023, always; IDM00 when p_key_format is not ''uuid'', ''opaque'' or ''opaque_short''.';
