-- In each transaction of `idem migrate` and the `idem sql` script, right after owners.sql: the
-- store's owner (the owner of public.idempotency_keys) is the role running this or a superuser.
-- owners.sql trusts what the store's owner made, and the install writes its tables (yoyo's
-- version row, yoyo's lock and log, a migration's DML) and reads them as the role running it: a
-- store another role owns, the database's owner where it installed idem as itself, would run
-- that role's triggers with this role's rights, a superuser's (test_sec_owner_installed_store.py).
-- Reads idem.unchanged. The session's path is pinned.
DO $idem_store_owner$
DECLARE
    v_owner constant oid := (SELECT c.relowner FROM pg_catalog.pg_class c
                              WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.idempotency_keys'));
BEGIN
    IF v_owner IS NULL
       OR v_owner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user)
       OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) v_owner) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'database %: the store is owned by %, neither this role (%) nor a superuser: idem would write '
        'and read what that role made (its triggers, on yoyo''s tables too) with this role''s rights; run idem migrate '
        'or the idem sql script as % instead; %',
        pg_catalog.current_database(),
        pg_catalog.regexp_replace(pg_catalog.pg_get_userbyid(v_owner), '[[:cntrl:]]', '?', 'g'), current_user,
        pg_catalog.regexp_replace(pg_catalog.pg_get_userbyid(v_owner), '[[:cntrl:]]', '?', 'g'),
        pg_catalog.current_setting('idem.unchanged');
END
$idem_store_owner$;
