-- Undo 0006: drop the signatures and the column it made way for; loading sql/functions/ of the
-- previous version re-creates idem_complete and idem_inspect as they were. Stored headers are lost
-- (rows replay their body as before).
DROP FUNCTION IF EXISTS public.idem_complete(bigint, integer, jsonb, text, jsonb);
DROP FUNCTION IF EXISTS public.idem_inspect(text, integer, text, boolean);
ALTER TYPE public.idem_claim_result DROP ATTRIBUTE IF EXISTS response_headers;
ALTER TABLE public.idempotency_keys DROP COLUMN IF EXISTS response_headers;
