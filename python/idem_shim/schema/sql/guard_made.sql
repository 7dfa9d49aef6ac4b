-- After the DDL guard's transaction, a refusal of the install says that only the guard was
-- changed (idem.unchanged, as the caller set it), but the guard is made only where a superuser
-- runs the install (sql/functions/985): elsewhere nothing was changed yet.
DO $idem_guard_made$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        PERFORM pg_catalog.set_config('idem.unchanged', 'nothing was changed', true);
    END IF;
END
$idem_guard_made$;
