-- idem_scope (Citus)
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The distribution value of a claim: Citus refuses a NULL distribution value, so a service call
-- (no user) is scoped to the reserved user 0, which keeps its keys deduplicated (contract §8).
CREATE OR REPLACE FUNCTION public.idem_scope(p_user_id public.idem_user_id)
RETURNS public.idem_user_id
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN COALESCE(p_user_id, 0);

COMMENT ON FUNCTION public.idem_scope IS
    'The store''s scope_user_id for a claim of p_user_id. Distributed store (Citus): p_user_id, or 0 '
    '(the reserved user of service calls) for NULL. Internal to the idem_* functions. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_scope FROM PUBLIC;
