-- idem_reencrypt_range (Citus)
-- Citus refuses a VOLATILE function (the encryption) inside an UPDATE of a distributed table, so
-- the coordinator reads the range (a multi-shard read in key_id order), opens and re-seals each
-- body itself, and writes it back with a single-shard UPDATE by (scope_user_id, id) that carries
-- the new body as a value; the UPDATE also requires the stored body to be the one read, so a row
-- changed in between (an erasure, a concurrent rotation) is skipped, not overwritten. The keys
-- never leave this node in a command: only the ciphertext does.
CREATE OR REPLACE FUNCTION public.idem_reencrypt_range(
    p_old_key   text,
    p_new_key   text,
    p_old_kid   text,
    p_after_id  bigint,
    p_last_id   bigint
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count    integer := 0;
    v_one      integer;
    v_row      record;
    v_body     jsonb;
    v_headers  jsonb;
BEGIN
    FOR v_row IN
        SELECT k.scope_user_id, k.id, k.response_body, k.response_headers
          FROM public.idempotency_keys k
         WHERE k.id > p_after_id AND k.id <= p_last_id
           AND k.status = 'completed' AND k.response_body IS NOT NULL
           AND CASE WHEN p_old_kid IS NULL
                    THEN (k.response_body ->> 'idem_enc') IS NULL
                    ELSE (k.response_body ->> 'idem_enc') = 'pgp-sym-v1' AND (k.response_body ->> 'kid') = p_old_kid
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
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION public.idem_reencrypt_range IS
    'idem_reencrypt_responses''s rewrite, after its guards. Distributed store (Citus): the completed bodies (and '
    'their headers) with key_id in (p_after_id, p_last_id] under p_old_key (key id p_old_kid; NULL: plain '
    'bodies), read on the coordinator, re-sealed under p_new_key (NULL: plain) and written back one '
    'single-shard UPDATE each (a row changed meanwhile is skipped); returns how many. Internal: no role may '
    'execute it. Errors: IDM03 a body does not decrypt.';
