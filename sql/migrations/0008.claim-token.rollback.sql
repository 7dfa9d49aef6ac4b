-- Undo 0008: the token-taking signatures, the token column of the claim's result and the
-- secret; loading sql/functions/ of the previous version re-creates the four routines as they were.
DROP FUNCTION IF EXISTS public.idem_complete(bigint, integer, jsonb, text, jsonb, text);
DROP FUNCTION IF EXISTS public.idem_fail(bigint, integer, text);
DROP FUNCTION IF EXISTS public.idem_heartbeat(bigint, text);
DROP FUNCTION IF EXISTS public.idem_record_lost_claim(bigint, text, text);
DROP FUNCTION IF EXISTS public.idem_claim_token(bigint);
DROP FUNCTION IF EXISTS public.idem_check_token(text, bigint, text);
DROP FUNCTION IF EXISTS public.idem_caller_is(text);
DROP FUNCTION IF EXISTS public.idem_credential_name(text);
ALTER TYPE public.idem_claim_result DROP ATTRIBUTE IF EXISTS claim_token;
DROP TABLE IF EXISTS public.idem_secret;
