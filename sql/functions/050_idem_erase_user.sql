-- idem_erase_user
-- Deleting an in-flight row is deliberate: its holder loses the claim (IDM01) rather than
-- recreate the user's data after erasure. Waits for rows a completing holder has locked, for at
-- most lock_timeout (10 s): the request path holds a key's row for a statement or its commit,
-- and a member of idem_app that keeps one locked in a transaction it never ends (a claim under
-- any user's id, then a heartbeat) must not hang the GDPR job; it gets 55P03 and retries.
CREATE OR REPLACE FUNCTION public.idem_erase_user(p_user_id public.idem_user_id)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '10s'
AS $$
DECLARE
    v_count bigint;
BEGIN
    -- GUARD: NULL would mean "all service calls", which is no data subject
    IF p_user_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_erase_user: p_user_id must not be NULL';
    END IF;

    BEGIN
        DELETE FROM public.idempotency_keys k WHERE k.scope_user_id = p_user_id;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        -- The user's events go too (stale heals keep the key, lost claims the endpoint): after an
        -- erasure nothing of the user is left anywhere in the store.
        DELETE FROM public.idempotency_events e WHERE e.scope_user_id = p_user_id;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION USING ERRCODE = 'lock_not_available',
            MESSAGE = pg_catalog.format('idem_erase_user: a transaction has held a key of user %s locked for over %s; '
                                        'nothing was erased', p_user_id, pg_catalog.current_setting('lock_timeout')),
            HINT = 'retry the erasure; a session that stays "idle in transaction" in pg_stat_activity holds it '
                   '(pg_terminate_backend ends it)';
    END;

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
    'store; an in-flight holder of an erased key loses its claim (IDM01). Waits at most 10 s (lock_timeout) for a '
    'key''s row another transaction holds locked. Logs an erasure event (the count '
    'and the time; no user id, no content) when it deleted rows. The host''s own tables (audit_log''s '
    'idempotency_replay rows) are the host''s to erase. Errors: IDM00 when p_user_id is NULL; '
    '55P03 when a row stayed locked for the 10 s (nothing erased: retry); '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
