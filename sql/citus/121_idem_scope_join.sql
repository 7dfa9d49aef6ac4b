-- idem_scope_join (Citus)
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The join on the distribution column that Citus needs to run idem_inspect's correlated
-- subquery over the events (colocated shards). Scope is never NULL on a distributed store.
CREATE OR REPLACE FUNCTION public.idem_scope_join(p_scope public.idem_user_id, p_other_scope public.idem_user_id)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN p_scope = p_other_scope;

COMMENT ON FUNCTION public.idem_scope_join IS
    'Whether rows of scope p_scope and p_other_scope join. Distributed store (Citus): p_scope = p_other_scope, '
    'the join on the distribution column. Internal to idem_inspect. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_scope_join FROM PUBLIC;
