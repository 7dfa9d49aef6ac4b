-- idem_erase_user
-- Deleting an in-flight row is deliberate: its holder loses the claim (IDM01) rather than
-- recreate the user's data after erasure. Waits for rows a completing holder has locked.
CREATE OR REPLACE FUNCTION public.idem_erase_user(p_user_id integer)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    -- GUARD: NULL would mean "all service calls", which is no data subject
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_erase_user: p_user_id must not be NULL';
    END IF;

    DELETE FROM public.idempotency_keys k WHERE k.scope_user_id = p_user_id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    -- The user's events go too (stale heals keep the key, lost claims the endpoint): after an
    -- erasure nothing of the user is left anywhere in the store.
    DELETE FROM public.idempotency_events e WHERE e.scope_user_id = p_user_id;

    -- GUARD: nothing erased, nothing to log (idem_health counts erasures that erased rows)
    IF v_count = 0 THEN
        RETURN 0::bigint;
    END IF;

    -- The erasure itself is recorded without its subject: a count and a time, for idem_health
    -- (on a distributed store under an anonymous scope on the user's shard: one shard in all).
    INSERT INTO public.idempotency_events (event, scope_user_id, detail)
    VALUES ('erasure', public.idem_anonymous_scope(p_user_id), pg_catalog.jsonb_build_object('rows', v_count));
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION public.idem_erase_user IS
    'GDPR erasure: deletes all idempotency_keys rows of p_user_id and returns the count, and every '
    'idempotency_events row of that user (stale heals, lost claims), so nothing of the user is left in the '
    'store; an in-flight holder of an erased key loses its claim (IDM01). Logs an erasure event (the count '
    'and the time; no user id, no content) when it deleted rows. The host''s own tables (audit_log''s '
    'idempotency_replay rows) are the host''s to erase. Errors: IDM00 when p_user_id is NULL; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
