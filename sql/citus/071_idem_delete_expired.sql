-- idem_delete_expired (Citus)
-- Citus does not run a LIMIT ... FOR UPDATE SKIP LOCKED across shards, so each shard deletes
-- its own batch, on its worker, in its own transaction (run_command_on_shards), at most
-- p_batch_size rows per shard; ctid, because a shard's primary key is (scope_user_id, id). The
-- total is returned: below p_batch_size, no shard was full, and idem_cleanup stops.
CREATE OR REPLACE FUNCTION public.idem_delete_expired(p_batch_size integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys    text;
    v_events  text;
    v_total   bigint := 0;
    v_shard   record;
BEGIN
    -- Finished rows first, then orphaned in-flight ones in what is left of the shard's batch (as on
    -- a single node), in one statement per shard; %1$s is the
    -- shard's name (run_command_on_shards), so every other literal is made %-free by format's %L.
    -- The statement runs in a worker's session, which starts with the database's defaults there:
    -- its owner's path (its own operators and types first) among them, and this function's SET
    -- search_path is not sent. So every operator and type in it is named, never looked up (and
    -- parenthesized: OPERATOR() takes the precedence of any other operator, left to right).
    v_keys := pg_catalog.format(
        $cmd$WITH fin AS (
                 DELETE FROM public.%%1$s k WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                     SELECT f.ctid FROM public.%%1$s f
                      WHERE (f.status OPERATOR(pg_catalog.=) 'completed' OR f.status OPERATOR(pg_catalog.=) 'failed')
                        AND f.expires_at OPERATOR(pg_catalog.<=) %1$L::pg_catalog.timestamptz
                      ORDER BY f.expires_at LIMIT %2$s FOR UPDATE SKIP LOCKED))
                 RETURNING 1),
             orphan AS (
                 DELETE FROM public.%%1$s k WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                     SELECT f.ctid FROM public.%%1$s f
                      WHERE f.status OPERATOR(pg_catalog.=) 'in_flight'
                        AND f.locked_at OPERATOR(pg_catalog.<=) %1$L::pg_catalog.timestamptz
                        AND f.expires_at OPERATOR(pg_catalog.<=) %1$L::pg_catalog.timestamptz
                      ORDER BY f.expires_at
                      LIMIT %2$s OPERATOR(pg_catalog.-) (SELECT pg_catalog.count(*) FROM fin)
                        FOR UPDATE SKIP LOCKED))
                 RETURNING 1)
        SELECT (SELECT pg_catalog.count(*) FROM fin) OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM orphan)$cmd$,
        p_now, p_batch_size);
    FOR v_shard IN SELECT s.shardid, s.success, s.result
                     FROM pg_catalog.run_command_on_shards('public.idempotency_keys', v_keys) s LOOP
        IF NOT v_shard.success THEN
            RAISE EXCEPTION USING ERRCODE = 'IDM00',
                MESSAGE = pg_catalog.format('idem_cleanup_batch: shard %s: %s', v_shard.shardid, v_shard.result);
        END IF;
        v_total := v_total + v_shard.result::bigint;
    END LOOP;

    v_events := pg_catalog.format(
        $cmd$DELETE FROM public.%%1$s e WHERE e.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                 SELECT o.ctid FROM public.%%1$s o
                  WHERE o.occurred_at OPERATOR(pg_catalog.<)
                        (%1$L::pg_catalog.timestamptz OPERATOR(pg_catalog.-) '7 days'::pg_catalog.interval)
                  ORDER BY o.occurred_at LIMIT %2$s))$cmd$,
        p_now, p_batch_size);
    PERFORM 1 FROM pg_catalog.run_command_on_shards('public.idempotency_events', v_events) s
     WHERE NOT s.success;
    RETURN LEAST(v_total, 2147483647)::integer;
END
$$;

COMMENT ON FUNCTION public.idem_delete_expired IS
    'idem_cleanup_batch''s deletion, after its guards. Distributed store (Citus): at most p_batch_size expired '
    'idempotency_keys rows per shard (finished first, then orphaned in-flight ones), each shard in its own '
    'transaction on its worker, then idempotency_events past 7 days; returns the number of keys deleted '
    '(below p_batch_size when no shard was full). Internal: no role may execute it. Errors: IDM00 (in '
    'idem_cleanup_batch''s name) a shard that failed.';
