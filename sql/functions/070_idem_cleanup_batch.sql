-- idem_cleanup_batch
-- The SECURITY DEFINER half of idem_cleanup (a procedure that commits cannot be one). Finished
-- rows use the ADR's partial expiry index, orphans the small in-flight one. SKIP LOCKED: a
-- row a live transaction holds is left for the next run rather than waited for.
CREATE OR REPLACE FUNCTION public.idem_cleanup_batch(
    p_batch_size  integer     DEFAULT 5000,
    p_now         timestamptz DEFAULT NULL
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_finished  integer;
    v_orphans   integer := 0;
BEGIN
    -- GUARD: a batch is a positive, bounded number of rows
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_cleanup_batch: p_batch_size must be between 1 and 1000000 (got %s)', p_batch_size);
    END IF;

    -- GUARD: a clock moved forward would delete live keys (their next request runs twice)
    IF p_now IS NOT NULL AND NOT public.idem_caller_is('owner') THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_cleanup_batch: p_now is for tests: only the functions'' owner may pass it';
    END IF;
    p_now := COALESCE(p_now, pg_catalog.clock_timestamp());

    -- = ANY(ARRAY(...)), not IN (...): the planner turns IN into a hash semi-join over a
    -- sequential scan of the whole table, once per batch; an id array probes the primary key.
    DELETE FROM public.idempotency_keys k
     WHERE k.id = ANY (ARRAY(SELECT f.id FROM public.idempotency_keys f
                     WHERE f.status IN ('completed', 'failed') AND f.expires_at <= p_now
                     ORDER BY f.expires_at
                     LIMIT p_batch_size
                       FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_finished = ROW_COUNT;

    IF v_finished < p_batch_size THEN
        DELETE FROM public.idempotency_keys k
         WHERE k.id = ANY (ARRAY(SELECT f.id FROM public.idempotency_keys f
                         WHERE f.status = 'in_flight' AND f.locked_at <= p_now AND f.expires_at <= p_now
                         ORDER BY f.expires_at  -- the expiry index (0007), never a table scan
                         LIMIT p_batch_size - v_finished
                           FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS v_orphans = ROW_COUNT;

        DELETE FROM public.idempotency_events e
         WHERE e.id = ANY (ARRAY(SELECT o.id FROM public.idempotency_events o
                         WHERE o.occurred_at < p_now - interval '7 days'
                         ORDER BY o.occurred_at
                         LIMIT p_batch_size));
    END IF;
    RETURN v_finished + v_orphans;
END
$$;

COMMENT ON FUNCTION public.idem_cleanup_batch IS
    'Deletes at most p_batch_size expired idempotency_keys rows (finished first, then orphaned '
    'in-flight ones) and trims idempotency_events past 7 days; returns the number of keys deleted. '
    'Use CALL idem_cleanup() to clean everything in committed batches. Errors: IDM00 bad batch size.';
