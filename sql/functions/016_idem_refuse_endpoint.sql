-- idem_refuse_endpoint
-- An endpoint scope is a name from code (a route's "METHOD /rule", a declared scope=), stored in
-- every row and exported as a metric label: no longer than 200 characters (the shim's
-- MAX_SCOPE_LENGTH) and no control character (C0, DEL, C1, the line and paragraph separators
-- U+2028/U+2029, the bidirectional overrides U+202A-U+202E and isolates U+2066-U+2069). Each
-- routine that takes p_endpoint tests that inline, after its NULL check:
--   IF pg_catalog.length(p_endpoint) > 200
--      OR p_endpoint ~ E'[\\x01-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]' THEN
--       PERFORM public.idem_refuse_endpoint('<routine>', p_endpoint);
--   END IF;
-- A bad argument of the caller's (IDM00, as an empty one), never the client's key (22023).
-- This is the refusal, in its own routine so that only a refused call pays for it. Raises,
-- always; reads nothing.
CREATE OR REPLACE FUNCTION public.idem_refuse_endpoint(p_routine text, p_endpoint text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_char text;
BEGIN
    IF pg_catalog.length(p_endpoint) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('%s: p_endpoint must be at most 200 characters (got %s)', p_routine,
                                        pg_catalog.length(p_endpoint)),
            HINT    = 'an endpoint scope is a route''s "METHOD /rule" or a declared scope name, as the shim sends it';
    END IF;
    v_char := pg_catalog.substring(p_endpoint, E'[\\x01-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]');
    RAISE EXCEPTION USING
        ERRCODE = 'IDM00',
        MESSAGE = pg_catalog.format('%s: p_endpoint must not contain control characters', p_routine),
        DETAIL  = pg_catalog.format('found U+%s at character %s',
                                    pg_catalog.upper(pg_catalog.lpad(pg_catalog.to_hex(pg_catalog.ascii(v_char)), 4, '0')),
                                    pg_catalog.strpos(p_endpoint, v_char)),
        HINT    = 'an endpoint scope is a route''s "METHOD /rule" or a declared scope name, as the shim sends it';
END
$$;

COMMENT ON FUNCTION public.idem_refuse_endpoint IS
    'Raises IDM00 "<p_routine>: p_endpoint must be at most 200 characters (got N)", or "<p_routine>: p_endpoint '
    'must not contain control characters" (DETAIL: which one, where: C0, DEL, C1, U+2028/U+2029, U+202A-U+202E, '
    'U+2066-U+2069): the refusal of an endpoint scope the shim would never send, called by idem_claim, '
    'idem_downstream_key and idem_record_lost_claim before they write anything. Internal: no role may execute it. '
    'Errors: IDM00, always (a bad argument, as an empty p_endpoint is: never a client''s key, so never the contract''s 22023).';
