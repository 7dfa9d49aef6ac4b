-- idem_key_scope
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The scope a key_id routes to. On a single node a key_id is a plain sequence value and routes
-- nowhere (NULL: the statements then find the row by key_id alone, as before); sql/citus/
-- replaces it on a distributed store, where the key_id carries the scope.
CREATE OR REPLACE FUNCTION public.idem_key_scope(p_key_id bigint)
RETURNS public.idem_user_id
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN NULL::public.idem_user_id;

COMMENT ON FUNCTION public.idem_key_scope IS
    'The scope_user_id a key_id belongs to: NULL on a single node (no routing needed); the key_id''s '
    'high bits on a distributed store (sql/citus/). Internal to the idem_* functions. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_key_scope FROM PUBLIC;
