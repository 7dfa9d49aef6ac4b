-- Undo 0007: the partial expiry and in-flight indexes of 0002, the default fillfactor.
ALTER TABLE public.idempotency_keys RESET (fillfactor);
CREATE INDEX idx_idem_keys_expires_finished ON public.idempotency_keys (expires_at)
    WHERE status IN ('completed','failed');
DROP INDEX public.idx_idem_keys_expires;
ALTER INDEX public.idx_idem_keys_expires_finished RENAME TO idx_idem_keys_expires;
CREATE INDEX idx_idem_keys_in_flight
    ON public.idempotency_keys (locked_at)
    WHERE status = 'in_flight';
