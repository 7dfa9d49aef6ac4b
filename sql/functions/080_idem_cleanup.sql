-- idem_cleanup
-- Committed batches, because one long DELETE would hold back vacuum and lock every row it
-- touched while live claims wait. Paced (p_max_rows_per_second), because a cleanup at full
-- speed is one more busy backend beside the claims' on the same cores: after each batch it
-- sleeps for what is left of the batch's share of a second at that pace, and at least four
-- times as long as the batch took, so it is busy a small part of the time and a claim rarely
-- waits for a CPU behind it. A procedure that COMMITs can be neither SECURITY DEFINER nor
-- carry SET, and it runs as the owner (pg_cron, a DBA): so each of its transactions pins the
-- path itself, first thing and after every COMMIT, its variables' types are qualified (they are
-- resolved before its first statement), and the privileged work is in idem_cleanup_batch.
-- It names its helpers in public, so it first checks, in pg_catalog alone, that every idem
-- routine there is still its owner's (or a superuser's), and that public is too unless idem's
-- DDL guard (985) holds: a role that owns public could otherwise replace them.
CREATE OR REPLACE PROCEDURE public.idem_cleanup(
    p_batch_size          integer DEFAULT 1000,
    INOUT p_deleted       bigint  DEFAULT NULL,
    p_pause_ms            integer DEFAULT 0,
    p_max_rows_per_second integer DEFAULT 2500
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_batch   pg_catalog.int4;
    v_msg     pg_catalog.text;
    v_plan    pg_catalog.record;
    v_started pg_catalog.timestamptz;
    v_took    pg_catalog.float8;
    v_wait    pg_catalog.float8;
    -- At most 1 / (1 + v_yield) of the time busy: a fifth of one core beside the claims.
    v_yield   constant pg_catalog.float8 := 4::pg_catalog.float8;
    v_foreign pg_catalog.text;
    v_guarded pg_catalog.bool := false;
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    -- Whether the DDL guard holds is idem_guard.idem_guard_holds()'s to say (986), asked only once
    -- it is found, in pg_catalog alone, to be a superuser's in a superuser's schema where no other
    -- role may create: the database's owner may make a schema idem_guard, and a look-alike in it,
    -- where no superuser migrated (a call it never reaches is never parsed, so none there is no error)
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                 JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                 JOIN pg_catalog.pg_roles po ON po.oid = p.proowner
                 JOIN pg_catalog.pg_roles nso ON nso.oid = n.nspowner
                WHERE n.nspname = 'idem_guard' AND p.proname = 'idem_guard_holds' AND p.pronargs = 0
                  AND po.rolsuper AND nso.rolsuper
                  AND NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(n.nspacl) a
                                    LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
                                   WHERE a.privilege_type = 'CREATE' AND NOT COALESCE(g.rolsuper, false))) THEN
        v_guarded := idem_guard.idem_guard_holds();
    END IF;
    -- GUARD: what it is about to run is its owner's: public and every idem routine in it
    SELECT pg_catalog.string_agg(pg_catalog.format('%s (owned by %s)', f.what, pg_catalog.pg_get_userbyid(f.owner)),
                                 ', ' ORDER BY f.what)
      INTO v_foreign
      FROM (SELECT 'schema public' AS what,
                   CASE WHEN n.nspowner = 'pg_database_owner'::regrole::oid THEN d.datdba ELSE n.nspowner END AS owner
              FROM pg_catalog.pg_namespace n, pg_catalog.pg_database d
             WHERE n.nspname = 'public' AND d.datname = pg_catalog.current_database()
               -- a public another role owns is safe only while idem's DDL guard holds (985)
               AND NOT v_guarded
            UNION ALL
            SELECT pg_catalog.format('routine %s', p.oid::regprocedure), p.proowner
              FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace AND pg_catalog.starts_with(p.proname, 'idem_')) f
     WHERE f.owner <> (SELECT p.proowner FROM pg_catalog.pg_proc p
                        WHERE p.oid = 'public.idem_cleanup(integer, bigint, integer, integer)'::regprocedure)
       AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = f.owner);
    IF v_foreign IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('idem_cleanup: refused: %s not the store owner''s: a role that owns public may have '
                                        'replaced them, and this would run them with the owner''s rights', v_foreign),
            HINT = 'as a superuser: idem migrate (it makes the DDL guard), or ALTER SCHEMA public OWNER TO <the store''s owner>; then idem migrate '
                   '(it names what to drop; docs/operations.md#the-schema-and-host-tables-idem-trusts)';
    END IF;
    -- GUARD: inside a transaction block the COMMITs below cannot run. PostgreSQL tells a
    -- procedure so only by refusing a COMMIT: one tried inside this sub-block fails either way,
    -- and its message says which - 'invalid transaction termination' in a transaction block
    -- (atomic context), 'cannot commit while a subtransaction is active' outside one. (With
    -- lc_messages in another language the text differs and PostgreSQL's own 2D000 stands.)
    BEGIN
        COMMIT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);  -- never reached (the rule: after every COMMIT)
    EXCEPTION WHEN invalid_transaction_termination THEN
        GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT;
    END;
    IF v_msg = 'invalid transaction termination' THEN
        RAISE EXCEPTION USING ERRCODE = '2D000',
            MESSAGE = 'idem_cleanup: CALL it outside a transaction block: it commits after each batch',
            HINT = 'run it on its own (autocommit), not after BEGIN or inside a function; in psql: ROLLBACK, then CALL public.idem_cleanup();';
    END IF;

    -- GUARD: a pause is a short, non-negative number of milliseconds
    IF p_pause_ms IS NULL OR p_pause_ms < 0 OR p_pause_ms > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_cleanup: p_pause_ms must be between 0 and 10000 (got %s)',
                                        COALESCE(p_pause_ms::text, 'NULL'));
    END IF;

    -- GUARD: a pace is a positive number of rows a second, or NULL (unpaced)
    IF p_max_rows_per_second IS NOT NULL AND p_max_rows_per_second <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_cleanup: p_max_rows_per_second must be positive (got %s); NULL runs unpaced',
                                        p_max_rows_per_second);
    END IF;

    -- A pace too slow to delete what has expired before tomorrow's run still runs, and says so.
    SELECT * INTO v_plan FROM public.idem_cleanup_plan(p_max_rows_per_second);
    IF NOT v_plan.fits THEN
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format(
                'idem_cleanup: at p_max_rows_per_second => %s the %s expired rows take %s, longer than the %s to the next daily run',
                p_max_rows_per_second, v_plan.expired, pg_catalog.date_trunc('second', v_plan.takes), v_plan.every),
            HINT = 'raise p_max_rows_per_second (in the pg_cron command and for flask idempotency cleanup --max-rows-per-second)';
    END IF;

    p_deleted := 0;
    LOOP
        v_started := pg_catalog.clock_timestamp();
        v_batch := public.idem_cleanup_batch(p_batch_size);  -- its own clock: p_now is the owner's
        p_deleted := p_deleted + v_batch;
        COMMIT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        EXIT WHEN v_batch < p_batch_size;
        IF p_max_rows_per_second IS NOT NULL THEN
            -- Per batch, never to catch up (a batch that waited on a lock is no reason for a
            -- burst), and never less than v_yield times the batch's own time: on a busy server
            -- batches take longer, and the cleanup then yields more rather than less.
            v_took := extract(epoch FROM pg_catalog.clock_timestamp() - v_started)::double precision;
            v_wait := GREATEST(v_batch::double precision / p_max_rows_per_second - v_took, v_yield * v_took);
            IF v_wait > 0 THEN
                PERFORM pg_catalog.pg_sleep(v_wait);
            END IF;
        END IF;
        IF p_pause_ms > 0 THEN
            PERFORM pg_catalog.pg_sleep(p_pause_ms / 1000.0);
        END IF;
    END LOOP;
END
$$;

COMMENT ON PROCEDURE public.idem_cleanup IS
    'Deletes all expired idempotency_keys rows in batches of p_batch_size, committing after each, so no '
    'transaction holds more than a batch; paced at p_max_rows_per_second (default 2500: 1 M rows in about seven '
    'minutes, claims beside it keep their p99 within 2x; NULL runs unpaced) and sleeping at least 4 times as long as each '
    'batch took (a busy server makes it yield more), with a NOTICE when that pace cannot delete '
    'what has expired before the next daily run; p_pause_ms (default 0) adds a fixed sleep between batches; '
    'reports the total in INOUT p_deleted. CALL public.idem_cleanup(); outside a transaction block. pg_cron runs it '
    'at 04:00 UTC; flask idempotency cleanup does the same with the same defaults. '
    'Errors: 42501 "idem_cleanup: refused" when public or an idem routine in it is no longer the store owner''s '
    '(a superuser''s is); IDM00 bad batch size, pause or pace (p_max_rows_per_second <= 0); 2D000 "idem_cleanup: CALL it '
    'outside a transaction block" when called inside one (it commits after each batch).';
