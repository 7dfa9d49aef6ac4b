-- 011_idem_canonical_key: what counts as an Idempotency-Key (contract §2, §3 "Errors").
-- Cases:
--   a lower-case hyphenated UUID is returned unchanged;
--   upper-case and mixed-case forms canonicalise to the same lower-case text;
--   every other shape raises 22023 'Idempotency-Key must be a UUID string':
--     NULL, empty, 'all', 'admin', 37 and 35 characters, a SQL fragment, non-ASCII look-alikes
--     (full-width digit, Unicode hyphen, accented letter), braces, the urn:uuid: form, no hyphens,
--     the IETF quoted form (the shim strips the quotes, not the database), surrounding white
--     space, a trailing newline, a non-hex letter, an embedded NUL-like escape.
--   p_key_format => 'uuid' is the default, said or not; 'opaque' (Stripe's keys):
--     16 and 255 visible ASCII characters are keys, returned as sent (case-sensitive, '!' and '~'
--     the ends of the range); a UUID is still lower-cased (switching formats keeps keys) and the
--     nil UUID still refused; 15 and 256 characters, a space, a tab, a non-ASCII letter, NULL
--     and the empty key raise the same 22023; so do a comma (a header sent twice, joined by the
--     server), a double quote, a semicolon and a backslash (RFC 8941's structure: not one key),
--     while the visible characters beside them ('!', '#', '+', '-', ':', '<', '[', ']', '~') are
--     keys; an unknown or NULL format raises IDM00.
--   'opaque_short' (a caller's own minimum below 16): 1 and 255 characters are keys, as sent; a
--     UUID is still lower-cased; the empty key, 256 characters, a comma, a space and the nil
--     UUID raise 22023; a short key stores (the CHECK on idem_key admits it).
BEGIN;
SELECT plan(54);

SELECT is(public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b'),
    '0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b',
    'a canonical lower-case UUID comes back unchanged');
SELECT is(public.idem_canonical_key('0B6F2B1E-3C4D-4E5F-8A9B-0C1D2E3F4A5B'),
    '0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b',
    'an upper-case UUID canonicalises to lower case');
SELECT is(public.idem_canonical_key('0b6F2b1E-3c4D-4e5F-8A9b-0C1d2E3f4A5b'),
    public.idem_canonical_key('0B6F2B1E-3C4D-4E5F-8A9B-0C1D2E3F4A5B'),
    'mixed-case and upper-case spellings of one UUID are the same key');
SELECT throws_ok($$SELECT public.idem_canonical_key('00000000-0000-0000-0000-000000000000')$$,
    '22023', 'Idempotency-Key must be a UUID string',
    'the nil UUID is refused: a placeholder every unset client would share, not a key');

SELECT throws_ok($$SELECT public.idem_canonical_key(NULL)$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a NULL key is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'an empty key is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('all')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'the key ''all'' is rejected (no enumerable keys)');
SELECT throws_ok($$SELECT public.idem_canonical_key('admin')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'the key ''admin'' is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5ba')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a 37-character key (one extra hex digit) is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a 35-character key (one digit short) is rejected');
SELECT throws_ok($q$SELECT public.idem_canonical_key($$'; DROP TABLE idempotency_keys; --$$)$q$,
    '22023', 'Idempotency-Key must be a UUID string', 'a SQL fragment is rejected as data, never executed');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5' || chr(65296))$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a full-width digit (non-ASCII) is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e' || chr(8208) || '3c4d-4e5f-8a9b-0c1d2e3f4a5b')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a Unicode hyphen (U+2010) is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4aé')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'an accented letter is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('{0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a UUID in braces is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('urn:uuid:0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'the urn:uuid: form is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e3c4d4e5f8a9b0c1d2e3f4a5b')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a UUID without hyphens is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('"0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b"')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'the IETF quoted form is rejected here: the shim strips the quotes');
SELECT throws_ok($$SELECT public.idem_canonical_key(' 0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a leading space is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b ')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a trailing space is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key(E'0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b\n')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a trailing newline is rejected ($ anchors at the very end)');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5g')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a non-hex letter is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key('0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b' || repeat('0', 10000))$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a very long key starting with a UUID is rejected');
SELECT throws_ok($$SELECT public.idem_canonical_key(E'0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b\\x00')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a UUID followed by an escape sequence is rejected');

-- p_key_format ------------------------------------------------------------------------------
SELECT is(public.idem_canonical_key('0B6F2B1E-3C4D-4E5F-8A9B-0C1D2E3F4A5B', p_key_format => 'uuid'),
    '0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b', 'p_key_format => ''uuid'' is the default rule, said out loud');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh', p_key_format => 'uuid')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'an opaque key is refused under ''uuid''');
SELECT is(public.idem_canonical_key('Order-123-ABCDEFgh', p_key_format => 'opaque'), 'Order-123-ABCDEFgh',
    'under ''opaque'' a key of visible ASCII comes back as sent, case kept');
SELECT isnt(public.idem_canonical_key('order-123-abcdefgh', p_key_format => 'opaque'),
    public.idem_canonical_key('ORDER-123-ABCDEFGH', p_key_format => 'opaque'),
    'opaque keys are case-sensitive: two spellings are two keys');
SELECT is(public.idem_canonical_key(repeat('k', 16), p_key_format => 'opaque'), repeat('k', 16),
    '16 characters is the shortest opaque key (the entropy rule''s intent)');
SELECT is(public.idem_canonical_key(repeat('k', 255), p_key_format => 'opaque'), repeat('k', 255),
    '255 characters is the longest opaque key (Stripe''s bound)');
SELECT is(public.idem_canonical_key('!' || repeat('x', 14) || '~', p_key_format => 'opaque'), '!' || repeat('x', 14) || '~',
    '! (0x21) and ~ (0x7E) are the ends of the visible range');
SELECT is(public.idem_canonical_key('0B6F2B1E-3C4D-4E5F-8A9B-0C1D2E3F4A5B', p_key_format => 'opaque'),
    '0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b', 'a UUID under ''opaque'' is lower-cased as under ''uuid'': switching keeps keys');
SELECT throws_ok($$SELECT public.idem_canonical_key('00000000-0000-0000-0000-000000000000', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'the nil UUID stays refused under ''opaque''');
SELECT throws_ok($$SELECT public.idem_canonical_key(repeat('k', 15), p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', '15 characters is too short an opaque key');
SELECT throws_ok($$SELECT public.idem_canonical_key(repeat('k', 256), p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', '256 characters is too long an opaque key');
SELECT throws_ok($$SELECT public.idem_canonical_key('order 123 abcdefgh', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a space (0x20) is not a visible character');
SELECT throws_ok($$SELECT public.idem_canonical_key(E'order\t123\tabcdefgh', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a tab is not a visible character');
SELECT throws_ok($$SELECT public.idem_canonical_key('commande-numéro-12345', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a non-ASCII letter is refused');
SELECT throws_ok($$SELECT public.idem_canonical_key(NULL, p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a NULL key is refused under ''opaque''');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh,order-123-abcdefgh', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a comma is refused: the header sent twice, as a server joins it');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh"', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a double quote is refused (a structured-field string)');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh;a=1', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a semicolon is refused (structured-field parameters)');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh\x', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a backslash is refused (a structured-field escape)');
SELECT is(public.idem_canonical_key('!#+-:<[]~' || repeat('x', 7), p_key_format => 'opaque'), '!#+-:<[]~' || repeat('x', 7),
    'the visible characters beside the four refused ones are key characters');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh', p_key_format => 'stripe')$$,
    'IDM00', NULL, 'an unknown format is a bad argument (IDM00), not a malformed key');
SELECT throws_ok($$SELECT public.idem_canonical_key('order-123-abcdefgh', p_key_format => NULL)$$,
    'IDM00', NULL, 'a NULL format is a bad argument (IDM00)');

SELECT is(public.idem_canonical_key('k', p_key_format => 'opaque_short'), 'k',
    'under ''opaque_short'' a one-character key is a key, as sent');
SELECT is(public.idem_canonical_key(repeat('Z', 255), p_key_format => 'opaque_short'), repeat('Z', 255),
    'under ''opaque_short'' 255 characters are a key');
SELECT is(public.idem_canonical_key('0B6F2B1E-3C4D-4E5F-8A9B-0C1D2E3F4A5B', p_key_format => 'opaque_short'),
    '0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b',
    'under ''opaque_short'' a UUID is still lower-cased (the same key under every format)');
SELECT throws_ok($$SELECT public.idem_canonical_key('', p_key_format => 'opaque_short')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'under ''opaque_short'' the empty key is refused');
SELECT throws_ok($$SELECT public.idem_canonical_key(repeat('x', 256), p_key_format => 'opaque_short')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'under ''opaque_short'' 256 characters are refused');
SELECT throws_ok($$SELECT public.idem_canonical_key('a,b', p_key_format => 'opaque_short')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'under ''opaque_short'' a comma is refused (not one key)');
SELECT throws_ok($$SELECT public.idem_canonical_key('00000000-0000-0000-0000-000000000000', p_key_format => 'opaque_short')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'under ''opaque_short'' the nil UUID is refused');
SELECT is((public.idem_claim('k-1', NULL, 'POST /t', '{}'::jsonb, p_key_format => 'opaque_short')).outcome,
    'claimed', 'a short opaque key is claimed and stored (the CHECK on idem_key admits it)');

SELECT * FROM finish();
ROLLBACK;
