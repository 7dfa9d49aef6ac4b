-- A data subject's export one row per key (issue 39): idem_export_user returned one jsonb of
-- all the user's keys, which jsonb's 256 MiB limit refused for a user with large responses (a
-- member of idem_app can store them), so that user could not be exported. It returns a table of
-- the keys' columns now: its return type changes, so the function goes here; sql/functions/
-- creates it right after, and 990_privileges grants it to idem_dsr and idem_admin again (a
-- grant a DBA made on it by hand to another role is to be made again).
-- depends: 0014.bounded-endpoints
DROP FUNCTION IF EXISTS public.idem_export_user;
