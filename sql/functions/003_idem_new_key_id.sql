-- idem_new_key_id
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- A new key_id: on a single node the table's own sequence, exactly as its DEFAULT; sql/citus/
-- replaces it on a distributed store with one that carries the scope.
CREATE OR REPLACE FUNCTION public.idem_new_key_id(p_scope public.idem_user_id)
RETURNS bigint
LANGUAGE sql
VOLATILE
RETURN pg_catalog.nextval('public.idempotency_keys_id_seq'::pg_catalog.regclass);

COMMENT ON FUNCTION public.idem_new_key_id IS
    'A new key_id for a claim in scope p_scope: the next value of idempotency_keys_id_seq on a single '
    'node; the scope in the high bits on a distributed store (sql/citus/). Internal to idem_claim. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_new_key_id FROM PUBLIC;
