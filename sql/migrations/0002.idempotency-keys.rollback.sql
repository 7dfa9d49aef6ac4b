-- Undo 0002: the functions depend on the type, so they go first.
DROP FUNCTION IF EXISTS public.idem_claim(text, integer, text, jsonb, interval, interval, integer, text, timestamptz, text, text);
DROP FUNCTION IF EXISTS public.idem_complete(bigint, integer, jsonb, text);
DROP FUNCTION IF EXISTS public.idem_fail(bigint, integer);
DROP FUNCTION IF EXISTS public.idem_heartbeat(bigint);
DROP FUNCTION IF EXISTS public.idem_erase_user(integer);
DROP FUNCTION IF EXISTS public.idem_export_user(integer, text, text);
DROP FUNCTION IF EXISTS public.idem_schema_version();
DROP FUNCTION IF EXISTS public.idem_canonical_key(text);
DROP FUNCTION IF EXISTS public.idem_cleanup_batch(integer, timestamptz);
-- issue 14's readers of these tables (sql/functions/045_*, 151_*)
DROP FUNCTION IF EXISTS public.idem_lost_claim_state(bigint);
DROP FUNCTION IF EXISTS public.idem_response_key_census(text);
DROP PROCEDURE IF EXISTS public.idem_cleanup(integer, bigint);
DROP PROCEDURE IF EXISTS public.idem_cleanup(integer, bigint, integer);
DROP TABLE IF EXISTS public.idempotency_events;
DROP TYPE IF EXISTS public.idem_claim_result;
DROP TABLE IF EXISTS public.idempotency_keys;
