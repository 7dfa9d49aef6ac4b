-- Privileges, re-applied after every migrate (CREATE OR REPLACE keeps grants, but a new
-- function starts executable by PUBLIC). Two roles, by who calls what (SPEC §3a):
-- idem_app, the request path (and the app's GDPR sweep), and idem_admin, the DBA's, pg_cron's
-- and the CLI's admin verbs. Neither can read or write the tables; both go through these
-- functions. Whatever a role does not need it does not get: a handler's SQL injection runs as
-- idem_app, and must not be able to delete live keys, re-key stored bodies or read them.
REVOKE ALL ON FUNCTION
    public.idem_schema_version,
    public.idem_canonical_key,
    public.idem_caller_is,
    public.idem_claim_token,
    public.idem_check_token,
    public.idem_credential_name,
    public.idem_claim,
    public.idem_downstream_key,
    public.idem_complete,
    public.idem_fail,
    public.idem_heartbeat,
    public.idem_lost_claim_state,
    public.idem_erase_user,
    public.idem_export_user,
    public.idem_cleanup_batch,
    public.idem_cleanup_job,
    public.idem_cleanup_plan,
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
REVOKE ALL ON PROCEDURE public.idem_cleanup FROM PUBLIC;
REVOKE ALL ON public.idem_health FROM PUBLIC;

-- idem_app: one request's steps, the lost-claim report (fenced by the claim's token), and the
-- data subject's rights (the app's GDPR sweep), and nothing else (SPEC §3a: the shim reads the
-- SQL API version from the catalog). Revoked first, so an upgrade from a version that granted
-- more (cleanup, health, rotation, the version and key helpers: SQL API <= 4) takes those back.
REVOKE ALL ON FUNCTION
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
    public.idem_record_lost_claim,
    public.idem_erase_user,
    public.idem_export_user
TO idem_app;

-- idem_admin: cleanup, key rotation, inspection, health and scheduling (granted to DBAs with
-- GRANT idem_admin TO <role>; pg_cron runs the job as the role that scheduled it). It may also
-- call the request-path functions by key_id alone, without a claim token: a DBA's psql.
-- The encryption helpers and the token's internals run inside the definers only.
GRANT EXECUTE ON FUNCTION
    public.idem_schema_version,
    public.idem_canonical_key,
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
