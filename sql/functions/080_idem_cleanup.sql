-- idem_cleanup
-- Deletes every expired row, one committed batch at a time, so no transaction ever holds
-- more than a batch (a single long DELETE would hold back vacuum and lock every row it
-- touched while live claims wait). A procedure that COMMITs can be neither SECURITY
-- DEFINER nor carry SET: names are schema-qualified, and the privileged work is in
-- idem_cleanup_batch. CALL it outside a transaction block: pg_cron and the CLI do.
CREATE OR REPLACE PROCEDURE public.idem_cleanup(
    p_batch_size  integer DEFAULT 5000,
    INOUT p_deleted bigint DEFAULT NULL
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_batch integer;
BEGIN
    p_deleted := 0;
    LOOP
        v_batch := public.idem_cleanup_batch(p_batch_size, pg_catalog.clock_timestamp());
        p_deleted := p_deleted + v_batch;
        COMMIT;
        EXIT WHEN v_batch < p_batch_size;
    END LOOP;
END
$$;

COMMENT ON PROCEDURE public.idem_cleanup(integer, bigint) IS
    'Deletes all expired idempotency_keys rows in batches of p_batch_size, committing after each; '
    'reports the total in INOUT p_deleted. CALL idem_cleanup(p_batch_size => 5000); outside a '
    'transaction block. pg_cron runs it at 04:00 UTC; flask idempotency cleanup does the same. '
    'Errors: 22023 bad batch size; 2D000 when called inside a transaction block.';
