-- idem_credential_name
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The one rule for "this name holds a credential", for body keys at any depth (and in JSON texts
-- held by string values), the fields of raw text bodies (forms, .env, YAML, JSON lines), header
-- names and the query parameters of header values (idem_complete). Names are split into words
-- first (camelCase, snake_case, kebab-case), so accessToken, client_secret, password_hash and
-- X-Api-Key are caught and tokens_used, secretary or checkout_session_id are not; a word in the
-- plural or with a counter is the same word (access_tokens, apiKeys, password2, secret_v2), but
-- a count of tokens is no token (max_tokens, prompt_tokens: a language model's usage); a
-- percent-encoded name (a form field's, a URL parameter's: access%5Ftoken) is decoded first.
-- Pure: no table, no lock. A SQL-standard expression: its names are resolved when it is created.
CREATE OR REPLACE FUNCTION public.idem_credential_name(p_name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN pg_catalog.regexp_replace(
               pg_catalog.lower(pg_catalog.regexp_replace(
                   CASE WHEN p_name OPERATOR(pg_catalog.~) '%[0-9A-Fa-f][0-9A-Fa-f]' THEN
                       (SELECT pg_catalog.string_agg(CASE WHEN m.part[1] IS NULL THEN m.part[2]
                                                          WHEN m.part[1] OPERATOR(pg_catalog.=) '00' THEN '_'
                                                          ELSE pg_catalog.chr(('x' OPERATOR(pg_catalog.||) m.part[1])::bit(8)::integer) END,
                                                     '' ORDER BY m.n)
                          FROM pg_catalog.regexp_matches(p_name, '%([0-9A-Fa-f][0-9A-Fa-f])|([^%]+|%)', 'g')
                               WITH ORDINALITY AS m(part, n))
                   ELSE p_name END,
                   '([a-z0-9])([A-Z])', E'\\1_\\2', 'g')),
               '[^a-z0-9]+', '_', 'g')
           OPERATOR(pg_catalog.~)
           -- the last word names what the value is (access_token, clientSecret; not token_count),
           -- in the plural or with a counter (api_keys, password2, client_secret_v2); a password's
           -- anything is one (password_hash); so are the key pairs, a bare session id, and HTTP's
           -- authentication headers (an X- prefix is no word of the name)
           '(^|_)(password|passwd|pwd|passphrase|secret|apikey|authorization|cookie|bearer|credential|csrf|xsrf)s?(_?v?[0-9]+)?_?$'
           '|^(?!.*(^|_)(max|total|prompt|completion|input|output|cached|reasoning|num)_tokens?(_?v?[0-9]+)?_?$).*(^|_)tokens?(_?v?[0-9]+)?_?$'
           '|^_?(x_)?(password|passwd|passphrase)s?([0-9]|_|$)'
           '|(^|_)(api|private|access|secret|signing)_keys?([0-9]|_|$)'
           '|^_?(x_)?session_?(id|key|token)s?_?$|^_?x_(auth|session)_?$'
           '|^_?(www|proxy)_authenticate_?$|^_?(proxy_)?authentication_info_?$';

COMMENT ON FUNCTION public.idem_credential_name IS
    'Whether p_name names a credential: after splitting it into words (camelCase, _, -, .), its last word is '
    'password, passwd, pwd, passphrase, secret, token, apikey, authorization, cookie, bearer, credential, '
    'csrf or xsrf (or one of them in the plural or with a counter: access_tokens, password2, secret_v2; not a '
    'count such as max_tokens), or its first word is password/passwd/passphrase, or two words are '
    'api/private/access/secret/signing key(s), or the whole name is session id, key or token (X-Session-Id), X-Auth, '
    'X-Session, WWW-/Proxy-Authenticate or (Proxy-)Authentication-Info; percent-encodings (%5F) are decoded first. '
    'So accessToken, clientSecret, password_hash, X-Api-Key, apiKeys and session_id are credentials; token_count, '
    'tokens_used, total_tokens, secretary and checkout_session_id are not. idem_complete refuses a response that '
    'holds one (IDM04). Errors: none.';
