-- idem_anonymous_scope (Citus)
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The erasure's event must not name its user, yet must land on the user's shard, or the erasure
-- would write two shards (two workers: two-phase commit). A negative value (no user has one:
-- docs/scaling.md) hashing to that shard: the first of -1, -2, ... (about one try per shard).
CREATE OR REPLACE FUNCTION public.idem_anonymous_scope(p_user_id public.idem_user_id)
RETURNS public.idem_user_id
LANGUAGE sql
STABLE
PARALLEL SAFE
BEGIN ATOMIC
    SELECT -g FROM pg_catalog.generate_series(1, 1000000) g
     WHERE pg_catalog.get_shard_id_for_distribution_column('public.idempotency_events'::pg_catalog.regclass, -g)
           = pg_catalog.get_shard_id_for_distribution_column('public.idempotency_events'::pg_catalog.regclass, p_user_id)
     LIMIT 1;
END;

COMMENT ON FUNCTION public.idem_anonymous_scope IS
    'The scope_user_id of an event that must not name p_user_id but lives beside its rows. Distributed '
    'store (Citus): the first negative value on p_user_id''s shard. Internal to idem_erase_user. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_anonymous_scope FROM PUBLIC;
