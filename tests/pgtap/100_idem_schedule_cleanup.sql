-- 100_idem_schedule_cleanup: the pg_cron job's upsert, from a database that is not pg_cron's.
-- The test database never holds pg_cron's extension (cron.database_name is the cluster's `idem`
-- database, or pg_cron is not loaded at all), so here the function can only report where the job
-- belongs; scheduling, "unchanged" and the job of the old name are tested against pg_cron's own
-- database from Python (tests/python/ops/test_cron.py, test_pkg_cron.py).
-- Cases:
--   p_schedule NULL, four fields or six fields raises IDM00 before anything is looked at;
--   in a database without pg_cron's extension it returns other_database (pg_cron loaded, its
--     database elsewhere) or absent (not loaded), and never fails (a migration calls it);
--   a DBA (idem_admin) who may not read cron.database_name gets not_permitted (or absent
--     without pg_cron);
--   it runs as the caller (the job belongs to whoever migrates) and writes nothing here.
BEGIN;
SELECT plan(8);

SET LOCAL client_min_messages = warning;  -- the NOTICEs say what to run elsewhere

SELECT throws_ok($$SELECT public.idem_schedule_cleanup(NULL)$$, 'IDM00',
    'idem_schedule_cleanup: p_schedule must be five cron fields (got NULL)', 'a NULL schedule raises IDM00');
SELECT throws_ok($$SELECT public.idem_schedule_cleanup('0 4 * *')$$, 'IDM00', NULL, 'four cron fields raise IDM00');
SELECT throws_ok($$SELECT public.idem_schedule_cleanup('0 0 4 * * *')$$, 'IDM00', NULL, 'six cron fields raise IDM00');

CREATE TEMP TABLE cron_setting AS SELECT nullif(current_setting('cron.database_name', true), '') AS cron_db;
SELECT is(public.idem_schedule_cleanup(),
    CASE WHEN (SELECT cron_db FROM cron_setting) IS NULL THEN 'absent' ELSE 'other_database' END,
    'outside pg_cron''s database it says where the job belongs, and does not fail');
SELECT is(public.idem_schedule_cleanup('*/5 * * * *'),
    CASE WHEN (SELECT cron_db FROM cron_setting) IS NULL THEN 'absent' ELSE 'other_database' END,
    'any five-field schedule is accepted');
SELECT ok(NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'cron'), 'nothing of pg_cron was created here');

CREATE ROLE idem_tap_scheduler IN ROLE idem_admin;  -- a DBA who is not a superuser
SET LOCAL ROLE idem_tap_scheduler;  -- pgTAP's own tables are not this role's: keep the answer
SELECT public.idem_schedule_cleanup() AS as_scheduler \gset
RESET ROLE;
SELECT is(:'as_scheduler',
    CASE WHEN (SELECT cron_db FROM cron_setting) IS NULL THEN 'absent' ELSE 'not_permitted' END,
    'a role that may not read cron.database_name is told it may not schedule (a NOTICE says what to run)');

SELECT ok(NOT p.prosecdef, 'it runs as the caller: the job belongs to whoever migrates')
  FROM pg_proc p WHERE p.oid = 'public.idem_schedule_cleanup'::regproc;

SELECT * FROM finish();
ROLLBACK;
