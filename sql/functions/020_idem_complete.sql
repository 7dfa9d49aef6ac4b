-- idem_complete
-- Moves a claim from in_flight to completed and stores the response to replay. Call it as
-- the last statement of the handler's own transaction, so the business writes and the
-- completion commit together. Fenced by the claim token: if the key was healed, erased or
-- finished meanwhile, it raises IDM01 and the whole transaction (business writes included)
-- must roll back; that is what stops a zombie worker from committing a second execution.
-- Locks the one row it updates until the caller commits.
CREATE OR REPLACE FUNCTION public.idem_complete(
    p_key_id         bigint,
    p_response_code  integer,
    p_response_body  jsonb,
    p_response_key   text DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
    v_credential jsonb;
BEGIN
    -- GUARD: a response code must be an HTTP status
    IF p_response_code IS NULL OR p_response_code NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = pg_catalog.format('idem_complete: p_response_code must be an HTTP status 100..599 (got %s)', p_response_code);
    END IF;

    -- GUARD: no credentials in a stored response (ADR-0138 invariant), at any depth. A cheap
    -- regex over the text (a credential-named key always reads `<name>":`) screens out the
    -- ordinary body; only a hit pays for the exact per-key walk.
    IF p_response_body::text OPERATOR(pg_catalog.~*)
           '(password|passwd|secret|token|api[_-]?key|authorization|private[_-]?key|cookie|bearer)"\s*:' THEN
        v_credential := pg_catalog.jsonb_path_query_first(p_response_body,
            'lax $.** ? (@.type() == "object").keyvalue() ? (@.key like_regex "^(.*[_-])?(password|passwd|secret|token|api[_-]?key|authorization|private[_-]?key|cookie|bearer)$" flag "i").key');
        IF v_credential IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = pg_catalog.format('idem_complete: response_body must not contain credentials (found key %s)', v_credential),
                HINT = 'remove the credential from the response, or complete with p_response_body => NULL (not replayable)';
        END IF;
    END IF;

    UPDATE public.idempotency_keys k
       SET status = 'completed', response_code = p_response_code,
           -- No nested call (and its search_path switch) unless encryption is on.
           response_body = CASE WHEN p_response_key IS NULL THEN p_response_body
                                ELSE public.idem_encrypt_response(p_response_body, p_response_key) END
     WHERE k.id = p_key_id AND k.status = 'in_flight';

    -- GUARD: the token no longer holds the key
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM01',
            MESSAGE = pg_catalog.format('idempotency claim lost: key_id %s is no longer in flight for this holder; %s',
                                        p_key_id, public.idem_lost_claim_state(p_key_id)),
            HINT = 'roll this execution back: another claim or an erasure decided this key';
    END IF;
END
$$;

COMMENT ON FUNCTION public.idem_complete(bigint, integer, jsonb, text) IS
    'Completes the claim p_key_id (from idem_claim) with the response to replay; call it inside the '
    'handler''s transaction. p_response_body NULL stores no body: the key is then not replayable and a '
    'later claim runs again. With p_response_key the body is stored encrypted (pgcrypto). Errors: 22023 when the body holds a credential-named key (password, '
    '*_token, *_secret, api_key, authorization, cookie, ...); IDM01 claim lost (healed, completed, failed, erased, unknown) - '
    'nothing changed, roll back (the message says what the row is now); 22023 response code outside 100..599 or a weak p_response_key;'
    ' 42883 when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
