-- Privileges, re-applied after every migrate (CREATE OR REPLACE keeps grants, but a new
-- function starts executable by PUBLIC). The app role may execute the API and nothing
-- else: it cannot read or write idempotency_keys, only go through these functions.
REVOKE ALL ON FUNCTION
    public.idem_schema_version(),
    public.idem_canonical_key(text),
    public.idem_claim(text, integer, text, jsonb, interval, interval, integer, text, timestamptz, text, text),
    public.idem_complete(bigint, integer, jsonb, text),
    public.idem_fail(bigint, integer),
    public.idem_heartbeat(bigint),
    public.idem_lost_claim_state(bigint),
    public.idem_erase_user(integer),
    public.idem_export_user(integer, text, text),
    public.idem_cleanup_batch(integer, timestamptz)
FROM PUBLIC;
REVOKE ALL ON PROCEDURE public.idem_cleanup(integer, bigint, integer) FROM PUBLIC;

-- Operations (issue 5). The schedule belongs to whoever migrates, and idem_inspect shows
-- keys and bodies: DBAs only. idem_health exposes aggregates only (no key, user, hash or
-- body), so the app may read it (`flask idempotency stats`); the shim reports lost claims.
-- The encryption helpers run inside the SECURITY DEFINER API only; the app (which holds the
-- keys) runs the rotation (`flask idempotency rotate-response-key`).
REVOKE ALL ON FUNCTION
    public.idem_schedule_cleanup(text),
    public.idem_inspect(text, integer, text, boolean),
    public.idem_health(interval, interval, timestamptz),
    public.idem_record_lost_claim(bigint, text),
    public.idem_response_key_id(text),
    public.idem_encrypt_response(jsonb, text),
    public.idem_decrypt_response(jsonb, text, text),
    public.idem_reencrypt_responses(text, text, bigint, integer),
    public.idem_response_key_census(text)
FROM PUBLIC;
REVOKE ALL ON public.idem_health FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    public.idem_health(interval, interval, timestamptz),
    public.idem_record_lost_claim(bigint, text),
    public.idem_reencrypt_responses(text, text, bigint, integer),
    public.idem_response_key_census(text)
TO idem_app;
GRANT SELECT ON public.idem_health TO idem_app;

GRANT EXECUTE ON FUNCTION
    public.idem_schema_version(),
    public.idem_canonical_key(text),
    public.idem_claim(text, integer, text, jsonb, interval, interval, integer, text, timestamptz, text, text),
    public.idem_complete(bigint, integer, jsonb, text),
    public.idem_fail(bigint, integer),
    public.idem_heartbeat(bigint),
    public.idem_erase_user(integer),
    public.idem_export_user(integer, text, text),
    public.idem_cleanup_batch(integer, timestamptz)
TO idem_app;
GRANT EXECUTE ON PROCEDURE public.idem_cleanup(integer, bigint, integer) TO idem_app;
