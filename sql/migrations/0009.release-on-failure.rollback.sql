-- Undo 0009: drop the signature with p_release (loading sql/functions/ of the previous version
-- re-creates idem_fail as it was) and the `released` events with their CHECK value.
DROP FUNCTION IF EXISTS public.idem_fail(bigint, integer, text, boolean);
DELETE FROM public.idempotency_events WHERE event = 'released';
ALTER TABLE public.idempotency_events DROP CONSTRAINT idempotency_events_event_check;
ALTER TABLE public.idempotency_events ADD CONSTRAINT idempotency_events_event_check
    CHECK (event IN ('stale_heal','lost_claim','erasure'));
