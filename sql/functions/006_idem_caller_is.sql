-- idem_caller_is
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- Inside a SECURITY DEFINER routine current_user is the owner, so the caller is read from the
-- session: the role SET ROLE (or `-c role=`) chose, else the login role. Only the error and
-- test paths call it (p_now given, a claim token omitted), so the request path pays nothing.
-- Never granted: it answers for the definers that call it. A SQL-standard body: its names are
-- resolved once, when it is created.
CREATE OR REPLACE FUNCTION public.idem_caller_is(p_what text)
RETURNS boolean
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT pg_catalog.pg_has_role(c.caller, t.relowner, 'USAGE')
        OR (p_what OPERATOR(pg_catalog.=) 'admin' AND pg_catalog.pg_has_role(c.caller, 'idem_admin', 'USAGE'))
      FROM (SELECT COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), SESSION_USER::text)::name AS caller) c,
           pg_catalog.pg_class t
     WHERE t.oid = 'public.idem_secret'::pg_catalog.regclass;
END;

COMMENT ON FUNCTION public.idem_caller_is IS
    'Whether the role calling the SQL API (SET ROLE''s role, else the login role) is the functions'' owner '
    '(p_what => ''owner'': a superuser or a member of the role that owns the store; what p_now needs) or '
    'may act as a DBA (p_what => ''admin'': the owner or a member of idem_admin; what a call without a claim '
    'token needs). Internal: no role may execute it. Errors: none.';
