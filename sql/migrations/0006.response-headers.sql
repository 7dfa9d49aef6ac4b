-- A replay is the same answer: the first answer's headers on the shim's allow-list
-- (Location, ETag, Content-Type, ...) are stored beside its body and come back on a replay.
-- Rows completed before this migration have response_headers NULL and replay as they did.
-- idem_complete gains p_response_headers (never overloads: the old signature goes; the function
-- file creates the new one right after), and idem_inspect gains a column (a table function's
-- result cannot change under CREATE OR REPLACE).
-- depends: 0005.cleanup-pause
ALTER TABLE public.idempotency_keys ADD COLUMN response_headers JSONB;
ALTER TYPE public.idem_claim_result ADD ATTRIBUTE response_headers jsonb;
DROP FUNCTION IF EXISTS public.idem_complete(bigint, integer, jsonb, text);
DROP FUNCTION IF EXISTS public.idem_inspect(text, integer, text, boolean);
