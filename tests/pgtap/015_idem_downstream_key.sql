-- 015_idem_downstream_key: the key forwarded past the database, and the attempt count (contract §4a).
-- Cases:
--   shape: a lower-case 36-character UUID string, version 8 and variant 10; deterministic;
--   the same for the upper-case spelling of the key; contains neither the key nor the user id;
--   different for another namespace, key, user, endpoint, and for a NULL user (a service call);
--   unambiguous: moving characters between endpoint and namespace changes it;
--   stable across heals: the same value before and after two heals of one request, while the
--     claims' key_ids (and tokens) change and attempt counts 1, 2, 3;
--   attempt: counts only this (key, user, endpoint)'s heals: another user's or endpoint's heal of
--     the same key does not count; a quarantined stale holder is no heal (attempt stays);
--   p_key_format 'opaque': an opaque key has a downstream key; a UUID has the same one under
--     either format; an opaque key under the default format raises 22023;
--   bad input: a malformed key raises 22023; empty or NULL namespace and endpoint raise IDM00.
BEGIN;
SELECT plan(23);

SET LOCAL client_min_messages = error;  -- the heals' WARNINGs

INSERT INTO public.users (id, email) VALUES (1501, 'dk1@example.test'), (1502, 'dk2@example.test');

CREATE TEMP TABLE dk (name text PRIMARY KEY, v text);
INSERT INTO dk VALUES
    ('base',      public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', 'broker')),
    ('upper',     public.idem_downstream_key('B0000000-0000-4000-8000-000000000001', 1501, 'POST /live', 'broker')),
    ('stripe',    public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', 'stripe')),
    ('key2',      public.idem_downstream_key('b0000000-0000-4000-8000-000000000002', 1501, 'POST /live', 'broker')),
    ('user2',     public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1502, 'POST /live', 'broker')),
    ('service',   public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', NULL, 'POST /live', 'broker')),
    ('endpoint2', public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /paper', 'broker')),
    ('split1',    public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'ab', 'c')),
    ('split2',    public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'a', 'bc'));

SELECT matches((SELECT v FROM dk WHERE name = 'base'), '^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$',
    'a downstream key is a lower-case 36-character UUID string, version 8, variant 10');
SELECT is(public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', 'broker'),
          (SELECT v FROM dk WHERE name = 'base'), 'the downstream key of a request is deterministic');
SELECT is((SELECT v FROM dk WHERE name = 'upper'), (SELECT v FROM dk WHERE name = 'base'),
    'the upper-case spelling of the key gives the same downstream key (canonical keys)');
SELECT ok((SELECT v NOT LIKE '%b0000000%' AND v NOT LIKE '%1501%' AND v NOT LIKE '%5dd%' FROM dk WHERE name = 'base'),
    'the downstream key contains neither the client''s key nor the user id');
SELECT is((SELECT count(DISTINCT v)::int FROM dk WHERE name <> 'upper'), 8,
    'another namespace, key, user, service scope, endpoint, or a shifted field boundary each give another downstream key');
SELECT isnt((SELECT v FROM dk WHERE name = 'split1'), (SELECT v FROM dk WHERE name = 'split2'),
    'the encoding is unambiguous: (endpoint ab, namespace c) and (endpoint a, namespace bc) differ');

-- across heals -----------------------------------------------------------------------------------
CREATE TEMP TABLE got (step text PRIMARY KEY, r public.idem_claim_result);
INSERT INTO got SELECT 'first', c FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', '{"q": 1}') c;
INSERT INTO got SELECT 'heal-1', c FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', '{"q": 1}',
                                                          p_now => now() + interval '31 seconds') c;
INSERT INTO got SELECT 'second', c FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', '{"q": 1}',
                                                          p_now => now() + interval '32 seconds') c;
INSERT INTO got SELECT 'heal-2', c FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', '{"q": 1}',
                                                          p_now => now() + interval '63 seconds') c;
INSERT INTO got SELECT 'third', c FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', '{"q": 1}',
                                                         p_now => now() + interval '64 seconds') c;
