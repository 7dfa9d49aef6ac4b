-- 004_idem_anonymous_scope: where a service call's keys live (the Citus routing helper).
-- Cases (a single node): no reserved scope (NULL: the unique key's NULLS NOT DISTINCT dedupes
-- service calls); no role may execute it.
BEGIN;
SELECT plan(3);
-- Where the citus extension exists (make test-citus) the distributed forms of sql/citus/ are
-- installed, and the same number of checks asserts them instead.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS distributed \gset
\if :distributed
SELECT ok(public.idem_anonymous_scope(7) < 0, 'on Citus a user''s anonymous scope is negative: no user''s id');
SELECT is(get_shard_id_for_distribution_column('public.idempotency_events', public.idem_anonymous_scope(7)),
          get_shard_id_for_distribution_column('public.idempotency_events', 7), 'and on that user''s shard');
\else
SELECT is(public.idem_anonymous_scope(NULL)::integer, NULL::integer, 'a service call has no reserved scope on a single node');
SELECT is(public.idem_anonymous_scope(7)::integer, NULL::integer, 'nor does a user');
\endif
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_anonymous_scope(public.idem_user_id)', 'EXECUTE'), 'idem_app may not execute it');
SELECT * FROM finish();
ROLLBACK;
