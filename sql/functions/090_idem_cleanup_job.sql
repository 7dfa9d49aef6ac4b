-- idem_cleanup_job
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The nightly cleanup's pg_cron job, declared once: idem_schedule_cleanup upserts it here, and
-- `idem migrate` / `idem status` read it to write or report the job in pg_cron's own database.
-- pg_cron finds the job's database by its name (cron.job.database), and a database's owner with
-- CREATEDB can rename the store and make another database of its name, or a DBA re-creates it
-- for its owner (a restore): the job would then CALL whatever that database's owner defined, as
-- the job's role. So the command first checks, in pg_catalog alone, that the database it runs in
-- is the one whose oid it records (only the server assigns an oid; the owner can make any table
-- or mark), and does nothing else where it is not. Every name and operator in it is qualified:
-- that database's owner sets its defaults (ALTER DATABASE ... SET search_path may put its schema
-- before pg_catalog). One statement, a DO block, because pg_cron sends the command as one query
-- and two statements in one query are one transaction, in which the cleanup cannot COMMIT.
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
           pg_catalog.replace(
               'DO $idem$ DECLARE v_deleted pg_catalog.int8; BEGIN '
               'IF NOT EXISTS (SELECT FROM pg_catalog.pg_database d WHERE d.oid OPERATOR(pg_catalog.=) ''<oid>''::pg_catalog.oid '
               'AND d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) THEN '
               'RAISE EXCEPTION USING ERRCODE = ''3D000'', MESSAGE = pg_catalog.format(''idem_cleanup_job: database %I '
               'is not the database idem scheduled this job for (oid <oid>): nothing was run; if it is idem''''s store now '
               '(restored), re-run idem migrate there; else unschedule the job: SELECT cron.unschedule(jobid) in pg_cron''''s database'', '
               'pg_catalog.current_database()); END IF; '
               'CALL public.idem_cleanup(p_deleted => v_deleted); END $idem$'::text,
               '<oid>',
               -- the database of that name now (0, no database's, where there is none)
               COALESCE((SELECT d.oid FROM pg_catalog.pg_database d
                          WHERE d.datname OPERATOR(pg_catalog.=) COALESCE(p_database, pg_catalog.current_database()::text)),
                        0::pg_catalog.oid)::pg_catalog.text),
           'idempotency-cleanup'::text;
END;

COMMENT ON FUNCTION public.idem_cleanup_job IS
    'The pg_cron job of database p_database''s cleanup (default: this database): jobname '
    '''idem-cleanup:<database>'', schedule ''0 4 * * *'' (pg_cron reads it in UTC), command a DO block '
    'that checks, in pg_catalog alone, that the database it runs in is the one of that name now (its oid, '
    'written into the command) and only then runs CALL public.idem_cleanup(): where pg_cron''s connection '
    'finds another database of the name (renamed, or dropped and re-created) it fails with 3D000 '
    '"idem_cleanup_job: database ... is not the database idem scheduled this job for", recorded in '
    'cron.job_run_details, and runs nothing; and legacy_jobname, the name the job had before (removed '
    'where found). idem_schedule_cleanup and idem migrate / idem status read it (a new oid, after a restore, '
    'is a new command: the next idem migrate replaces the job''s). Errors: none.';
