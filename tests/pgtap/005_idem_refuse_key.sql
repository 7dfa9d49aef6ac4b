-- 005_idem_refuse_key: the refusal behind idem_canonical_key (011), which inlines the key rule
-- and calls this only for a key it refuses.
-- Cases:
--   it always raises the contract's 22023 'Idempotency-Key must be a UUID string', whatever it is given;
--   its DETAIL tells the nil UUID from a key of the wrong shape, and under 'opaque' gives that rule
--     (and the key's length, never the key);
--   under 'opaque_short' the DETAIL gives the rule from 1 character;
--   an unknown p_key_format is IDM00, naming the argument;
--   idem_canonical_key is a SQL-standard body built on it: inlined (no SET clause, no definer)
--     and resolving nothing at call time.
BEGIN;
SELECT plan(9);

SELECT throws_ok($$SELECT public.idem_refuse_key('admin')$$, '22023', 'Idempotency-Key must be a UUID string',
    'a key of the wrong shape raises 22023 with the contract''s message');
SELECT throws_ok($$SELECT public.idem_refuse_key(NULL)$$, '22023', 'Idempotency-Key must be a UUID string',
    'so does a NULL key');
CREATE FUNCTION pg_temp.detail(p_key text, p_format text DEFAULT 'uuid') RETURNS text LANGUAGE plpgsql AS $$
DECLARE v text;
BEGIN
    PERFORM public.idem_refuse_key(p_key, p_format);
    RETURN 'no error';
EXCEPTION WHEN invalid_parameter_value THEN
    GET STACKED DIAGNOSTICS v = PG_EXCEPTION_DETAIL;
    RETURN v;
END $$;
SELECT matches(pg_temp.detail('00000000-0000-0000-0000-000000000000'), 'nil UUID',
    'the DETAIL names the nil UUID a placeholder');
SELECT matches(pg_temp.detail('all'), '8-4-4-4-12 hexadecimal digits', 'the DETAIL of any other key gives the shape');
SELECT is(pg_temp.detail('short-key', 'opaque'),
    'with p_key_format ''opaque'' a key is a UUID or 16 to 255 visible ASCII characters (0x21-0x7E, no space), '
    'no comma, semicolon, double quote or backslash (one key, not a list); got 9 characters',
    'under ''opaque'' the DETAIL gives the opaque rule and the key''s length, not the key');
SELECT is(pg_temp.detail('', 'opaque_short'),
    'with p_key_format ''opaque_short'' a key is a UUID or 1 to 255 visible ASCII characters (0x21-0x7E, no space), '
    'no comma, semicolon, double quote or backslash (one key, not a list); got 0 characters',
    'under ''opaque_short'' the DETAIL gives its rule, from 1 character');
SELECT throws_ok($$SELECT public.idem_refuse_key('short-key', 'opaque')$$, '22023', 'Idempotency-Key must be a UUID string',
    'under ''opaque'' the SQLSTATE and message are the contract''s, so the shim''s 400 is the same');
SELECT throws_ok($$SELECT public.idem_refuse_key('k', 'ulid')$$, 'IDM00',
    'idem_refuse_key: p_key_format must be ''uuid'', ''opaque'' or ''opaque_short'' (got ''ulid'')', 'an unknown format names the argument');
SELECT ok((SELECT p.prosqlbody IS NOT NULL AND p.proconfig IS NULL AND NOT p.prosecdef
             FROM pg_catalog.pg_proc p WHERE p.oid = 'public.idem_canonical_key'::regproc),
    'idem_canonical_key is a SQL-standard body without SET or SECURITY DEFINER, so its callers inline it');

SELECT * FROM finish();
ROLLBACK;
