-- idem_cleanup
-- Committed batches, because one long DELETE would hold back vacuum and lock every row it
-- touched while live claims wait. A procedure that COMMITs can be neither SECURITY DEFINER
-- nor carry SET: names are schema-qualified, and the privileged work is in idem_cleanup_batch.
CREATE OR REPLACE PROCEDURE public.idem_cleanup(
    p_batch_size  integer DEFAULT 5000,
    INOUT p_deleted bigint DEFAULT NULL,
    p_pause_ms    integer DEFAULT 0
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_batch integer;
    v_msg   text;
BEGIN
    -- GUARD: inside a transaction block the COMMITs below cannot run. PostgreSQL tells a
    -- procedure so only by refusing a COMMIT: one tried inside this sub-block fails either way,
    -- and its message says which - 'invalid transaction termination' in a transaction block
    -- (atomic context), 'cannot commit while a subtransaction is active' outside one. (With
    -- lc_messages in another language the text differs and PostgreSQL's own 2D000 stands.)
    BEGIN
        COMMIT;
    EXCEPTION WHEN invalid_transaction_termination THEN
        GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT;
    END;
    IF v_msg = 'invalid transaction termination' THEN
        RAISE EXCEPTION USING ERRCODE = '2D000',
            MESSAGE = 'idem_cleanup: CALL it outside a transaction block: it commits after each batch',
            HINT = 'run it on its own (autocommit), not after BEGIN or inside a function; in psql: ROLLBACK, then CALL idem_cleanup();';
    END IF;

    -- GUARD: a pause is a short, non-negative number of milliseconds
    IF p_pause_ms IS NULL OR p_pause_ms < 0 OR p_pause_ms > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_cleanup: p_pause_ms must be between 0 and 10000 (got %s)',
                                        COALESCE(p_pause_ms::text, 'NULL'));
    END IF;
    p_deleted := 0;
    LOOP
        v_batch := public.idem_cleanup_batch(p_batch_size);  -- its own clock: p_now is the owner's
        p_deleted := p_deleted + v_batch;
        COMMIT;
        EXIT WHEN v_batch < p_batch_size;
        IF p_pause_ms > 0 THEN
            PERFORM pg_catalog.pg_sleep(p_pause_ms / 1000.0);
        END IF;
    END LOOP;
END
$$;

COMMENT ON PROCEDURE public.idem_cleanup IS
    'Deletes all expired idempotency_keys rows in batches of p_batch_size, committing after each, so no '
    'transaction holds more than a batch; p_pause_ms (default 0) sleeps between batches, a lever for a '
    'server whose disk is the bottleneck; '
    'reports the total in INOUT p_deleted. CALL idem_cleanup(p_batch_size => 5000); outside a '
    'transaction block. pg_cron runs it at 04:00 UTC; flask idempotency cleanup does the same. '
    'Errors: IDM00 bad batch size or pause; 2D000 "idem_cleanup: CALL it outside a transaction block" when '
    'called inside one (it commits after each batch).';
