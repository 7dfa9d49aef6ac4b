-- idem_schema_version
-- The SQL API's version. The shim refuses to start against an older schema, so code
-- deployed ahead of its migration fails loudly at boot rather than on the first order.
-- Bump it whenever a function's signature or outcomes change.
CREATE OR REPLACE FUNCTION public.idem_schema_version()
RETURNS integer
LANGUAGE sql
IMMUTABLE
AS $$ SELECT 3 $$;

COMMENT ON FUNCTION public.idem_schema_version() IS
    'The idem SQL API version (2: optional response keys on idem_claim, idem_complete, idem_export_user; '
    '3: response headers: idem_complete(p_response_headers), idem_claim_result.response_headers, '
    'idem_export_user and idem_inspect show them, non-object bodies stored as {"idem_raw": ...}). '
    'The Python shim checks it at start-up.';
