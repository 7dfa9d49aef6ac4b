-- idem_cleanup_job
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (SPEC §3a).
-- The nightly cleanup's pg_cron job, declared once: idem_schedule_cleanup upserts it here, and
-- `idem migrate` / `idem status` read it to write or report the job in pg_cron's own database.
-- Pure; a SQL-standard body, whose names are resolved when it is created.
CREATE OR REPLACE FUNCTION public.idem_cleanup_job(
    p_database          text DEFAULT NULL,
    OUT jobname         text,
    OUT schedule        text,
    OUT command         text,
    OUT legacy_jobname  text
)
LANGUAGE sql
STABLE
PARALLEL SAFE
BEGIN ATOMIC
    SELECT 'idem-cleanup:' OPERATOR(pg_catalog.||) COALESCE(p_database, pg_catalog.current_database()::text),
           '0 4 * * *'::text,
           'CALL public.idem_cleanup()'::text,
           'idempotency-cleanup'::text;
END;

COMMENT ON FUNCTION public.idem_cleanup_job IS
    'The pg_cron job of database p_database''s cleanup (default: this database): jobname '
    '''idem-cleanup:<database>'', schedule ''0 4 * * *'' (pg_cron reads it in UTC), command '
    '''CALL public.idem_cleanup()'', and legacy_jobname, the name the job had before (removed where '
    'found). idem_schedule_cleanup and idem migrate / idem status read it. Errors: none.';
