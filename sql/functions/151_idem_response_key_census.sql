-- idem_response_key_census
-- How many stored bodies each response key id holds (kid NULL: stored in clear), and whether
-- that is p_current_key's (NULL: clear is current), so a key rotation can tell what it left
-- behind: bodies under a key id that neither of its keys opens (a wrong fallback) are
-- reported, not passed over in silence. Aggregates only: no key, user, hash or body, so the
-- app's role (which drives the rotation and holds the key) may run it. One scan, no lock.
CREATE OR REPLACE FUNCTION public.idem_response_key_census(p_current_key text DEFAULT NULL)
RETURNS TABLE (kid text, bodies bigint, is_current boolean)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_current_key) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_response_key_census', pg_catalog.pg_collation_for(p_current_key));
    v_current text;
BEGIN
    IF p_current_key IS NOT NULL THEN
        v_current := public.idem_response_key_id(p_current_key);
    END IF;
    RETURN QUERY
    SELECT c.kid, c.bodies, c.kid IS NOT DISTINCT FROM v_current
      FROM (SELECT CASE WHEN k.response_body ->> 'idem_enc' IS NOT NULL
                        THEN k.response_body ->> 'kid' END AS kid,
                   pg_catalog.count(*) AS bodies
              FROM public.idempotency_keys k
             WHERE k.status = 'completed' AND k.response_body IS NOT NULL
             GROUP BY 1) c
     ORDER BY c.kid NULLS FIRST;
END
$$;

COMMENT ON FUNCTION public.idem_response_key_census IS
    'Stored response bodies per response key id (kid NULL: stored in clear) and whether that is '
    'p_current_key''s (NULL: clear is current), for a key rotation to report what is left under a '
    'key it could not open (flask idempotency rotate-response-key does). Aggregates only. '
    'Errors: 22023 a weak p_current_key.';
