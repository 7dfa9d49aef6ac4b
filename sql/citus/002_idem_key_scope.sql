-- idem_key_scope (Citus)
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- A key_id carries its scope in its high bits (public.idem_new_key_id), so idem_complete,
-- idem_fail and idem_heartbeat name the row's shard without a lookup across shards.
CREATE OR REPLACE FUNCTION public.idem_key_scope(p_key_id bigint)
RETURNS public.idem_user_id
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
-- A key_id no claim could have made (its high bits are no integer) routes nowhere: NULL, and
-- the caller's statement then finds no row (IDM01), never 22003.
RETURN CASE WHEN (p_key_id >> 31) BETWEEN -2147483648 AND 2147483647
            THEN (p_key_id >> 31)::integer END;

COMMENT ON FUNCTION public.idem_key_scope IS
    'The scope_user_id a key_id belongs to. Distributed store (Citus): the key_id''s high bits '
    '(key_id = scope * 2^31 + sequence mod 2^31). Internal to the idem_* functions. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_key_scope FROM PUBLIC;