SELECT results_eq($$SELECT (r).outcome, (r).attempt FROM got ORDER BY (r).key_id, (r).outcome = 'stale'$$,
    $$VALUES ('claimed'::text, 1), ('stale', NULL), ('claimed', 2), ('stale', NULL), ('claimed', 3)$$,
    'a first claim is attempt 1 and each claim after n heals is attempt n + 1; other outcomes carry none');
SELECT is((SELECT count(DISTINCT (r).key_id)::int FROM got WHERE (r).outcome = 'claimed'), 3,
    'each execution holds a claim of its own (new key_id and token: the fencing is unchanged)');
SELECT is(public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', 'broker'),
          (SELECT v FROM dk WHERE name = 'base'),
    'after two heals the request''s downstream key is the one its first execution forwarded');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 200, %L, p_claim_token => %L)',
                        (SELECT (r).key_id FROM got WHERE step = 'first'), '{"late": 1}', (SELECT (r).claim_token FROM got WHERE step = 'first')),
    'IDM01', NULL, 'the first (healed) execution still cannot complete the key: same downstream key, fenced claim');

-- what counts --------------------------------------------------------------------------------------
SELECT is((SELECT attempt FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1502, 'POST /live', '{"q": 1}')), 1,
    'another user''s claim of the same key is attempt 1: only this scope''s heals count');
SELECT is((SELECT attempt FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 1501, 'POST /other', '{"q": 1}')), 1,
    'the same key on another endpoint is attempt 1');
SELECT is((SELECT attempt FROM public.idem_claim('b0000000-0000-4000-8000-000000000003', NULL, 'POST /svc', '{}')), 1,
    'a service call (no user scope) is attempt 1 at first');
SELECT is((SELECT outcome FROM public.idem_claim('b0000000-0000-4000-8000-000000000003', NULL, 'POST /svc', '{}',
                                                  p_now => now() + interval '31 seconds')), 'stale',
    'a service call''s stale holder is healed');
SELECT is((SELECT attempt FROM public.idem_claim('b0000000-0000-4000-8000-000000000003', NULL, 'POST /svc', '{}',
                                                  p_now => now() + interval '32 seconds')), 2,
    'the service call after its heal is attempt 2 (NULL user scopes count together)');
INSERT INTO got SELECT 'q-first', c FROM public.idem_claim('b0000000-0000-4000-8000-000000000004', 1501, 'POST /q', '{}') c;
SELECT is((SELECT outcome FROM public.idem_claim('b0000000-0000-4000-8000-000000000004', 1501, 'POST /q', '{}',
                                                  p_stale_after => '1 second', p_on_stale => 'quarantine',
                                                  p_now => now() + interval '5 seconds')), 'in_flight',
    'a quarantined stale holder is not healed, so it adds no attempt');

-- bad input ------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT public.idem_downstream_key('nope', 1501, 'POST /live', 'broker')$$, '22023',
    'Idempotency-Key must be a UUID string', 'a malformed key raises 22023');
SELECT throws_ok($$SELECT public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', '')$$, 'IDM00',
    'idem_downstream_key: p_namespace must be a non-empty name of the downstream call (e.g. ''broker'')',
    'an empty namespace raises IDM00 naming the argument');
SELECT throws_ok($$SELECT public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, 'POST /live', NULL)$$, 'IDM00',
    NULL, 'a NULL namespace raises IDM00');
SELECT throws_ok($$SELECT public.idem_downstream_key('b0000000-0000-4000-8000-000000000001', 1501, '', 'broker')$$, 'IDM00',
    'idem_downstream_key: p_endpoint must be the non-empty endpoint scope of the claim', 'an empty endpoint raises IDM00');

SELECT matches(public.idem_downstream_key('Order-2026-0001-ABCD', 1501, 'POST /live', 'broker', p_key_format => 'opaque'),
    '^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$', 'an opaque key has a downstream key (a UUID)');
SELECT is(public.idem_downstream_key('B0000000-0000-4000-8000-000000000001', 1501, 'POST /live', 'broker', p_key_format => 'opaque'),
    (SELECT v FROM dk WHERE name = 'base'), 'a UUID has the same downstream key under either format');
SELECT throws_ok($$SELECT public.idem_downstream_key('Order-2026-0001-ABCD', 1501, 'POST /live', 'broker')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'an opaque key under the default format is malformed');

SELECT * FROM finish();
ROLLBACK;
