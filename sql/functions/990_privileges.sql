-- Privileges, re-applied after every migrate (CREATE OR REPLACE keeps grants, but a new
-- function starts executable by PUBLIC). The app role may execute the API and nothing
-- else: it cannot read or write idempotency_keys, only go through these functions.
REVOKE ALL ON FUNCTION
    public.idem_schema_version,
    public.idem_canonical_key,
    public.idem_claim,
    public.idem_complete,
    public.idem_fail,
    public.idem_heartbeat,
    public.idem_lost_claim_state,
    public.idem_erase_user,
    public.idem_export_user,
    public.idem_cleanup_batch,
    public.idem_cleanup_plan
FROM PUBLIC;
REVOKE ALL ON PROCEDURE public.idem_cleanup FROM PUBLIC;

-- Operations (issue 5). The schedule belongs to whoever migrates, and idem_inspect shows
-- keys and bodies: DBAs only. idem_health exposes aggregates only (no key, user, hash or
-- body), so the app may read it (`flask idempotency stats`); the shim reports lost claims.
-- The encryption helpers run inside the SECURITY DEFINER API only; the app (which holds the
-- keys) runs the rotation (`flask idempotency rotate-response-key`).
REVOKE ALL ON FUNCTION
    public.idem_schedule_cleanup,
    public.idem_inspect,
    public.idem_health,
    public.idem_record_lost_claim,
    public.idem_response_key_id,
    public.idem_encrypt_response,
    public.idem_decrypt_response,
    public.idem_reencrypt_responses,
    public.idem_response_key_census
FROM PUBLIC;
REVOKE ALL ON public.idem_health FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    public.idem_health,
    public.idem_record_lost_claim,
    public.idem_reencrypt_responses,
    public.idem_response_key_census
TO idem_app;
GRANT SELECT ON public.idem_health TO idem_app;

GRANT EXECUTE ON FUNCTION
    public.idem_schema_version,
    public.idem_canonical_key,
    public.idem_claim,
    public.idem_complete,
    public.idem_fail,
    public.idem_heartbeat,
    public.idem_erase_user,
    public.idem_export_user,
    public.idem_cleanup_batch,
    public.idem_cleanup_plan
TO idem_app;
GRANT EXECUTE ON PROCEDURE public.idem_cleanup TO idem_app;
