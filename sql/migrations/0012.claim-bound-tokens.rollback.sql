-- Undo 0012: the claim-bound token and its helpers (dropped by name: the new signatures; the test
-- of a token, then the token's formula after the token built on it), the key
-- check built on the refusal (a SQL-standard body depends on what it calls), and the mark;
-- loading sql/functions/ of the previous version re-creates the routines as they were.
DROP FUNCTION IF EXISTS public.idem_token_fits;
DROP FUNCTION IF EXISTS public.idem_claim_token;
DROP FUNCTION IF EXISTS public.idem_token_hash;
DROP FUNCTION IF EXISTS public.idem_token_claimed_at;
DROP FUNCTION IF EXISTS public.idem_lost_claim_state;
DROP FUNCTION IF EXISTS public.idem_canonical_key;
DROP FUNCTION IF EXISTS public.idem_refuse_key;
ALTER TABLE public.idempotency_keys DROP COLUMN IF EXISTS legacy_token;
