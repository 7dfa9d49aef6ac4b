-- 006_idem_caller_is: who is calling, seen from inside a SECURITY DEFINER routine.
-- Cases:
--   the owner (here the superuser that migrated) is both 'owner' and 'admin';
--   a member of idem_admin is 'admin', not 'owner'; a role in neither is neither;
--   the role SET ROLE chose is the caller, not the login role;
--   no role may execute it (it answers for the definers that call it).
BEGIN;
SELECT plan(6);

SELECT ok(public.idem_caller_is('owner') AND public.idem_caller_is('admin'), 'the owner is owner and admin');

CREATE ROLE idem_tap_dba IN ROLE idem_admin;
CREATE ROLE idem_tap_stranger;
GRANT EXECUTE ON FUNCTION public.idem_caller_is TO idem_tap_dba, idem_tap_stranger;
SET LOCAL ROLE idem_tap_dba;  -- pgTAP's own tables are not this role's: keep the answers
SELECT public.idem_caller_is('owner') AS dba_owner, public.idem_caller_is('admin') AS dba_admin \gset
SET LOCAL ROLE idem_tap_stranger;
SELECT public.idem_caller_is('owner') AS stranger_owner, public.idem_caller_is('admin') AS stranger_admin \gset
RESET ROLE;

SELECT is((:'dba_admin')::text, 't', 'a member of idem_admin (by SET ROLE) may act as a DBA');
SELECT is((:'dba_owner')::text, 'f', 'but is not the owner (p_now stays refused)');
SELECT is((:'stranger_owner' || ' ' || :'stranger_admin')::text, 'f f', 'a role in neither is neither');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_caller_is(text)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_caller_is(text)', 'EXECUTE'),
    'neither idem role may execute it');
SELECT ok(NOT has_function_privilege('public', 'public.idem_caller_is(text)', 'EXECUTE'), 'nor PUBLIC');

SELECT * FROM finish();
ROLLBACK;
