-- on_failure="release": a failed attempt may free its key instead of blocking it, so
-- the client's retry with the same key runs again. idem_fail gains p_release (never overloads:
-- the old signature goes; sql/functions/030 creates the new one right after), and the events
-- log gains the `released` event a DBA reads beside stale heals and lost claims.
-- depends: 0008.claim-token
ALTER TABLE public.idempotency_events DROP CONSTRAINT idempotency_events_event_check;
ALTER TABLE public.idempotency_events ADD CONSTRAINT idempotency_events_event_check
    CHECK (event IN ('stale_heal','lost_claim','erasure','released'));
DROP FUNCTION IF EXISTS public.idem_fail(bigint, integer, text);
