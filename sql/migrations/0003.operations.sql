-- Day-two operations: what the DBA's functions and view need that cannot be
-- re-run. The functions and the idem_health view themselves live in sql/functions/1xx_*.sql.
-- depends: 0002.idempotency-keys

-- idem_record_lost_claim and idem_inspect look events up by the key they concern.
CREATE INDEX idx_idem_events_key_id
    ON public.idempotency_events (key_id)
    WHERE key_id IS NOT NULL;

-- At most one lost_claim event per claim token: the shim reports a lost claim after its
-- rollback, and a retried report must not count twice.
CREATE UNIQUE INDEX uq_idem_events_lost_claim
    ON public.idempotency_events (key_id)
    WHERE event = 'lost_claim';
