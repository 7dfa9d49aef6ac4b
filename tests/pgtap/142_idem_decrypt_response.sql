-- 142_idem_decrypt_response: a stored body back in clear, or an error rather than ciphertext.
-- Cases:
--   a body that is not encrypted (plain object, array, NULL, another idem_enc marker): unchanged,
--     with or without keys;
--   encrypted under K: opened with p_key = K, or with p_fallback_key = K (a rotation);
--   neither key is K, or no key at all: IDM03 naming the kid (never a key); a weak key given:
--     IDM00; data that does not open under the right kid (altered): IDM03 "does not decrypt".
BEGIN;
SELECT plan(10);

CREATE TEMP TABLE enc AS SELECT public.idem_encrypt_response('{"order_id": 9}', 'decrypt-key-k-0123456789abcdefghijklm') AS body;

SELECT is(public.idem_decrypt_response('{"order_id": 9}', 'decrypt-key-k-0123456789abcdefghijklm'), '{"order_id": 9}'::jsonb,
    'a plain object is returned unchanged');
SELECT is(public.idem_decrypt_response('[1, 2]', NULL), '[1, 2]'::jsonb, 'a JSON array is returned unchanged, without a key');
SELECT is(public.idem_decrypt_response(NULL, NULL), NULL, 'no body: NULL');
SELECT is(public.idem_decrypt_response('{"idem_enc": "other", "data": "x"}', NULL), '{"idem_enc": "other", "data": "x"}'::jsonb,
    'another marker is not ours: unchanged');
SELECT is(public.idem_decrypt_response((SELECT body FROM enc), 'decrypt-key-k-0123456789abcdefghijklm'), '{"order_id": 9}'::jsonb,
    'opened with its key');
SELECT is(public.idem_decrypt_response((SELECT body FROM enc), 'decrypt-key-new-0123456789abcdefghijk',
                                       'decrypt-key-k-0123456789abcdefghijklm'), '{"order_id": 9}'::jsonb,
    'opened with the fallback key when the current one is another');
SELECT throws_ok(format('SELECT public.idem_decrypt_response(%L, %L)', (SELECT body FROM enc), 'decrypt-key-new-0123456789abcdefghijk'),
    'IDM03', format('idem_decrypt_response: the stored response is encrypted under key id %s, which was not given',
                    public.idem_response_key_id('decrypt-key-k-0123456789abcdefghijklm')),
    'under a key that was not given: IDM03 naming the kid');
SELECT throws_ok(format('SELECT public.idem_decrypt_response(%L, NULL)', (SELECT body FROM enc)), 'IDM03', NULL,
    'no key at all: IDM03, never ciphertext');
SELECT throws_ok(format('SELECT public.idem_decrypt_response(%L, %L)', (SELECT body FROM enc), 'weak'), 'IDM00', NULL,
    'a weak key raises IDM00');
SELECT throws_ok(format('SELECT public.idem_decrypt_response(%L, %L)',
                        jsonb_set((SELECT body FROM enc), '{data}', to_jsonb(armor('not a pgp message'::bytea))),
                        'decrypt-key-k-0123456789abcdefghijklm'),
    'IDM03', format('idem_decrypt_response: the stored response under key id %s does not decrypt',
                    public.idem_response_key_id('decrypt-key-k-0123456789abcdefghijklm')),
    'altered data under the right kid: IDM03, does not decrypt');

SELECT * FROM finish();
ROLLBACK;
