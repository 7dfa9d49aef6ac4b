-- idem_user_id_type
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The type of the user scope (integer, bigint or uuid): the base of the domain public.idem_user_id,
-- which migration 0017 made from the host's users table, fixed at install. Reads pg_type; the
-- domain is bound by OID when this is created, so no name resolves when it runs.
CREATE OR REPLACE FUNCTION public.idem_user_id_type()
RETURNS pg_catalog.regtype
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN (SELECT t.typbasetype::pg_catalog.regtype FROM pg_catalog.pg_type t
         WHERE t.oid OPERATOR(pg_catalog.=) 'public.idem_user_id'::pg_catalog.regtype::pg_catalog.oid);

COMMENT ON FUNCTION public.idem_user_id_type IS
    'The user scope''s type: integer, bigint or uuid, the id type of the host''s users table recorded in '
    'public.idem_host_users (migration 0017). Internal to idem_downstream_key. Errors: none.';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_user_id_type FROM PUBLIC;
