-- 090_idem_cleanup_job: the cleanup's pg_cron job, declared once.
-- Cases:
--   the job of this database by default, of the one named otherwise: 'idem-cleanup:<database>',
--     at '0 4 * * *', replacing the old 'idempotency-cleanup';
--   its command checks that it runs in the database of that name now (its oid, recorded: 0 where
--     none has the name) and refuses elsewhere with 3D000, before it calls anything;
--   idem_schedule_cleanup's default schedule is this one (so a new schedule is one edit);
--   the command it names is a CALL of the procedure that exists;
--   idem_admin may read it, idem_app may not.
BEGIN;
SELECT plan(9);

SELECT results_eq('SELECT jobname, schedule, legacy_jobname FROM public.idem_cleanup_job()',
    format($$VALUES (%L, '0 4 * * *', 'idempotency-cleanup')$$, 'idem-cleanup:' || current_database()),
    'this database''s job: its name, the nightly schedule, the old name');
SELECT matches((SELECT command FROM public.idem_cleanup_job()),
    format('^DO \$idem\$ .* d\.oid OPERATOR\(pg_catalog\.=\) ''%s''::pg_catalog\.oid .*'
           'CALL public\.idem_cleanup\(p_deleted => v_deleted\); END \$idem\$$',
           (SELECT oid FROM pg_database WHERE datname = current_database())),
    'the command is one DO block that checks this database''s oid, then calls the cleanup');
SELECT matches((SELECT command FROM public.idem_cleanup_job('no such database')), '''0''::pg_catalog\.oid',
    'a database of no such name: oid 0, which no database has');
SELECT throws_ok((SELECT replace(command, (SELECT oid FROM pg_database WHERE datname = current_database())::text, '1')
                    FROM public.idem_cleanup_job()),
    '3D000', NULL, 'in a database that is not the one recorded, it refuses before calling anything');
SELECT is((SELECT jobname FROM public.idem_cleanup_job('shop')), 'idem-cleanup:shop', 'another store''s job is named for it');
SELECT is((SELECT pg_get_function_arguments('public.idem_schedule_cleanup'::regproc)),
    'p_schedule text DEFAULT (idem_cleanup_job()).schedule',
    'idem_schedule_cleanup takes its default schedule from here');
SELECT throws_ok((SELECT command FROM public.idem_cleanup_job()), '2D000', NULL,
    'in the recorded database, the command CALLs the cleanup procedure (which refuses a transaction block, as here)');
SELECT ok(has_function_privilege('idem_admin', 'public.idem_cleanup_job(text)', 'EXECUTE'), 'idem_admin may read it');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_cleanup_job(text)', 'EXECUTE'), 'idem_app may not');

SELECT * FROM finish();
ROLLBACK;
