-- 004_idem_anonymous_scope: where a service call's keys live (the Citus routing helper).
-- Cases (a single node): no reserved scope (NULL: the unique key's NULLS NOT DISTINCT dedupes
-- service calls); no role may execute it.
BEGIN;
SELECT plan(3);
SELECT is(public.idem_anonymous_scope(NULL), NULL::integer, 'a service call has no reserved scope on a single node');
SELECT is(public.idem_anonymous_scope(7), NULL::integer, 'nor does a user');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_anonymous_scope(integer)', 'EXECUTE'), 'idem_app may not execute it');
SELECT * FROM finish();
ROLLBACK;
