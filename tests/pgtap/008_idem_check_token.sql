-- 008_idem_check_token: the fence of every routine that acts on a claim by its key_id.
-- It is called from definers, so here a definer of this transaction calls it and reports the
-- SQLSTATE it raised ('passed' when none), for the owner and for roles set with SET ROLE.
-- Cases:
--   the claim's own token passes; another token raises IDM01 (claim lost, naming the routine
--     and the key_id), for anyone;
--   no token: passes for the owner and a member of idem_admin, raises IDM00 for anyone else,
--     except for a claim taken before tokens existed (key_id <= tokenless_through).
BEGIN;
SELECT plan(7);

INSERT INTO public.users (id) VALUES (801);
CREATE TEMP TABLE c AS SELECT key_id, claim_token FROM public.idem_claim('a0080000-0000-4000-8000-000000000001', 801, 'ep', '{}');
-- the value first: on Citus idem_secret is a reference table, which no UPDATE reading a
-- temporary table may change
SELECT key_id - 1 AS tokenless FROM c \gset
UPDATE public.idem_secret SET tokenless_through = :tokenless;
CREATE FUNCTION public.tap_check_token(p_key_id bigint, p_token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM public.idem_check_token('idem_tap', p_key_id, p_token);
    RETURN 'passed';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;
CREATE ROLE idem_tap_dba IN ROLE idem_admin;
CREATE ROLE idem_tap_app IN ROLE idem_app;
GRANT EXECUTE ON FUNCTION public.tap_check_token TO idem_tap_dba, idem_tap_app;
SELECT key_id AS k, claim_token AS t FROM c \gset

SELECT is(public.tap_check_token(:k, :'t'), 'passed', 'the claim''s own token passes');
SELECT throws_ok(format('SELECT public.idem_check_token(%L, %s, %L)', 'idem_complete', :k, repeat('0', 32)), 'IDM01',
    format('idem_complete: claim lost: p_claim_token is not the token of key_id %s; nothing was changed', :k),
    'another token raises IDM01 in the calling routine''s name');
SELECT is(public.tap_check_token(:k, NULL), 'passed', 'the owner needs no token');
SET LOCAL ROLE idem_tap_dba;
SELECT public.tap_check_token(:k, NULL) AS dba_none, public.tap_check_token(:k, repeat('0', 32)) AS dba_wrong \gset
SET LOCAL ROLE idem_tap_app;
SELECT public.tap_check_token(:k, NULL) AS app_none, public.tap_check_token(:k, :'t') AS app_right,
       public.tap_check_token(:k - 1, NULL) AS app_old \gset
RESET ROLE;
SELECT is((:'dba_none' || ' ' || :'dba_wrong')::text, 'passed IDM01', 'a member of idem_admin needs no token, but a wrong one still fails');
SELECT is((:'app_none')::text, 'IDM00', 'the app''s role without a token: IDM00 (required)');
SELECT is((:'app_right')::text, 'passed', 'the app''s role with the claim''s token passes');
SELECT is((:'app_old')::text, 'passed', 'a claim taken before tokens existed (key_id <= tokenless_through) needs none');

SELECT * FROM finish();
ROLLBACK;
