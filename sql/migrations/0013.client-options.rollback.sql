-- Undo 0013: the routines that take p_key_format (dropped by name, the key check before its
-- refusal), the uuid-only CHECK and the holder's elapsed time. An opaque key cannot be served by
-- the older API, so its rows go first (the CHECK could not come back over them); loading
-- sql/functions/ of the previous version re-creates the routines as they were.
DROP FUNCTION IF EXISTS public.idem_claim;
DROP FUNCTION IF EXISTS public.idem_downstream_key;
DROP FUNCTION IF EXISTS public.idem_inspect;
DROP FUNCTION IF EXISTS public.idem_canonical_key;
DROP FUNCTION IF EXISTS public.idem_refuse_key;
DELETE FROM public.idempotency_keys
 WHERE idem_key !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
ALTER TABLE public.idempotency_keys DROP CONSTRAINT ck_idem_key_canonical;
ALTER TABLE public.idempotency_keys ADD CONSTRAINT ck_idem_key_canonical
    CHECK (idem_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$');
ALTER TYPE public.idem_claim_result DROP ATTRIBUTE IF EXISTS holder_elapsed_ms;
