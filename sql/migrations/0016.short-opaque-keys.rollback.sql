-- Undo 0016: the CHECK of 0013 (opaque keys of 16 to 255 characters). A shorter opaque key cannot
-- be served by the older API, so its rows go first (the CHECK could not come back over them);
-- loading sql/functions/ of the previous version re-creates idem_canonical_key without
-- 'opaque_short'.
DELETE FROM public.idempotency_keys
 WHERE idem_key !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
   AND idem_key !~ '^[!-~]{16,255}$';
ALTER TABLE public.idempotency_keys DROP CONSTRAINT ck_idem_key_canonical;
ALTER TABLE public.idempotency_keys ADD CONSTRAINT ck_idem_key_canonical
    CHECK (idem_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
           OR (idem_key ~ '^[!-~]{16,255}$'
               AND idem_key !~ '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'));
