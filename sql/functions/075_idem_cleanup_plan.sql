-- idem_cleanup_plan
-- Whether a cleanup at p_max_rows_per_second deletes today's expired rows before the next
-- run (p_every after this one: the job is daily). idem_cleanup raises its NOTICE from it and
-- `idem status` prints it. Counts through the expiry index (no lock); SECURITY DEFINER
-- because the callers cannot read the table.
CREATE OR REPLACE FUNCTION public.idem_cleanup_plan(
    p_max_rows_per_second integer  DEFAULT 2500,
    p_every               interval DEFAULT '1 day'
)
RETURNS TABLE (
    expired              bigint,
    max_rows_per_second  integer,
    takes                interval,
    every                interval,
    fits                 boolean
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_expired bigint;
    v_takes   interval;
BEGIN
    -- GUARD: a pace is a positive number of rows a second (NULL: unpaced)
    IF p_max_rows_per_second IS NOT NULL AND p_max_rows_per_second <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_cleanup_plan: p_max_rows_per_second must be positive (got %s); NULL runs unpaced',
                                        p_max_rows_per_second);
    END IF;
    -- GUARD: the interval to the next run is positive
    IF p_every IS NULL OR p_every <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_cleanup_plan: p_every must be a positive interval';
    END IF;

    SELECT pg_catalog.count(*) INTO v_expired
      FROM public.idempotency_keys k
     WHERE k.expires_at <= pg_catalog.now();
    IF p_max_rows_per_second IS NOT NULL THEN
        v_takes := pg_catalog.make_interval(secs => v_expired::double precision / p_max_rows_per_second);
    END IF;
    RETURN QUERY SELECT v_expired, p_max_rows_per_second, v_takes, p_every, (v_takes IS NULL OR v_takes < p_every);
END
$$;

COMMENT ON FUNCTION public.idem_cleanup_plan IS
    'Counts the expired idempotency_keys rows and says how long CALL public.idem_cleanup(p_max_rows_per_second => N) '
    'takes to delete them at that pace (takes; NULL when unpaced) and whether that fits before the next run, '
    'p_every after it (fits). Defaults are idem_cleanup''s. Used by idem_cleanup''s NOTICE and `idem status`. '
    'Errors: IDM00 non-positive pace or interval.';
