-- Every `idem migrate` (and the `idem sql` script), after the migrations: the user scope still
-- references the users table recorded at install (public.idem_host_users, by OID), and a table
-- named now (idem.users_table: --users-table, IDEM_USERS_TABLE) is that one. A foreign key gone
-- (the host's DROP ... CASCADE where no DDL guard was installed) or a name that now means another
-- table (a rename, a look-alike made under the old name) is refused, never followed: idem never
-- re-points the key by name. Reads the catalog and that row; writes nothing.
DO $idem_host_users$
DECLARE
    v_wanted   constant text := NULLIF(pg_catalog.current_setting('idem.users_table', true), '');
    v_recorded regclass;
    v_type     regtype;
    v_key      regclass;
    v_ident    text[];
    v_named    regclass;
BEGIN
    SELECT h.users_table, h.id_type INTO v_recorded, v_type FROM public.idem_host_users h;
    SELECT c.confrelid::regclass INTO v_key
      FROM pg_catalog.pg_constraint c
     WHERE c.conrelid = 'public.idempotency_keys'::regclass AND c.contype = 'f'
       AND c.conname = 'idempotency_keys_scope_user_id_fkey';
    -- GUARD: the key still points at the recorded table
    IF v_key IS DISTINCT FROM v_recorded THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = pg_catalog.format('idem: the user scope''s foreign key (idempotency_keys_scope_user_id_fkey) '
                'should reference the users table recorded at install (%s, OID %s) and %s; idem does not re-point '
                'it: as the store''s owner, re-create it to that table (docs/operations.md, "The users table")',
                CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = v_recorded) THEN v_recorded::text ELSE 'now gone' END, v_recorded::oid,
                CASE WHEN v_key IS NULL THEN 'is gone' ELSE pg_catalog.format('references %s', v_key::regclass) END);
    END IF;
    IF v_wanted IS NULL THEN
        RETURN;
    END IF;
    BEGIN
        v_ident := pg_catalog.parse_ident(v_wanted);
    EXCEPTION WHEN invalid_parameter_value THEN
        v_ident := NULL;
    END;
    SELECT c.oid::regclass INTO v_named
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE pg_catalog.array_length(v_ident, 1) = 2 AND n.nspname = v_ident[1] AND c.relname = v_ident[2];
    -- GUARD: the table named is the recorded one (moving it is not supported yet)
    IF v_named IS DISTINCT FROM v_recorded THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = pg_catalog.format('idem: this store''s users table is %s (id %s, fixed at install); the user '
                'scope cannot move to %s: not supported yet (run idem migrate without --users-table and with '
                'IDEM_USERS_TABLE unset, or install a new store)', v_recorded::regclass, v_type, v_wanted);
    END IF;
END
$idem_host_users$;
