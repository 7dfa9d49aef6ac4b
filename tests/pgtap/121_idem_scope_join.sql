-- 121_idem_scope_join: the scope condition of a join between a key's row and its events (the
-- hook sql/citus/ replaces).
-- Cases (a single node): rows of any two scopes join, NULL ones (service calls) too, so
--   idem_inspect shows a service call's events; the call is inlined (no call of it is left in
--   the caller's plan); no role may execute it. On Citus the same number of checks asserts the
--   distributed form: the scopes' equality, which the router sees (one shard for one scope).
BEGIN;
SELECT plan(6);
-- Where the citus extension exists (make test-citus) the distributed forms of sql/citus/ are
-- installed, and the same number of checks asserts them instead.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS distributed \gset

CREATE FUNCTION pg_temp.plan_of(p_query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_line text;
    v_plan text := '';
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || p_query LOOP
        v_plan := v_plan || v_line || E'\n';
    END LOOP;
    RETURN v_plan;
END
$$;
CREATE TEMP TABLE tok AS SELECT key_id AS id FROM public.idem_claim('a1210000-0000-4000-8000-000000000001', NULL, 'ep:121', '{}');
SELECT public.idem_complete((SELECT id FROM tok), 201, '{}');
SELECT public.idem_record_lost_claim((SELECT id FROM tok), 'ep:121');

\if :distributed
SELECT is(public.idem_scope_join(7, 7), true, 'on Citus rows of one scope join');
SELECT is(public.idem_scope_join(7, 8), false, 'on Citus rows of two scopes do not: the join is on the distribution column');
SELECT is(public.idem_scope_join(NULL, NULL), NULL::boolean, 'a NULL scope joins nothing (a distributed store has none)');
SELECT matches(pg_temp.plan_of('SELECT k.id FROM public.idempotency_keys k WHERE public.idem_scope_join(k.scope_user_id, 3)'),
    'Task Count: 1\n', 'inlined: the router sees the scope''s equality and reaches one shard');
\else
SELECT is(public.idem_scope_join(7, 7), true, 'on a single node rows of one scope join');
SELECT is(public.idem_scope_join(7, 8), true, 'and of two: the key_id alone joins a key''s events');
SELECT is(public.idem_scope_join(NULL, NULL), true, 'NULL scopes (service calls) join too');
SELECT doesnt_match(pg_temp.plan_of('SELECT k.id FROM public.idempotency_keys k WHERE public.idem_scope_join(k.scope_user_id, 3)'),
    'idem_scope_join', 'inlined: no call of it is left in the caller''s plan');
\endif
SELECT results_eq(
    $$SELECT e ->> 'event', e -> 'detail' ->> 'reason'
        FROM public.idem_inspect('a1210000-0000-4000-8000-000000000001'), jsonb_array_elements(events) e$$,
    $$VALUES ('lost_claim', 'already_completed')$$,
    'idem_inspect shows the events of a service call''s key (no user)');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_scope_join(public.idem_user_id,public.idem_user_id)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_scope_join(public.idem_user_id,public.idem_user_id)', 'EXECUTE'),
    'neither idem_app nor idem_admin may execute it');
SELECT * FROM finish();
ROLLBACK;
