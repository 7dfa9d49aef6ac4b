-- idem_scope_join
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The scope condition of a join between a key's row and its events, which Citus needs written
-- out (it runs a correlated subquery over colocated tables only as a join on the distribution
-- column). On a single node the key_id alone joins them, and a scope condition would drop the
-- events of service calls (NULL scope): true. sql/citus/ replaces it. A SQL-standard body:
-- inlined into its caller's query, where Citus sees the join itself.
CREATE OR REPLACE FUNCTION public.idem_scope_join(p_scope public.idem_user_id, p_other_scope public.idem_user_id)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN true;

COMMENT ON FUNCTION public.idem_scope_join IS
    'Whether rows of scope p_scope and p_other_scope join: true on a single node (the key_id alone joins a '
    'key''s events); p_scope = p_other_scope on a distributed store (sql/citus/). Internal to idem_inspect. '
    'Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_scope_join FROM PUBLIC;
