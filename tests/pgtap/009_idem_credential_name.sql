-- 009_idem_credential_name: the one rule for "this name holds a credential".
-- Cases:
--   credentials after splitting into words (camelCase, _, -, .): a last word password, secret,
--     token, cookie, authorization, csrf...; a first word password; api/private/access key; a
--     bare session id/key/token;
--   not credentials: a counter or a use of such a word that is not its last (token_count,
--     tokens_used), a longer word (secretary), a session id of something else;
--   NULL gives NULL; it is IMMUTABLE.
BEGIN;
SELECT plan(5);

SELECT is(array_agg(n ORDER BY n) FILTER (WHERE NOT public.idem_credential_name(n)), NULL,
    'credential names are recognised: ' || string_agg(n, ', ' ORDER BY n))
  FROM unnest(ARRAY['password', 'accessToken', 'clientSecret', 'password_hash', 'X-Api-Key', 'session_id',
                    'Authorization', 'Set-Cookie', 'csrf_token', 'refresh.token', 'private_key', 'api_key',
                    'PASSWD', 'user-credentials']) n;
SELECT is(array_agg(n ORDER BY n) FILTER (WHERE public.idem_credential_name(n)), NULL,
    'other names are not: ' || string_agg(n, ', ' ORDER BY n))
  FROM unnest(ARRAY['token_count', 'tokens_used', 'secretary', 'checkout_session_id', 'order_id', 'key',
                    'Location', 'keyboard', 'author']) n;
SELECT ok(public.idem_credential_name('sessionToken') AND NOT public.idem_credential_name('sessionTokenCount'),
    'camelCase is split into words: the last word decides');
SELECT is(public.idem_credential_name(NULL), NULL, 'NULL gives NULL');
SELECT volatility_is('public', 'idem_credential_name', ARRAY['text'], 'immutable', 'it is IMMUTABLE');

SELECT * FROM finish();
ROLLBACK;
