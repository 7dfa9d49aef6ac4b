-- Exactly-once past the database (contract §4a). A claim tells its handler which
-- execution it is: idem_claim_result.attempt, 1 + the stale heals of the same (key, user,
-- endpoint) recorded before this claim. The heal still deletes the row (every §3 outcome and the
-- heal race stay as they were); its stale_heal event is what remembers it, and this index, which
-- only heals write to, is what the claimed path probes (an empty range on the common path).
-- idem_downstream_key (sql/functions/160) derives the key a handler forwards to a broker or to
-- Stripe from the same secret as the claim tokens (idem_secret, migration 0008).
-- depends: 0010.cleanup-pace
ALTER TYPE public.idem_claim_result ADD ATTRIBUTE attempt integer;
CREATE INDEX idx_idem_events_heals
    ON public.idempotency_events (scope_endpoint, (detail ->> 'idem_key'), key_id)
    WHERE event = 'stale_heal';
