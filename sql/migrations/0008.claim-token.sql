-- The privilege boundary (contract §3a). A claim's completion, failure, heartbeat and
-- lost-claim report need the token the claim returned, not only its sequential key_id: the
-- token is a keyed hash of the key_id under a random secret that no role but the owner can
-- read (idem_secret), so it is checked without a column or a lookup of its own, even after the
-- row is gone. Claims taken before this migration had no token: key_ids up to the newest one at
-- migration time stay completable without one (an upgrade under traffic loses no request).
-- The four routines gain p_claim_token (never overloads: the old signatures go; the function
-- files create the new ones right after).
-- depends: 0007.hot-completion
-- The result type first: its lock holds back the claims that would otherwise commit between
-- the max(id) read below and this migration's commit, tokenless but past the mark.
ALTER TYPE public.idem_claim_result ADD ATTRIBUTE claim_token text;
CREATE TABLE public.idem_secret (
    singleton          boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    secret             bytea   NOT NULL CHECK (pg_catalog.octet_length(secret) >= 30),
    tokenless_through  bigint  NOT NULL
);
COMMENT ON TABLE public.idem_secret IS
    'idem: the key of claim tokens and downstream keys (owner only; never granted). Rotating it voids every in-flight claim token.';
REVOKE ALL ON public.idem_secret FROM PUBLIC;
-- Two version-4 UUIDs: 244 bits from the server's strong random source (no pgcrypto needed).
INSERT INTO public.idem_secret (secret, tokenless_through)
SELECT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', ''), 'hex'),
       COALESCE((SELECT pg_catalog.max(k.id) FROM public.idempotency_keys k), 0);
DROP FUNCTION IF EXISTS public.idem_complete(bigint, integer, jsonb, text, jsonb);
DROP FUNCTION IF EXISTS public.idem_fail(bigint, integer);
DROP FUNCTION IF EXISTS public.idem_heartbeat(bigint);
DROP FUNCTION IF EXISTS public.idem_record_lost_claim(bigint, text);
