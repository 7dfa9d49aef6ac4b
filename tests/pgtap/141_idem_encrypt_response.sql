-- 141_idem_encrypt_response: a body as the row stores it under a response key.
-- Cases:
--   no key or no body: the body unchanged (encryption off, or nothing to encrypt);
--   with a key: {"idem_enc": "pgp-sym-v1", "kid": <the key's id>, "data": <ASCII-armored
--     pgcrypto message>}, none of the body's text in it; pgcrypto opens it with the key to the
--     same JSON; two encryptions of one body differ (a fresh session key each time);
--   a weak key raises IDM00.
BEGIN;
SELECT plan(8);

CREATE TEMP TABLE enc AS SELECT public.idem_encrypt_response('{"order_id": 4242, "note": "plaintext-marker"}',
                                                            'encrypt-key-0123456789abcdefghijklmn') AS body;

SELECT is(public.idem_encrypt_response('{"a": 1}', NULL), '{"a": 1}'::jsonb, 'no key: the body unchanged');
SELECT is(public.idem_encrypt_response(NULL, 'encrypt-key-0123456789abcdefghijklmn'), NULL, 'no body: NULL');
SELECT is((SELECT array_agg(k ORDER BY k) FROM enc, jsonb_object_keys(body) k), ARRAY['data', 'idem_enc', 'kid'],
    'the stored form has idem_enc, kid and data, nothing else');
SELECT is((SELECT body ->> 'idem_enc' || ' ' || (body ->> 'kid') FROM enc),
    'pgp-sym-v1 ' || public.idem_response_key_id('encrypt-key-0123456789abcdefghijklmn'),
    'marked pgp-sym-v1, with the key''s id');
SELECT ok((SELECT body ->> 'data' LIKE '-----BEGIN PGP MESSAGE-----%' AND body::text NOT LIKE '%plaintext-marker%'
             AND body::text NOT LIKE '%4242%' FROM enc),
    'data is an armored PGP message holding none of the body''s text');
SELECT is((SELECT pgp_sym_decrypt(dearmor(body ->> 'data'), 'encrypt-key-0123456789abcdefghijklmn')::jsonb FROM enc),
    '{"order_id": 4242, "note": "plaintext-marker"}'::jsonb, 'pgcrypto opens it with the key, to the same JSON');
SELECT isnt(public.idem_encrypt_response('{"a": 1}', 'encrypt-key-0123456789abcdefghijklmn') ->> 'data',
    public.idem_encrypt_response('{"a": 1}', 'encrypt-key-0123456789abcdefghijklmn') ->> 'data',
    'two encryptions of one body differ');
SELECT throws_ok($$SELECT public.idem_encrypt_response('{}', 'short')$$, 'IDM00', NULL, 'a weak key raises IDM00');

SELECT * FROM finish();
ROLLBACK;
