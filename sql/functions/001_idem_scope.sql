-- idem_scope
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The store's scope_user_id for a claim. On a single node the user itself (NULL for a service
-- call: UNIQUE NULLS NOT DISTINCT dedupes it); sql/citus/ replaces it on a distributed store.
-- A SQL-standard body, like every helper of the request path: PostgreSQL resolves its names when
-- it is created (under idem migrate's pinned path), none when it runs, and still inlines it.
CREATE OR REPLACE FUNCTION public.idem_scope(p_user_id public.idem_user_id)
RETURNS public.idem_user_id
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN p_user_id;

COMMENT ON FUNCTION public.idem_scope IS
    'The store''s scope_user_id for a claim of p_user_id: p_user_id itself on a single node (NULL for '
    'a service call); 0 for NULL on a distributed store (sql/citus/). Internal to the idem_* functions. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_scope FROM PUBLIC;
