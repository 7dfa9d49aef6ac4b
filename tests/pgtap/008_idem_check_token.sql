-- 008_idem_check_token: the fence of every routine that acts on a claim by its key_id.
-- It is called from definers, so here a definer of this transaction calls it and reports the
-- SQLSTATE it raised ('passed' when none), for the owner and for roles set with SET ROLE.
-- Cases:
--   the claim's own token passes; another token raises IDM01 (claim lost, naming the routine
--     and the key_id), for anyone;
--   no token: passes for the owner and a member of idem_admin, raises IDM00 for anyone else,
--     except for a claim marked as taken before tokens existed (legacy_token 'none', migration
--     0012); a key_id below migration 0008's tokenless_through is no such mark (on a distributed
--     store later claims of smaller users have one);
--   a claim marked as taken under the older token (legacy_token 'key_id') passes with the hash of
--     its key_id alone, which fits no other claim.
BEGIN;
SELECT plan(10);

-- On a Citus coordinator (make test-citus) the functions created below must go over one
-- connection per worker after this transaction's UPDATEs; a no-op setting on a single node.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

INSERT INTO public.users (id) VALUES (801);
CREATE TEMP TABLE c AS SELECT key_id, claim_token FROM public.idem_claim('a0080000-0000-4000-8000-000000000001', 801, 'ep', '{}');
CREATE TEMP TABLE pre AS SELECT key_id FROM public.idem_claim('a0080000-0000-4000-8000-000000000002', 801, 'ep', '{}');
CREATE TEMP TABLE old AS SELECT key_id FROM public.idem_claim('a0080000-0000-4000-8000-000000000003', 801, 'ep', '{}');
SELECT key_id AS pre FROM pre \gset
SELECT key_id AS old FROM old \gset
-- the marks as migration 0012 leaves them on the claims in flight at the upgrade (values, not a
-- temporary table: on Citus no UPDATE of a distributed table may read one)
UPDATE public.idempotency_keys SET legacy_token = 'none' WHERE id = :pre;
UPDATE public.idempotency_keys SET legacy_token = 'key_id' WHERE id = :old;
-- the range that stood for the mark before: every claim of this test is below it now
UPDATE public.idem_secret SET tokenless_through = 9223372036854775807;
CREATE FUNCTION public.tap_check_token(p_key_id bigint, p_token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM public.idem_check_token('idem_tap', p_key_id, p_token);
    RETURN 'passed';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;
-- the older token (migrations 0008 to 0012): the keyed hash of the key_id alone
CREATE FUNCTION public.tap_legacy_token(p_key_id bigint) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT left(encode(sha256(s.secret || convert_to('claim:', 'UTF8') || int8send(p_key_id)), 'hex'), 32)
      FROM public.idem_secret s $$;
CREATE ROLE idem_tap_dba IN ROLE idem_admin;
CREATE ROLE idem_tap_app IN ROLE idem_app;
GRANT EXECUTE ON FUNCTION public.tap_check_token TO idem_tap_dba, idem_tap_app;
SELECT key_id AS k, claim_token AS t FROM c \gset
SELECT public.tap_legacy_token(:old) AS old_t \gset
SELECT public.tap_legacy_token(:k) AS k_legacy \gset

SELECT is(public.tap_check_token(:k, :'t'), 'passed', 'the claim''s own token passes');
SELECT throws_ok(format('SELECT public.idem_check_token(%L, %s, %L)', 'idem_complete', :k, repeat('0', 48)), 'IDM01',
    format('idem_complete: claim lost: p_claim_token is not the token of key_id %s; nothing was changed', :k),
    'another token raises IDM01 in the calling routine''s name');
SELECT is(public.tap_check_token(:k, NULL), 'passed', 'the owner needs no token');
SET LOCAL ROLE idem_tap_dba;
SELECT public.tap_check_token(:k, NULL) AS dba_none, public.tap_check_token(:k, repeat('0', 48)) AS dba_wrong \gset
SET LOCAL ROLE idem_tap_app;
SELECT public.tap_check_token(:k, NULL) AS app_none, public.tap_check_token(:k, :'t') AS app_right,
       public.tap_check_token(:pre, NULL) AS app_pre, public.tap_check_token(:old, NULL) AS app_old_none,
       public.tap_check_token(:old, :'old_t') AS app_old, public.tap_check_token(:k, :'k_legacy') AS app_k_legacy \gset
RESET ROLE;
SELECT is((:'dba_none' || ' ' || :'dba_wrong')::text, 'passed IDM01', 'a member of idem_admin needs no token, but a wrong one still fails');
SELECT is((:'app_none')::text, 'IDM00',
    'the app''s role without a token: IDM00 (required), though the key_id is below tokenless_through');
SELECT is((:'app_right')::text, 'passed', 'the app''s role with the claim''s token passes');
SELECT is((:'app_pre')::text, 'passed', 'a claim marked as taken before tokens existed (legacy_token none) needs none');
SELECT is((:'app_old_none')::text, 'IDM00', 'a claim taken under SQL API 5 to 8 (legacy_token key_id) needs its token');
SELECT is((:'app_old')::text, 'passed', 'and passes with the key_id''s hash it was given then');
SELECT is((:'app_k_legacy')::text, 'IDM01', 'the key_id''s hash alone fits no claim taken since (no mark)');

SELECT * FROM finish();
ROLLBACK;
