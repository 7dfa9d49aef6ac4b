-- 080_idem_cleanup: the procedure that runs idem_cleanup_batch until nothing has expired,
-- committing after each batch. Because it COMMITs, this file runs outside a transaction block
-- (pg_prove's psql is in autocommit): each CALL comes from a top-level DO block, the one place
-- PL/pgSQL may call a committing procedure, and records what it saw in a temporary table. The
-- rows it creates are its own (user 8001, endpoint 'ep:080') and are deleted at the end.
-- Cases:
--   inside a transaction block (here: inside a function, as pgTAP runs a statement) it refuses
--     with 2D000 and deletes nothing;
--   it deletes every expired row, across several batches, and reports the total in p_deleted;
--     unexpired rows stay; a second CALL finds nothing (0);
--   p_pause_ms sleeps between full batches (two pauses of 50 ms: at least 100 ms);
--   p_pause_ms out of [0, 10000] or NULL, and a bad p_batch_size, raise IDM00.
SELECT plan(9);

INSERT INTO public.users (id) VALUES (8001);
CREATE TEMP TABLE seen (name text PRIMARY KEY, value text);

-- Five expired completed rows and two live ones.
SELECT count(public.idem_complete(c.key_id, 201, '{}'))
  FROM generate_series(1, 7) g,
       public.idem_claim(format('a0800000-0000-4000-8000-%s', lpad(g::text, 12, '0')), 8001, 'ep:080', '{}',
                         p_ttl => '1 hour', p_now => CASE WHEN g <= 5 THEN now() - interval '2 hours' ELSE now() END) c;

SELECT throws_ok('CALL public.idem_cleanup()', '2D000',
    'idem_cleanup: CALL it outside a transaction block: it commits after each batch',
    'inside a transaction block (a function) it refuses with 2D000');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE scope_endpoint = 'ep:080'), 7,
    'the refused CALL deleted nothing');

DO $$
DECLARE
    v_deleted bigint;
    v_started timestamptz := clock_timestamp();
BEGIN
    CALL public.idem_cleanup(p_batch_size => 2, p_deleted => v_deleted, p_pause_ms => 50);
    INSERT INTO pg_temp.seen VALUES ('first', v_deleted::text),
                                    ('elapsed_ms', (extract(epoch FROM clock_timestamp() - v_started) * 1000)::int::text);
    CALL public.idem_cleanup(p_deleted => v_deleted);
    INSERT INTO pg_temp.seen VALUES ('second', v_deleted::text);
END
$$;

-- Argument errors, from autocommit: in a function or an exception block the transaction guard
-- would answer first. psql keeps going past them here and records each one's SQLSTATE (the
-- error line itself goes to stderr).
\set ON_ERROR_STOP 0
CALL public.idem_cleanup(p_pause_ms => -1);
INSERT INTO seen VALUES ('pause_negative', :'LAST_ERROR_SQLSTATE');
CALL public.idem_cleanup(p_pause_ms => 10001);
INSERT INTO seen VALUES ('pause_too_long', :'LAST_ERROR_SQLSTATE');
CALL public.idem_cleanup(p_pause_ms => NULL);
INSERT INTO seen VALUES ('pause_null', :'LAST_ERROR_SQLSTATE');
CALL public.idem_cleanup(p_batch_size => 0);
INSERT INTO seen VALUES ('batch_zero', :'LAST_ERROR_SQLSTATE');
\set ON_ERROR_STOP 1

SELECT is((SELECT value FROM seen WHERE name = 'first'), '5',
    'p_deleted reports every expired row, deleted over three batches of at most 2');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE scope_endpoint = 'ep:080'), 2,
    'the two unexpired rows stay');
SELECT is((SELECT value FROM seen WHERE name = 'second'), '0', 'a second CALL finds nothing to delete');
SELECT cmp_ok((SELECT value::int FROM seen WHERE name = 'elapsed_ms'), '>=', 100,
    'p_pause_ms => 50 slept after each of the two full batches');
SELECT is((SELECT array_agg(value ORDER BY name) FROM seen WHERE name LIKE 'pause_%'), ARRAY['IDM00', 'IDM00', 'IDM00'],
    'p_pause_ms NULL, negative or above 10000 raises IDM00');
SELECT is((SELECT value FROM seen WHERE name = 'batch_zero'), 'IDM00', 'a batch size of 0 raises IDM00 (from the batch)');
SELECT ok(NOT p.prosecdef AND p.proconfig IS NULL, 'a committing procedure is neither SECURITY DEFINER nor SET')
  FROM pg_proc p WHERE p.oid = 'public.idem_cleanup'::regproc;

SELECT * FROM finish();

DELETE FROM public.idempotency_keys WHERE scope_endpoint = 'ep:080';
DELETE FROM public.users WHERE id = 8001;
