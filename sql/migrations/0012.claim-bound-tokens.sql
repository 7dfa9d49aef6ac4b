-- Claim tokens bound to the claim, and the claims an upgrade leaves in flight known by a mark
-- (contract §3a). From here a token is a keyed hash of the claim's key_id and its claim time
-- (idem_claim_token), so it never fits a later claim that gets the same key_id (a distributed
-- store's key_ids come round after 2^31 claims). The claims in flight at this migration keep what
-- they were given, and only they: each is marked in legacy_token, which no later claim ever sets.
-- (A range of key_ids cannot say it: on a distributed store key_ids are scope * 2^31 + sequence,
-- so migration 0008's tokenless_through covered later claims of every smaller user.)
--   'none'    claimed before migration 0008, with no token at all: completes by key_id alone;
--   'key_id'  claimed between 0008 and this migration: its token is the hash of the key_id alone.
-- Every doubt falls on 'key_id': a tokenless claim asked for a token is lost (it expires and
-- runs again), a token's claim taken for tokenless is anyone's. A claim is 'none' when:
-- - no token was ever given: the token routine of the key_id alone (idem_claim_token(bigint))
--   does not exist, so 0008 runs in this same upgrade and the code still installed hands out none;
-- - or on a single node, 0008 counted it (id <= tokenless_through): ids come from one sequence
--   there, and 0008's type lock held back every claim between its max(id) read and its commit;
-- - or on a distributed store (the citus extension), where key_ids interleave across users and
--   say nothing of time, 0008 counted it and it is older than 0008's run as recorded (by the
--   migrating client's clock: yoyo) by a margin for that clock.
-- Only rows in flight are written: no other can be acted on, and a large table is not rewritten.
-- The routines whose signature changes are dropped; sql/functions/ creates them right after.
-- depends: 0011.downstream-key
ALTER TABLE public.idempotency_keys ADD COLUMN legacy_token text;
COMMENT ON COLUMN public.idempotency_keys.legacy_token IS
    'idem: set by migration 0012 only, on the claims in flight then: none (claimed before claim tokens: completes by key_id alone) or key_id (its token is the hash of its key_id alone); NULL for every later claim';
UPDATE public.idempotency_keys SET legacy_token = 'key_id' WHERE status = 'in_flight';
-- Subqueries, not a join: on a distributed store they are evaluated first, on the coordinator.
UPDATE public.idempotency_keys SET legacy_token = 'none'
 WHERE status = 'in_flight'
   AND (pg_catalog.to_regprocedure('public.idem_claim_token(bigint)') IS NULL
        OR (id <= (SELECT s.tokenless_through FROM public.idem_secret s)
            AND (NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'citus')
                 OR created_at < (SELECT pg_catalog.max(m.applied_at_utc) AT TIME ZONE 'UTC' - interval '5 minutes'
                                    FROM public._yoyo_migration m WHERE m.migration_id = '0008.claim-token'))));
DROP FUNCTION IF EXISTS public.idem_claim_token(bigint);
DROP FUNCTION IF EXISTS public.idem_lost_claim_state(bigint);
