-- 046_idem_raise_claim_lost: the one lost-claim guard of idem_complete, idem_fail and idem_heartbeat.
-- Cases:
--   IDM01 in the caller's name, with the key_id and what became of the row (completed; no row);
--   a claim time that is not the row's: the row is another claim's, so "no row has this key_id";
--   the hint: roll back for idem_complete (inside the handler's transaction), stop working for the others;
--   no role may execute it.
BEGIN;
SELECT plan(5);

INSERT INTO public.users (id) VALUES (4601);
CREATE TEMP TABLE tok AS SELECT key_id AS id FROM public.idem_claim('a4600000-0000-4000-8000-000000000001', 4601, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok), 201, '{}');

SELECT throws_ok(format('SELECT public.idem_raise_claim_lost(%L, %s, NULL)', 'idem_fail', (SELECT id FROM tok)),
    'IDM01', format('idem_fail: claim lost: key_id %s is no longer in flight for this holder; it is completed now', (SELECT id FROM tok)),
    'IDM01 in its caller''s name, with the key_id and what the row is now');
SELECT throws_ok('SELECT public.idem_raise_claim_lost(''idem_heartbeat'', -1, NULL)',
    'IDM01', 'idem_heartbeat: claim lost: key_id -1 is no longer in flight for this holder; no row has this key_id (erased, cleaned up after expiry, or never claimed)',
    'a key_id without row or heal says no row has it');
SELECT throws_ok(format('SELECT public.idem_raise_claim_lost(%L, %s, %L)', 'idem_complete', (SELECT id FROM tok), '2001-02-03 04:05:06+00'),
    'IDM01', format('idem_complete: claim lost: key_id %s is no longer in flight for this holder; no row has this key_id (erased, cleaned up after expiry, or never claimed)', (SELECT id FROM tok)),
    'a claim time that is not the row''s: the row with its key_id is another claim''s, not this token''s');

CREATE TEMP TABLE hint (routine text PRIMARY KEY, hint text);
DO $$
DECLARE
    v_routine text;
    v_hint    text;
BEGIN
    FOREACH v_routine IN ARRAY ARRAY['idem_complete', 'idem_fail', 'idem_heartbeat'] LOOP
        BEGIN
            PERFORM public.idem_raise_claim_lost(v_routine, -1, NULL);
        EXCEPTION WHEN SQLSTATE 'IDM01' THEN
            GET STACKED DIAGNOSTICS v_hint = PG_EXCEPTION_HINT;
            INSERT INTO pg_temp.hint VALUES (v_routine, v_hint);
        END;
    END LOOP;
END
$$;
SELECT results_eq('SELECT routine, hint FROM hint ORDER BY routine',
    $$VALUES ('idem_complete', 'roll this execution back: another claim or an erasure decided this key'),
             ('idem_fail', 'stop working on this execution: another claim or an erasure decided this key'),
             ('idem_heartbeat', 'stop working on this execution: another claim or an erasure decided this key')$$,
    'the hint: roll back inside the handler''s transaction (idem_complete), stop working beside it');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_raise_claim_lost(text,bigint,timestamptz)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_raise_claim_lost(text,bigint,timestamptz)', 'EXECUTE'),
    'neither idem_app nor idem_admin may execute it');
SELECT * FROM finish();
ROLLBACK;
