-- idem_schema_version
-- Why: the shim refuses to start against an older schema, so code deployed ahead of its
-- migration fails loudly at boot rather than on the first order. Bump it whenever a
-- signature, an outcome or a SQLSTATE changes (sql/README.md, "Changing a signature").
CREATE OR REPLACE FUNCTION public.idem_schema_version()
RETURNS integer
LANGUAGE sql
IMMUTABLE
AS $$ SELECT 5 $$;

COMMENT ON FUNCTION public.idem_schema_version IS
    'The idem SQL API version (3: response headers: idem_complete(p_response_headers), '
    'idem_claim_result.response_headers, idem_export_user and idem_inspect show them, non-object bodies '
    'stored as {"idem_raw": ...}; 4: 22023 only for a malformed key, IDM00 for a bad argument, IDM04 for a '
    'refused response; one message prefix per routine; 5: idem_cleanup(p_max_rows_per_second) paces itself, '
    'default batch 1000, and idem_cleanup_plan). The Python shim checks it at start-up.';
