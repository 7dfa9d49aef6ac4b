-- idem_reencrypt_range
-- The step of idem_reencrypt_responses that rewrites, after its guards and once it has fixed its
-- range: one UPDATE here; sql/citus/ replaces it on a distributed store, where Citus refuses the
-- VOLATILE encryption inside an UPDATE. Locks the rows it rewrites until the caller commits.
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
    v_count  integer;
BEGIN
    UPDATE public.idempotency_keys k
       SET response_body = public.idem_encrypt_response(
               public.idem_decrypt_response(k.response_body, p_old_key), p_new_key),
           -- The headers were encrypted together with the body, under the same key.
           response_headers = public.idem_encrypt_response(
               public.idem_decrypt_response(k.response_headers, p_old_key), p_new_key)
     WHERE k.id > p_after_id AND k.id <= p_last_id
       AND k.status = 'completed' AND k.response_body IS NOT NULL
       AND CASE WHEN p_old_kid IS NULL
                THEN (k.response_body ->> 'idem_enc') IS NULL
                ELSE (k.response_body ->> 'idem_enc') = 'pgp-sym-v1' AND (k.response_body ->> 'kid') = p_old_kid
           END;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION public.idem_reencrypt_range IS
    'idem_reencrypt_responses''s rewrite, after its guards: the completed bodies (and their headers) with key_id '
    'in (p_after_id, p_last_id] under p_old_key (key id p_old_kid; NULL: plain bodies) re-sealed under '
    'p_new_key (NULL: plain); returns how many. On a distributed store (sql/citus/) row by row from the '
    'coordinator. Internal: no role may execute it. Errors: IDM03 a body does not decrypt.';
