-- idem_delete_expired
-- The step of idem_cleanup_batch that deletes, after its guards: sql/citus/ replaces it on a
-- distributed store, where each shard deletes its own batch. Finished rows and orphans
-- alike are found through the expiry index over every row (contract §2). SKIP LOCKED: a row a live transaction
-- holds is left for the next run rather than waited for.
CREATE OR REPLACE FUNCTION public.idem_delete_expired(p_batch_size integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_finished  integer;
    v_orphans   integer := 0;
BEGIN
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

COMMENT ON FUNCTION public.idem_delete_expired IS
    'idem_cleanup_batch''s deletion, after its guards: at most p_batch_size idempotency_keys rows expired at '
    'p_now (finished first, then orphaned in-flight ones), then idempotency_events past 7 days when the batch '
    'was not full; returns the number of keys deleted. On a distributed store (sql/citus/) each shard does '
    'so on its worker. Internal: no role may execute it. Errors: none (IDM00 from a shard that failed, '
    'on a distributed store).';
