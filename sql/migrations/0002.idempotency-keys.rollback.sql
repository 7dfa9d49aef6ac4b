-- Undo 0002: the functions depend on the type, so they go first. Bare names (no overloads
-- exist): whatever signature a later migration gave a routine, its name drops it.
DROP FUNCTION IF EXISTS public.idem_claim;
DROP FUNCTION IF EXISTS public.idem_complete;
DROP FUNCTION IF EXISTS public.idem_fail;
DROP FUNCTION IF EXISTS public.idem_heartbeat;
DROP FUNCTION IF EXISTS public.idem_erase_user;
DROP FUNCTION IF EXISTS public.idem_export_user;
DROP FUNCTION IF EXISTS public.idem_schema_version;
DROP FUNCTION IF EXISTS public.idem_canonical_key;
DROP FUNCTION IF EXISTS public.idem_cleanup_batch;
-- the later readers of these tables (sql/functions/045_*, 151_*)
DROP FUNCTION IF EXISTS public.idem_lost_claim_state;
DROP FUNCTION IF EXISTS public.idem_response_key_census;
-- the routing helpers (sql/functions/001_*-004_*)
DROP FUNCTION IF EXISTS public.idem_scope;
DROP FUNCTION IF EXISTS public.idem_key_scope;
DROP FUNCTION IF EXISTS public.idem_new_key_id;
DROP FUNCTION IF EXISTS public.idem_anonymous_scope;
-- the lost-claim guard and the steps sql/citus/ replaces (sql/functions/046_*, 071_*, 121_*, 152_*)
DROP FUNCTION IF EXISTS public.idem_raise_claim_lost;
DROP FUNCTION IF EXISTS public.idem_delete_expired;
DROP FUNCTION IF EXISTS public.idem_scope_join;
DROP FUNCTION IF EXISTS public.idem_reencrypt_range;
-- the definers' collation refusal and the endpoint's (sql/functions/014_*, 016_*)
DROP FUNCTION IF EXISTS public.idem_refuse_collation;
DROP FUNCTION IF EXISTS public.idem_refuse_endpoint;
DROP PROCEDURE IF EXISTS public.idem_cleanup;
DROP TABLE IF EXISTS public.idempotency_events;
DROP TYPE IF EXISTS public.idem_claim_result;
DROP TABLE IF EXISTS public.idempotency_keys;
