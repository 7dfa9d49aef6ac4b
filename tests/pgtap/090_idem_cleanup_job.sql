-- 090_idem_cleanup_job: the cleanup's pg_cron job, declared once.
-- Cases:
--   the job of this database by default, of the one named otherwise: 'idem-cleanup:<database>',
--     at '0 4 * * *', running CALL public.idem_cleanup(), replacing the old 'idempotency-cleanup';
--   idem_schedule_cleanup's default schedule is this one (so a new schedule is one edit);
--   the command it names is a CALL of the procedure that exists;
--   idem_admin may read it, idem_app may not.
BEGIN;
SELECT plan(6);

SELECT results_eq('SELECT jobname, schedule, command, legacy_jobname FROM public.idem_cleanup_job()',
    format($$VALUES (%L, '0 4 * * *', 'CALL public.idem_cleanup()', 'idempotency-cleanup')$$,
           'idem-cleanup:' || current_database()),
    'this database''s job: its name, the nightly schedule, the command, the old name');
SELECT is((SELECT jobname FROM public.idem_cleanup_job('shop')), 'idem-cleanup:shop', 'another store''s job is named for it');
SELECT is((SELECT pg_get_function_arguments('public.idem_schedule_cleanup'::regproc)),
    'p_schedule text DEFAULT (idem_cleanup_job()).schedule',
    'idem_schedule_cleanup takes its default schedule from here');
SELECT throws_ok((SELECT command FROM public.idem_cleanup_job()), '2D000', NULL,
    'the command is a CALL of the cleanup procedure (which refuses a transaction block, as here)');
SELECT ok(has_function_privilege('idem_admin', 'public.idem_cleanup_job(text)', 'EXECUTE'), 'idem_admin may read it');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_cleanup_job(text)', 'EXECUTE'), 'idem_app may not');

SELECT * FROM finish();
ROLLBACK;
