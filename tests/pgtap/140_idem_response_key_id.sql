-- 140_idem_response_key_id: the id (kid) an encrypted body records instead of its key.
-- Cases:
--   eight hex digits: the first of sha256('idem-response-key:' || key); the same key gives the
--     same kid, another key another;
--   a key of 32 characters with 12 distinct ones is accepted; NULL, 31 characters, or 32 with
--     fewer than 12 distinct characters raise IDM00, and the message never shows the key;
--   it is IMMUTABLE (a pure function of its argument).
BEGIN;
SELECT plan(9);

SELECT matches(public.idem_response_key_id('kid-key-0123456789abcdefghijklmnopq'), '^[0-9a-f]{8}$', 'a kid is eight hex digits');
SELECT is(public.idem_response_key_id('kid-key-0123456789abcdefghijklmnopq'),
    left(encode(sha256(convert_to('idem-response-key:kid-key-0123456789abcdefghijklmnopq', 'UTF8')), 'hex'), 8),
    'the first eight hex digits of the key''s sha256, salted with idem-response-key:');
SELECT is(public.idem_response_key_id('kid-key-0123456789abcdefghijklmnopq'),
    public.idem_response_key_id('kid-key-0123456789abcdefghijklmnopq'), 'the same key gives the same kid');
SELECT isnt(public.idem_response_key_id('kid-key-0123456789abcdefghijklmnopq'),
    public.idem_response_key_id('kid-key-0123456789abcdefghijklmnopr'), 'another key gives another kid');
SELECT lives_ok($$SELECT public.idem_response_key_id('abcdefghijkl' || repeat('a', 20))$$,
    '32 characters, 12 of them distinct: accepted');
SELECT throws_ok($$SELECT public.idem_response_key_id(NULL)$$, 'IDM00',
    'idem_response_key_id: a response key must be a generated secret of at least 32 characters', 'NULL raises IDM00');
SELECT throws_ok($$SELECT public.idem_response_key_id('abcdefghijkl' || repeat('a', 19))$$, 'IDM00',
    'idem_response_key_id: a response key must be a generated secret of at least 32 characters',
    '31 characters raise IDM00, and the message does not show the key');
SELECT throws_ok($$SELECT public.idem_response_key_id('abcdefghijk' || repeat('a', 21))$$, 'IDM00', NULL,
    '32 characters with only 11 distinct raise IDM00 (a passphrase, not a generated secret)');
SELECT volatility_is('public', 'idem_response_key_id', ARRAY['text'], 'immutable', 'it is IMMUTABLE');

SELECT * FROM finish();
ROLLBACK;
