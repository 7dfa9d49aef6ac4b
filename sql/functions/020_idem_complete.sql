-- idem_complete
-- Runs inside the handler's own transaction, so the business writes and the completion
-- commit together, and a zombie whose claim was healed (IDM01) takes its writes down with
-- it. Locks the one row it updates until the caller commits.
CREATE OR REPLACE FUNCTION public.idem_complete(
    p_key_id            bigint,
    p_response_code     integer,
    p_response_body     jsonb,
    p_response_key      text  DEFAULT NULL,
    p_response_headers  jsonb DEFAULT NULL,
    p_claim_token       text  DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_claim_token) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_complete', pg_catalog.pg_collation_for(p_claim_token));
    v_checked     jsonb := p_response_body;
    v_raw         text;
    v_bytes       bytea;
    v_docs        jsonb;
    v_next        jsonb;
    v_name        text;
    v_value       jsonb;
    v_urls        text;           -- the body's and headers' text, for the URL screen
    v_body        jsonb;
    v_headers     jsonb;
    v_claimed_at  timestamptz := public.idem_token_claimed_at(p_claim_token);
    v_token       text;
    -- a name that holds none of these (order_id) is no credential: a cheap test before the rule
    -- (idem_credential_name), and the raw text screen's first look
    v_words       CONSTANT text := '(passw|passphrase|pwd|secret|token|auth|cookie|bearer|credential|csrf|xsrf|session|key|%[0-9a-f][0-9a-f])';
