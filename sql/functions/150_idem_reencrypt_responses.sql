-- idem_reencrypt_responses
-- One batch per call, so the caller commits in between: locks at most one batch of rows,
-- briefly; claims never wait for it (a replay reads the committed version, which the app
-- opens with its fallback key during a rotation). Its guards fix the batch's range; the rewrite
-- is idem_reencrypt_range's (one UPDATE on a single node, row by row where sql/citus/ replaces it).
CREATE OR REPLACE FUNCTION public.idem_reencrypt_responses(
    p_old_key     text,
    p_new_key     text,
    p_after_id    bigint  DEFAULT 0,
    p_batch_size  integer DEFAULT 500
)
RETURNS TABLE (last_id bigint, rewritten integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_old_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_reencrypt_responses', pg_catalog.pg_collation_for(p_old_key));
    v_old_kid  text;
    v_new_kid  text;
    v_last     bigint;
BEGIN
    -- GUARD: arguments (keys are checked, never echoed)
    IF p_old_key IS NULL AND p_new_key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_reencrypt_responses: give p_old_key, p_new_key or both';
    END IF;
    IF p_after_id IS NULL OR p_batch_size IS NULL OR p_batch_size NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_reencrypt_responses: p_after_id must be given and p_batch_size between 1 and 100000 (got %s)', p_batch_size);
    END IF;
    IF p_old_key IS NOT NULL THEN
        v_old_kid := public.idem_response_key_id(p_old_key);
    END IF;
    IF p_new_key IS NOT NULL THEN
        v_new_kid := public.idem_response_key_id(p_new_key);
    END IF;
    IF v_old_kid IS NOT DISTINCT FROM v_new_kid THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_reencrypt_responses: p_old_key and p_new_key are the same key';
    END IF;

    SELECT pg_catalog.max(w.id) INTO v_last
      FROM (SELECT k.id FROM public.idempotency_keys k
             WHERE k.id > p_after_id ORDER BY k.id LIMIT p_batch_size) w;

    -- GUARD: past the last row: the rotation is done
    IF v_last IS NULL THEN
        last_id := NULL;
        rewritten := 0;
        RETURN NEXT;
        RETURN;
    END IF;

    last_id := v_last;
    rewritten := public.idem_reencrypt_range(p_old_key, p_new_key, v_old_kid, p_after_id, v_last);
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION public.idem_reencrypt_responses IS
    'Key rotation, one batch: rewrites the stored bodies and their response headers under p_old_key '
    '(NULL: plain bodies, turning encryption on) among the next p_batch_size rows after p_after_id '
    '(primary-key order) so they are under p_new_key (NULL: plain, turning it off). Returns last_id '
    '(pass it back as p_after_id; NULL when done) and rewritten. Commit between batches (flask '
    'idempotency rotate-response-key does). Errors: IDM00 bad arguments or weak key; IDM03 a body does '
    'not decrypt.';
