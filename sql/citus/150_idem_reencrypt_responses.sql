-- idem_reencrypt_responses (Citus): the same batches, arguments and result as
-- sql/functions/150_idem_reencrypt_responses.sql, rewritten row by row. Citus refuses a VOLATILE
-- function (the encryption) inside an UPDATE of a distributed table, so the coordinator reads the
-- batch (a multi-shard read in key_id order), opens and re-seals each body itself, and writes it
-- back with a single-shard UPDATE by (scope_user_id, id) that carries the new body as a value;
-- the UPDATE also requires the stored body to be the one read, so a row changed in between (an
-- erasure, a concurrent rotation) is skipped, not overwritten. The keys never leave this node in a
-- command: only the ciphertext does.
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
    v_old_kid  text;
    v_new_kid  text;
    v_last     bigint;
    v_count    integer;
    v_one      integer;
    v_row      record;
    v_body     jsonb;
    v_headers  jsonb;
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

    v_count := 0;
    FOR v_row IN
        SELECT k.scope_user_id, k.id, k.response_body, k.response_headers
          FROM public.idempotency_keys k
         WHERE k.id > p_after_id AND k.id <= v_last
           AND k.status = 'completed' AND k.response_body IS NOT NULL
           AND CASE WHEN v_old_kid IS NULL
                    THEN (k.response_body ->> 'idem_enc') IS NULL
                    ELSE (k.response_body ->> 'idem_enc') = 'pgp-sym-v1' AND (k.response_body ->> 'kid') = v_old_kid
               END
         ORDER BY k.id
    LOOP
        v_body := public.idem_encrypt_response(public.idem_decrypt_response(v_row.response_body, p_old_key), p_new_key);
        -- The headers were encrypted together with the body, under the same key.
        v_headers := public.idem_encrypt_response(public.idem_decrypt_response(v_row.response_headers, p_old_key), p_new_key);
        UPDATE public.idempotency_keys k
           SET response_body = v_body, response_headers = v_headers
         WHERE k.scope_user_id = v_row.scope_user_id AND k.id = v_row.id
           AND k.status = 'completed' AND k.response_body = v_row.response_body;
        GET DIAGNOSTICS v_one = ROW_COUNT;
        v_count := v_count + v_one;
    END LOOP;

    last_id := v_last;
    rewritten := v_count;
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
