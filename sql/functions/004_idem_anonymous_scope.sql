-- idem_anonymous_scope
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- Where a record that must not name its user (the erasure's own event) is kept: no scope on a
-- single node (NULL); sql/citus/ replaces it on a distributed store, where the row needs a
-- distribution value on the erased user's shard that is not the user.
CREATE OR REPLACE FUNCTION public.idem_anonymous_scope(p_user_id public.idem_user_id)
RETURNS public.idem_user_id
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN NULL::public.idem_user_id;

COMMENT ON FUNCTION public.idem_anonymous_scope IS
    'The scope_user_id of an event that must not name p_user_id but lives beside its rows: NULL on a '
    'single node; on a distributed store (sql/citus/) a negative value on p_user_id''s shard. Internal to '
    'idem_erase_user. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_anonymous_scope FROM PUBLIC;