BEGIN
    -- GUARD: only the holder of the claim's token completes it (IDM01; IDM00 without one)
    -- (the right token costs one hash, and the statement below matches the claim time it names;
    -- only a missing or wrong one pays for the check's words, and then acts by key_id alone).
    -- idem_claim_token's query with its formula inlined: this statement keeps its plan across calls
    -- (the comparison is idem_token_fits's, 018, on the token hashed here: a measured lever).
    SELECT public.idem_token_hash(s.secret, p_key_id, v_claimed_at) INTO v_token FROM public.idem_secret s;
    IF p_claim_token IS NULL OR p_claim_token IS DISTINCT FROM v_token THEN
        PERFORM public.idem_check_token('idem_complete', p_key_id, p_claim_token);
        v_claimed_at := NULL;
    END IF;

    -- GUARD: a response code must be an HTTP status
    IF p_response_code IS NULL OR p_response_code NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_complete: p_response_code must be an HTTP status 100..599 (got %s)', p_response_code);
    END IF;

    -- GUARD: a body that is not a JSON object is stored as its bytes, {"idem_raw": "text", "data":
    -- <text>} or {"idem_raw": "base64", "data": <base64>}, and replays byte for byte. Bytes that
    -- are UTF-8 text are screened as that text; other bytes through their escape form (non-ASCII
    -- bytes as \nnn), where ASCII names still show, and a JSON key ("name":) counts anywhere. A
    -- text that is one JSON value (after a byte order mark, too) or JSON lines is walked like a
    -- JSON body; any other text by its fields: a name at the start of a line or after & or ;,
    -- then = or : (a form, a .env file with comments, YAML). Prose ("token expired; sign in")
    -- has none, and stays stored. A cheap regex for the rule's words comes first.
    IF pg_catalog.jsonb_typeof(p_response_body) = 'object' AND p_response_body ? 'idem_raw' THEN
        IF (p_response_body ->> 'idem_raw') IS NULL OR (p_response_body ->> 'idem_raw') NOT IN ('text', 'base64')
           OR pg_catalog.jsonb_typeof(p_response_body -> 'data') IS DISTINCT FROM 'string'
           OR (SELECT pg_catalog.count(*) FROM pg_catalog.jsonb_object_keys(p_response_body)) <> 2 THEN
            RAISE EXCEPTION USING ERRCODE = 'IDM00',
                MESSAGE = 'idem_complete: a raw response body must be {"idem_raw": "text" or "base64", "data": <string>}';
        END IF;
        v_checked := NULL;
        v_raw := p_response_body ->> 'data';
        IF (p_response_body ->> 'idem_raw') = 'base64' THEN
            BEGIN
                v_bytes := pg_catalog.decode(v_raw, 'base64');
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION USING ERRCODE = 'IDM00',
                    MESSAGE = 'idem_complete: a base64 raw response body must hold base64 data';
            END;
            v_raw := pg_catalog.encode(v_bytes, 'escape');
        END IF;
        IF v_raw OPERATOR(pg_catalog.~*) v_words THEN
            IF v_bytes IS NOT NULL THEN
                BEGIN
                    v_raw := pg_catalog.convert_from(v_bytes, 'UTF8');
                    v_bytes := NULL;  -- text after all
                EXCEPTION WHEN data_exception THEN
                    NULL;             -- not UTF-8 (or a NUL): its escape form
                END;
            END IF;
            IF v_bytes IS NULL THEN
                IF pg_catalog.ascii(v_raw) = 65279 THEN  -- a byte order mark
                    v_raw := pg_catalog.substr(v_raw, 2);
                END IF;
                BEGIN
                    v_checked := v_raw::jsonb;
                EXCEPTION WHEN data_exception THEN
                    BEGIN  -- JSON lines: one value a line
                        v_checked := CASE WHEN pg_catalog.strpos(v_raw, E'\n') > 0 THEN
                            ('[' OPERATOR(pg_catalog.||) pg_catalog.array_to_string(ARRAY(
                                 SELECT l FROM pg_catalog.regexp_split_to_table(v_raw, E'[\\r\\n]+') l
                                  WHERE l OPERATOR(pg_catalog.~) '[^[:space:]]'), ',') OPERATOR(pg_catalog.||) ']')::jsonb END;
                    EXCEPTION WHEN data_exception THEN
                        v_checked := NULL;  -- no JSON (CSV, prose, a form, YAML): its fields below
                    END;
                END;
            END IF;
            IF v_checked IS NULL THEN
                SELECT COALESCE(m[1], m[2]) INTO v_name
                  FROM pg_catalog.regexp_matches(v_raw,
                           E'(?:^|[\\r\\n&;])[[:space:]]*(?:-[[:space:]]+|export[[:space:]]+)?["'']?([^=&;:[:space:]"'',#]+)["'']?[[:space:]]*[:=]'
                           OPERATOR(pg_catalog.||) CASE WHEN v_bytes IS NOT NULL THEN '|"([^"]+)"[[:space:]]*:' ELSE '' END,
                           'g') m
                 WHERE COALESCE(m[1], m[2]) OPERATOR(pg_catalog.~*) v_words
                   AND public.idem_credential_name(COALESCE(m[1], m[2])) LIMIT 1;
                IF v_name IS NOT NULL THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM04',
                        MESSAGE = pg_catalog.format('idem_complete: response_body must not contain credentials (found field %s)', v_name),
                        HINT = 'remove the credential from the response, or complete with p_response_body => NULL (not replayable)';
                END IF;
            END IF;
        END IF;
    END IF;

    -- GUARD: no credentials in a stored response (contract §3), at any depth, and in the
    -- JSON texts that string values hold (a webhook's payload). A cheap regex over the text
    -- screens out the ordinary body; only a hit pays for the exact per-key walk
    -- (idem_credential_name). It must miss no name the walk would refuse: a key reads
    -- `"<name>": ` in jsonb's text (`\"<name>\": ` inside a string), where a name may hold escapes
    -- (\" \\ \t \u001f ...), so after a word the rest of the name is any unescaped character or
    -- escape up to `": `; the two-word names (api key, ...) may have any run of separators or
    -- escapes between the words, or none; a percent-encoded name is walked too.
    IF v_checked::text OPERATOR(pg_catalog.~*)
           E'(passw|passphrase|pwd|secret|token|authori|authenticat|cookie|bearer|credential|csrf|xsrf|session|(api|private|access|signing|x)([^a-z0-9"\\\\]|\\\\[^u]|\\\\u[0-9a-f][0-9a-f][0-9a-f][0-9a-f])*(key|auth)|%[0-9a-f][0-9a-f])([^"\\\\]|\\\\.)*\\\\?"[[:space:]]*:' THEN
        -- strict: lax mode's .** visits what an array holds twice; a key that holds none of the
        -- rule's words (order_id) skips the rule
        v_docs := v_checked;
        LOOP
            SELECT k #>> '{}' INTO v_name
              FROM pg_catalog.jsonb_path_query(v_docs, 'strict $.** ? (@.type() == "object").keyvalue().key') k
             WHERE (k #>> '{}') OPERATOR(pg_catalog.~*) v_words
               AND public.idem_credential_name(k #>> '{}') LIMIT 1;
            -- a JSON text in a string shows as an escaped quote in the text
            EXIT WHEN v_name IS NOT NULL OR pg_catalog.strpos(v_docs::text, E'\\"') = 0;
            v_next := '[]';
            FOR v_value IN SELECT s FROM pg_catalog.jsonb_path_query(v_docs,
                               'strict $.** ? (@.type() == "string" && @ like_regex "^[[:space:]]*[[{]")') s LOOP
                BEGIN
                    v_next := v_next OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array((v_value #>> '{}')::jsonb);
                EXCEPTION WHEN data_exception THEN
                    NULL;  -- not JSON
                END;
            END LOOP;
            EXIT WHEN v_next = '[]'::jsonb;
            v_docs := v_next;
        END LOOP;
        IF v_name IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'IDM04',
                MESSAGE = pg_catalog.format('idem_complete: response_body must not contain credentials (found key "%s")', v_name),
                HINT = 'remove the credential from the response, or complete with p_response_body => NULL (not replayable)';
        END IF;
        v_name := NULL;
    END IF;

    -- GUARD: no credential that a URL carries by its syntax: a password in its user information
    -- (scheme://user:password@host, a DSN), whatever its name, in the body or a header's value;
    -- and in the body, a query parameter the one rule names (?access_token=...; a header value's
    -- parameters are screened below). Only a text with a "://", or a "?"/"&" and one of the
    -- rule's words, pays for the regexes.
    v_urls := pg_catalog.concat(v_checked::text, ' ', p_response_headers::text);
    IF (pg_catalog.strpos(v_urls, '://') > 0
        AND v_urls OPERATOR(pg_catalog.~) '[[:alpha:]][-+.[:alnum:]]*://[^/?#@[:space:]"]*:[^/?#@[:space:]"]*@')
       OR ((pg_catalog.strpos(v_checked::text, '?') > 0 OR pg_catalog.strpos(v_checked::text, '&') > 0)
           AND v_checked::text OPERATOR(pg_catalog.~*) v_words
           AND EXISTS (SELECT 1 FROM pg_catalog.regexp_matches(v_checked::text, '[?&]([^=&#?"[:space:]]+)=', 'g') m
                        WHERE m[1] OPERATOR(pg_catalog.~*) v_words AND public.idem_credential_name(m[1]))) THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM04',
            MESSAGE = 'idem_complete: response_body and headers must not contain credentials (found a URL with a password or a credential parameter)',
            HINT = 'remove the credential from the response, or complete with p_response_body => NULL (not replayable)';
    END IF;

    -- GUARD: headers are {"<name>": "<value>", ...}: HTTP token names, string values of at most
    -- 8 KiB without control characters, and never a credential by the one rule
    -- (idem_credential_name: Set-Cookie, Authorization, WWW-Authenticate, Proxy-Authenticate,
    -- *-Token, *-Api-Key, X-Access-Key, X-Pwd, ...), whatever the caller passes.
    -- The header set of every JSON answer passes each check below, and is compared, not screened.
    IF p_response_headers IS NOT NULL AND p_response_headers <> '{"Content-Type": "application/json"}'::jsonb THEN
        IF pg_catalog.jsonb_typeof(p_response_headers) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'IDM00',
                MESSAGE = 'idem_complete: p_response_headers must be a JSON object {"<header name>": "<value>"}';
        END IF;
        -- A cheap screen over the whole set (two regexes over its text, one jsonpath: a fraction of
        -- the walk's cost; no {m,n} bounds, they blow up PostgreSQL's regex NFA); only a hit
        -- pays for the exact per-header walk, which names the offender. Every check below is in
        -- the screen: a word of the rule anywhere or a percent-encoding (a parameter's name may be
        -- one), an escaped control character (or a raw DEL),
        -- a text long enough to hold an 8 KiB value, a value that is not a string, a bad name.
        IF p_response_headers::text OPERATOR(pg_catalog.~*)
               E'(passw|passphrase|pwd|secret|token|auth|cookie|bearer|credential|csrf|xsrf|session|(api|private|access|signing)([^a-z0-9"\\\\]|\\\\[^u]|\\\\u[0-9a-f][0-9a-f][0-9a-f][0-9a-f])*key|%[0-9a-f][0-9a-f])'
           OR p_response_headers::text OPERATOR(pg_catalog.~) E'\\\\[bfnr]|\\\\u00[01]|\\x7f'
           OR pg_catalog.octet_length(p_response_headers::text) > 8192
           OR pg_catalog.jsonb_path_exists(p_response_headers,
                  '$.keyvalue() ? (@.value.type() != "string" || !(@.key like_regex "^[-!#$%&''*+.^_`|~0-9A-Za-z]+$"))') THEN
            FOR v_name, v_value IN SELECT h.key, h.value FROM pg_catalog.jsonb_each(p_response_headers) h LOOP
                IF v_name OPERATOR(pg_catalog.!~) '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$' THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM00',
                        MESSAGE = pg_catalog.format('idem_complete: %L is not an HTTP header name', pg_catalog.left(v_name, 64));
                END IF;
                IF v_name OPERATOR(pg_catalog.~*) v_words AND public.idem_credential_name(v_name) THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM04',
                        MESSAGE = pg_catalog.format('idem_complete: response headers must not contain credentials (found header %s)', v_name),
                        HINT = 'the shim never stores Set-Cookie, Authorization, WWW-Authenticate, Proxy-Authenticate or credential-named headers';
                END IF;
                IF pg_catalog.jsonb_typeof(v_value) <> 'string' THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM00',
                        MESSAGE = pg_catalog.format('idem_complete: the value of response header %s must be a string', v_name);
                END IF;
                IF pg_catalog.octet_length(v_value #>> '{}') > 8192 THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM04',
                        MESSAGE = pg_catalog.format('idem_complete: the value of response header %s is %s bytes, over the 8192 allowed',
                                                    v_name, pg_catalog.octet_length(v_value #>> '{}'));
                END IF;
                -- A value may carry a credential too: Location: /cb?access_token=...
                IF EXISTS (SELECT 1 FROM pg_catalog.regexp_matches(v_value #>> '{}', '(?:^|[?&;#])([^=&;#?]+)=', 'g') m
                            WHERE m[1] OPERATOR(pg_catalog.~*) v_words
                              AND public.idem_credential_name(m[1])) THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM04',
                        MESSAGE = pg_catalog.format('idem_complete: the value of response header %s carries a credential-named parameter', v_name),
                        HINT = 'do not put tokens in URLs the response points to, or decorate with store_response=False';
                END IF;
                IF (v_value #>> '{}') OPERATOR(pg_catalog.~) E'[\\x01-\\x08\\x0a-\\x1f\\x7f]' THEN
                    RAISE EXCEPTION USING ERRCODE = 'IDM04',
                        MESSAGE = pg_catalog.format('idem_complete: the value of response header %s holds a control character (a line break?)', v_name);
                END IF;
            END LOOP;
        END IF;
    END IF;

    -- No nested call (and its search_path switch) unless encryption is on. Computed before the
    -- UPDATE: Citus refuses a VOLATILE function (the encryption's random IV) inside one.
    v_body := CASE WHEN p_response_key IS NULL THEN p_response_body
                   ELSE public.idem_encrypt_response(p_response_body, p_response_key) END;
    -- No body, nothing to replay: the headers are not kept either (PII rule).
    v_headers := CASE WHEN p_response_body IS NULL OR p_response_headers IS NULL THEN NULL
                      WHEN p_response_key IS NULL THEN p_response_headers
                      ELSE public.idem_encrypt_response(p_response_headers, p_response_key) END;
    UPDATE public.idempotency_keys k
       SET status = 'completed', response_code = p_response_code,
           response_body = v_body, response_headers = v_headers
     WHERE k.id = p_key_id AND k.status = 'in_flight'
       AND (v_claimed_at IS NULL OR k.created_at = v_claimed_at)  -- this claim, not a later one with its key_id
       -- its shard, on a distributed store (the key_id carries the scope); always true on one node
       AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id));

    -- GUARD: the token no longer holds the key
    IF NOT FOUND THEN
        PERFORM public.idem_raise_claim_lost('idem_complete', p_key_id, v_claimed_at);
    END IF;
END
$$;

COMMENT ON FUNCTION public.idem_complete IS
    'Completes the claim p_key_id (from idem_claim) with the response to replay; call it as the last '
    'statement of the handler''s transaction. p_claim_token is the claim_token idem_claim returned with '
    'p_key_id (only the owner and members of idem_admin may leave it out). p_response_body NULL stores no body (and no headers): the key '
    'is then not replayable and a later claim runs again. A body that is not a JSON object is passed as its '
    'bytes, {"idem_raw": "text"|"base64", "data": <string>}, and replays byte for byte. p_response_headers '
    '{"<name>": "<value>"} are the headers to replay (Location, ETag, Content-Type, ...). With '
    'p_response_key the body and the headers are stored encrypted (pgcrypto). '
    'Errors: IDM01 claim lost (healed, completed, failed, erased, unknown, or not this claim''s token) - nothing changed, roll the '
    'whole transaction back (the message says what the row is now); IDM04 response refused: the body holds a credential-named key at any depth '
    '(password, *_token, *_secret, api_key, authorization, cookie, ...), or a header is credential-named '
    '(Set-Cookie, Authorization, WWW-Authenticate, Proxy-Authenticate, *-Token, ...), over 8192 bytes or '
    'holds a control character; IDM00 no p_claim_token from a role that needs one, response code outside 100..599, a weak p_response_key, a malformed '
    'idem_raw form, headers that are not an object of header names to strings; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
