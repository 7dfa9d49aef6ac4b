-- idem_cleanup_batch
-- The SECURITY DEFINER half of idem_cleanup (a procedure that commits cannot be one): its
-- guards, then the deletion, idem_delete_expired (one statement per kind of row on a single
-- node, one per shard on a distributed store, where sql/citus/ replaces it).
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

    RETURN public.idem_delete_expired(p_batch_size, p_now);
END
$$;

COMMENT ON FUNCTION public.idem_cleanup_batch IS
    'Deletes at most p_batch_size expired idempotency_keys rows (finished first, then orphaned '
    'in-flight ones) and trims idempotency_events past 7 days; returns the number of keys deleted. '
    'On a distributed store (Citus) at most p_batch_size per shard, each shard in its own transaction on '
    'its worker: below p_batch_size, no shard was full. '
    'Use CALL public.idem_cleanup() to clean everything in committed batches. Errors: IDM00 bad batch size '
    '(or, distributed, a shard that failed).';
