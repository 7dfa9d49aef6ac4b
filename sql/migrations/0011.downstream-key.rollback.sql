-- Undo 0009: the downstream key's function, the heal index and the attempt column of the
-- claim's result; loading sql/functions/ of the previous version re-creates idem_claim as it was.
DROP FUNCTION IF EXISTS public.idem_downstream_key(text, integer, text, text);
DROP INDEX IF EXISTS public.idx_idem_events_heals;
ALTER TYPE public.idem_claim_result DROP ATTRIBUTE IF EXISTS attempt;
