-- Privileges, re-applied after every migrate (CREATE OR REPLACE keeps grants, but a new
-- function starts executable by PUBLIC). Four roles, by who calls what (contract §3a): idem_app,
-- the request path; idem_dsr, the GDPR job's (a data subject's export and erasure); idem_monitor,
-- a metrics exporter's (the health aggregates); idem_admin, the DBA's, pg_cron's and the CLI's
-- admin verbs. None can read or write the tables; all go through these functions. Whatever a
-- role does not need it does not get: a handler's SQL injection runs as idem_app, and must not be
-- able to delete live keys, re-key stored bodies, read them, or read or free another user's keys.
REVOKE ALL ON FUNCTION
    public.idem_schema_version,
    public.idem_refuse_key,
    public.idem_refuse_collation,
    public.idem_refuse_endpoint,
    public.idem_canonical_key,
    public.idem_caller_is,
    public.idem_token_hash,
    public.idem_claim_token,
    public.idem_token_claimed_at,
    public.idem_check_token,
    public.idem_token_fits,
    public.idem_credential_name,
    public.idem_claim,
    public.idem_downstream_key,
    public.idem_complete,
    public.idem_fail,
    public.idem_heartbeat,
    public.idem_lost_claim_state,
    public.idem_raise_claim_lost,
    public.idem_erase_user,
    public.idem_export_user,
    public.idem_cleanup_batch,
    public.idem_delete_expired,
    public.idem_cleanup_job,
    public.idem_cleanup_plan,
    public.idem_schedule_cleanup,
    public.idem_inspect,
    public.idem_scope_join,
    public.idem_health,
    public.idem_record_lost_claim,
    public.idem_response_key_id,
    public.idem_encrypt_response,
    public.idem_decrypt_response,
    public.idem_reencrypt_responses,
    public.idem_reencrypt_range,
    public.idem_response_key_census
FROM PUBLIC;
REVOKE ALL ON PROCEDURE public.idem_cleanup FROM PUBLIC;
REVOKE ALL ON public.idem_health FROM PUBLIC;

-- idem_app: one request's steps and the lost-claim report (fenced by the claim's token), and
-- nothing else (contract §3a: the shim reads the SQL API version from the catalog). Revoked first, so
-- an upgrade from a version that granted more takes it back: cleanup, health, rotation, the
-- version and key helpers (SQL API <= 4), export and erasure (<= 8), which would let a handler
-- read another user's raw keys and free them for a forged answer.
REVOKE ALL ON FUNCTION
    public.idem_erase_user,
    public.idem_export_user,
    public.idem_schema_version,
    public.idem_canonical_key,
    public.idem_cleanup_batch,
    public.idem_cleanup_plan,
    public.idem_health,
    public.idem_reencrypt_responses,
    public.idem_response_key_census
FROM idem_app;
REVOKE ALL ON PROCEDURE public.idem_cleanup FROM idem_app;
REVOKE ALL ON public.idem_health FROM idem_app;
GRANT EXECUTE ON FUNCTION
    public.idem_claim,
    public.idem_downstream_key,
    public.idem_complete,
    public.idem_fail,
    public.idem_heartbeat,
    public.idem_record_lost_claim
TO idem_app;

-- idem_dsr: a data subject's access, portability and erasure (the GDPR job), nothing more.
GRANT EXECUTE ON FUNCTION public.idem_export_user, public.idem_erase_user TO idem_dsr;

-- idem_monitor: the health aggregates (no key, user, hash or body), for a metrics exporter such
-- as the shim's store gauges (GRANT idem_monitor TO the role that serves /metrics).
GRANT EXECUTE ON FUNCTION public.idem_health TO idem_monitor;
GRANT SELECT ON public.idem_health TO idem_monitor;

-- idem_admin: cleanup, key rotation, inspection, health and scheduling (granted to DBAs with
-- GRANT idem_admin TO <role>; pg_cron runs the job as the role that scheduled it). It may also
-- call the request-path functions by key_id alone, without a claim token, and answers a data
-- subject's request itself (contract §1: a DBA in psql erases or exports a user's rows). The
-- encryption helpers and the token's internals run inside the definers only; idem_refuse_key
-- runs wherever idem_canonical_key is called (it is inlined into its caller).
GRANT EXECUTE ON FUNCTION
    public.idem_schema_version,
    public.idem_canonical_key,
    public.idem_refuse_key,
    public.idem_claim,
    public.idem_downstream_key,
    public.idem_complete,
    public.idem_fail,
    public.idem_heartbeat,
    public.idem_record_lost_claim,
    public.idem_erase_user,
    public.idem_export_user,
    public.idem_cleanup_batch,
    public.idem_cleanup_job,
    public.idem_cleanup_plan,
    public.idem_schedule_cleanup,
    public.idem_inspect,
    public.idem_health,
    public.idem_reencrypt_responses,
    public.idem_response_key_census
TO idem_admin;
GRANT EXECUTE ON PROCEDURE public.idem_cleanup TO idem_admin;
GRANT SELECT ON public.idem_health TO idem_admin;
