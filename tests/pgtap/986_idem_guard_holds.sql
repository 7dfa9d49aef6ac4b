-- 986_idem_guard_holds: the one home of "idem's DDL guard holds" (contract §3a).
-- Cases:
--   a superuser's migrate made it, in schema idem_guard, a superuser's, and it says the guard holds;
--   with the drop trigger disabled, or the schema trigger gone, it says it does not;
--   PUBLIC may execute it (a non-superuser's migrate and the cleanup ask it).
BEGIN;
SELECT plan(5);

SELECT ok((SELECT r.rolsuper FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
            WHERE p.oid = 'idem_guard.idem_guard_holds()'::regprocedure),
    'idem_guard.idem_guard_holds() is a superuser''s');
SELECT ok(idem_guard.idem_guard_holds(), 'it says the guard holds');
ALTER EVENT TRIGGER idem_guard_drop DISABLE;
SELECT is(idem_guard.idem_guard_holds(), false, 'with the drop trigger disabled it does not');
ALTER EVENT TRIGGER idem_guard_drop ENABLE ALWAYS;
DROP EVENT TRIGGER idem_guard_schema;
SELECT is(idem_guard.idem_guard_holds(), false, 'without the schema trigger it does not');
SELECT ok(pg_catalog.has_function_privilege('public', 'idem_guard.idem_guard_holds()', 'EXECUTE'),
    'PUBLIC may execute it');

SELECT * FROM finish();
ROLLBACK;
