-- idem_schedule_cleanup
-- Runs as the caller (the job belongs to them) and never fails a migration: pg_cron's schema
-- exists only in cron.database_name, so anywhere else it can only say, in a NOTICE, what to
-- run there (`idem migrate` schedules there itself). One job per store database: its name,
-- schedule and command are idem_cleanup_job()'s. Schedules are read in UTC by pg_cron < 1.6.
-- The command records this database's oid (it runs only there), so a job compared by its whole
-- command is rewritten where the oid changed (a restore) or the command is an older idem's.
CREATE OR REPLACE FUNCTION public.idem_schedule_cleanup(
    p_schedule  text DEFAULT (public.idem_cleanup_job()).schedule
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_db        constant text := pg_catalog.current_database()::text;
    v_job       record;
    v_legacy    text;
    v_command   text;
    v_job_name  text;
    v_grant     text := '';
    v_here      boolean;  -- pg_cron's extension exists here, so this is cron.database_name
    v_cron_db   text;
    v_hidden    boolean := false;  -- this role may not read cron.database_name
    v_tz        text;
    v_others    bigint;
    v_job_id    bigint;
    v_drop      bigint;
BEGIN
    -- It writes cron.job through dynamic SQL, which plpgsql_check cannot see; VOLATILE is right.
    -- @plpgsql_check_options: performance_warnings = false
    SELECT j.jobname, j.command, j.legacy_jobname INTO v_job FROM public.idem_cleanup_job(v_db) j;
    v_job_name := v_job.jobname;
    v_command := v_job.command;
    v_legacy := v_job.legacy_jobname;
    -- GUARD: a schedule is five cron fields (the argument is for tests and odd setups)
    IF p_schedule IS NULL OR p_schedule !~ E'^\\s*\\S+(\\s+\\S+){4}\\s*$' THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_schedule_cleanup: p_schedule must be five cron fields (got %L)', p_schedule);
    END IF;

    -- pg_cron can only be created in cron.database_name, so finding it here answers the
    -- question without the setting, which only superusers (and pg_read_all_settings) may read.
    v_here := EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_cron');
    BEGIN
        v_cron_db := pg_catalog.current_setting('cron.database_name', true);
        v_tz := pg_catalog.current_setting('cron.timezone', true);
    EXCEPTION WHEN insufficient_privilege THEN
        v_hidden := true;
        v_cron_db := CASE WHEN v_here THEN v_db END;
    END;

    -- GUARD: not cron's database, and this role may not read which one is
    IF v_hidden AND NOT v_here THEN
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format('idem_schedule_cleanup: %I may not read cron.database_name; the cleanup is not scheduled', current_user),
            HINT = pg_catalog.format('as a superuser, in pg_cron''s database run: '
                                     'SELECT cron.schedule_in_database(%L, %L, %L, %L, %L); '
                                     'or run `flask idempotency cleanup` daily at 04:00 UTC',
                                     v_job_name, p_schedule, v_command, v_db, current_user);
        RETURN 'not_permitted';
    END IF;

    -- GUARD: pg_cron is not loaded on this server (not in shared_preload_libraries)
    IF v_cron_db IS NULL OR v_cron_db = '' THEN
        RAISE NOTICE USING
            MESSAGE = 'idem_schedule_cleanup: pg_cron is not available on this server; expired idempotency keys are not cleaned up automatically',
            HINT = 'run `flask idempotency cleanup` daily at 04:00 UTC (or CALL public.idem_cleanup(); from any scheduler)';
        RETURN 'absent';
    END IF;

    -- GUARD: pg_cron lives in another database; cron.* cannot be reached from here
    IF v_cron_db <> v_db THEN
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format(
                'idem_schedule_cleanup: pg_cron runs in database %I, not %I; schedule the cleanup from there', v_cron_db, v_db),
            HINT = pg_catalog.format(
                '`idem migrate` schedules it there; by hand, as a superuser, in database %I run: '
                'SELECT cron.schedule_in_database(%L, %L, %L, %L, %L); '
                'without pg_cron: run `flask idempotency cleanup` daily at 04:00 UTC',
                v_cron_db, v_job_name, p_schedule, v_command, v_db, current_user);
        RETURN 'other_database';
    END IF;

    -- GUARD: this is cron's database but nobody created the extension here
    IF NOT v_here THEN
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format('idem_schedule_cleanup: pg_cron is loaded but its extension is not created in %I', v_db),
            HINT = 'a superuser runs CREATE EXTENSION pg_cron; then re-run idem migrate, or run '
                   '`flask idempotency cleanup` daily at 04:00 UTC';
        RETURN 'absent';
    END IF;

    IF v_tz IS NOT NULL AND v_tz NOT IN ('UTC', 'GMT', 'Etc/UTC', 'Etc/GMT') THEN
        RAISE WARNING USING
            MESSAGE = pg_catalog.format('idem_schedule_cleanup: cron.timezone is %L, so %L is not 04:00 UTC', v_tz, p_schedule);
    END IF;

    BEGIN
        -- cron.* is reached dynamically: the schema does not exist in databases without pg_cron.
        -- cron.job shows a role its own jobs (a superuser all): the store's job may have been
        -- scheduled for this role by a superuser, from the NOTICE below.
        EXECUTE pg_catalog.format(
            'SELECT pg_catalog.min(jobid) FROM %I.job WHERE jobname = $1 AND schedule = $2 '
            '   AND command = $3 AND database = $4 AND active', 'cron')
           INTO v_job_id
          USING v_job_name, p_schedule, v_command, v_db;
        EXECUTE pg_catalog.format(
            'SELECT pg_catalog.count(*) FROM %I.job WHERE (jobname = $1 OR (jobname = $2 AND database = $3)) '
            '   AND jobid IS DISTINCT FROM $4', 'cron')
           INTO v_others
          USING v_job_name, v_legacy, v_db, v_job_id;

        -- GUARD: already scheduled exactly so, once: change nothing
        IF v_job_id IS NOT NULL AND v_others = 0 THEN
            RETURN 'unchanged';
        END IF;

        -- A job of that name that differs, a second one, or this database's job of the old name:
        -- unschedule it. (Before pg_cron 1.5 the upsert by name keeps the old database and active
        -- flag, so a differing job is replaced rather than updated.)
        FOR v_drop IN EXECUTE pg_catalog.format(
            'SELECT jobid FROM %I.job WHERE (jobname = $1 OR (jobname = $2 AND database = $3)) '
            '   AND jobid IS DISTINCT FROM $4', 'cron')
          USING v_job_name, v_legacy, v_db, v_job_id
        LOOP
            EXECUTE pg_catalog.format('SELECT %I.unschedule($1)', 'cron') USING v_drop;
        END LOOP;
        -- cron.schedule (granted to PUBLIC, unlike schedule_in_database) schedules in this
        -- database, which is the one we want here.
        IF v_job_id IS NULL THEN
            EXECUTE pg_catalog.format('SELECT %I.schedule($1, $2, $3)', 'cron')
               INTO v_job_id
              USING v_job_name, p_schedule, v_command;
        END IF;
    EXCEPTION WHEN insufficient_privilege THEN
        -- GUARD: this role may not use pg_cron (no USAGE on schema cron, or schedule revoked):
        -- the migration still succeeds, and says what to run (the GRANT lets this role see the
        -- job, so the NOTICE stops once it exists)
        IF NOT pg_catalog.has_schema_privilege('cron', 'USAGE') THEN
            v_grant := pg_catalog.format('GRANT USAGE ON SCHEMA cron TO %I; ', current_user);
        END IF;
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format('idem_schedule_cleanup: %I may not schedule pg_cron jobs; the cleanup is not scheduled', current_user),
            HINT = pg_catalog.format('as a superuser, in database %I run: %sSELECT cron.schedule_in_database(%L, %L, %L, %L, %L); '
                                     'or run `flask idempotency cleanup` daily at 04:00 UTC',
                                     v_db, v_grant, v_job_name, p_schedule, v_command, v_db, current_user);
        RETURN 'not_permitted';
    END;
    RAISE NOTICE USING
        MESSAGE = pg_catalog.format('idem_schedule_cleanup: pg_cron job %L (jobid %s) runs %L at %L in database %I',
                                    v_job_name, v_job_id, v_command, p_schedule, v_db);
    RETURN 'scheduled';
END
$$;

COMMENT ON FUNCTION public.idem_schedule_cleanup IS
    'Upserts the pg_cron job idem_cleanup_job() names (''idem-cleanup:<database>'', by default at its '
    'schedule ''0 4 * * *'' UTC, its command checking that it runs in this database, by oid, before it '
    'CALLs public.idem_cleanup()), and removes its job of the old name (''idempotency-cleanup''); a job of '
    'that name whose command differs (an older idem''s, or another oid after a restore) is replaced. '
    'Returns scheduled | unchanged (already so; nothing written) | not_permitted (this role may not use '
    'pg_cron: a NOTICE says what to run) | other_database (pg_cron lives in cron.database_name: a NOTICE '
    'says what to run there; idem migrate schedules there itself) | absent (no pg_cron: a NOTICE names '
    '`flask idempotency cleanup`). Re-running it changes nothing. Called by idem migrate. '
    'Needs EXECUTE on idem_cleanup_job too (idem_admin has both). Errors: IDM00 when p_schedule is not five cron fields.';
