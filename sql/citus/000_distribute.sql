-- The store in its distributed form, on a database with the citus extension (docs/scaling.md).
-- Applied by `idem migrate` (and `idem sql`) after the migrations and sql/functions/, in the
-- same transaction, on every run; does nothing once idempotency_keys is distributed. What the
-- host must do itself (its own users and audit_log distributed, the reserved user 0) is checked
-- before anything is written (idem_shim.citus.PROBLEMS) and refused with the statements to run.
-- In place: an existing single-node store is converted here (its rows re-keyed), so the claims
-- in flight at that moment lose their token (IDM01 at completion: rolled back, retried).
DO $idem_distribute$
DECLARE
    v_marker constant text := 'idem: minimal host table';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                WHERE logicalrelid = 'public.idempotency_keys'::regclass) THEN
        RETURN;
    END IF;
    -- GUARD: a distributed store scopes by an integer id of public.users (the reserved user 0,
    -- key_ids that carry the scope in their high bits): not yet another table nor a uuid id
    IF public.idem_user_id_type() <> 'integer'::regtype
       OR (SELECT h.users_table FROM public.idem_host_users h) <> 'public.users'::regclass THEN
        RAISE EXCEPTION USING
            MESSAGE = pg_catalog.format('idem: a distributed store needs the user scope on public.users(id integer); '
                'this store''s is %s (id %s): not supported yet (docs/scaling.md)',
                (SELECT h.users_table FROM public.idem_host_users h), public.idem_user_id_type());
    END IF;

    -- A store migrated before citus was installed holds the scope as the domain idem_user_id:
    -- Citus colocates only columns of one type, so it becomes the users' integer (no rewrite).
    IF (SELECT a.atttypid FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = 'public.idempotency_keys'::regclass AND a.attname = 'scope_user_id')
       <> 'integer'::regtype THEN
        ALTER TABLE public.idempotency_keys ALTER COLUMN scope_user_id TYPE integer;
        ALTER TABLE public.idempotency_events ALTER COLUMN scope_user_id TYPE integer;
    END IF;

    -- idem's own minimal host tables (migration 0001): distributed here, the host's are refused
    -- by the preflight. A UNIQUE that does not hold the distribution column is not possible on
    -- Citus: users.email becomes a plain index; audit_log's key gains its user.
    IF pg_catalog.obj_description('public.users'::regclass, 'pg_class') = v_marker
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = 'public.users'::regclass) THEN
        ALTER TABLE public.users DROP CONSTRAINT IF EXISTS users_email_key;
        CREATE INDEX IF NOT EXISTS users_email_idx ON public.users (email);
        PERFORM create_distributed_table('public.users', 'id');
    END IF;
    IF pg_catalog.obj_description('public.audit_log'::regclass, 'pg_class') = v_marker
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = 'public.audit_log'::regclass) THEN
        UPDATE public.audit_log SET user_id = 0 WHERE user_id IS NULL;
        ALTER TABLE public.audit_log DROP CONSTRAINT audit_log_pkey,
            ALTER COLUMN user_id SET NOT NULL, ADD PRIMARY KEY (user_id, id);
        PERFORM create_distributed_table('public.audit_log', 'user_id', colocate_with => 'public.users');
    END IF;
    -- The reserved scope of service calls (no user): Citus refuses a NULL distribution value.
    IF pg_catalog.obj_description('public.users'::regclass, 'pg_class') = v_marker THEN
        INSERT INTO public.users (id, email) VALUES (0, NULL) ON CONFLICT (id) DO NOTHING;
    END IF;

    -- Rows of a single-node store: a NULL scope becomes the reserved user 0, and every key_id
    -- carries its scope (public.idem_new_key_id), so the completion routes without a lookup.
    UPDATE public.idempotency_keys SET scope_user_id = 0 WHERE scope_user_id IS NULL;
    UPDATE public.idempotency_keys
       SET id = scope_user_id::bigint * 2147483648 + (id & 2147483647)
     WHERE id <> scope_user_id::bigint * 2147483648 + (id & 2147483647);
    UPDATE public.idempotency_events SET scope_user_id = 0 WHERE scope_user_id IS NULL;
    UPDATE public.idempotency_events
       SET key_id = scope_user_id::bigint * 2147483648 + (key_id & 2147483647)
     WHERE key_id IS NOT NULL AND key_id <> scope_user_id::bigint * 2147483648 + (key_id & 2147483647);

    -- Every unique constraint holds the distribution column (Citus's rule).
    ALTER TABLE public.idempotency_keys DROP CONSTRAINT idempotency_keys_pkey,
        ALTER COLUMN scope_user_id SET NOT NULL, ADD PRIMARY KEY (scope_user_id, id);
    ALTER TABLE public.idempotency_events DROP CONSTRAINT idempotency_events_pkey,
        ALTER COLUMN scope_user_id SET NOT NULL, ADD PRIMARY KEY (scope_user_id, id);
    DROP INDEX public.uq_idem_events_lost_claim;
    CREATE UNIQUE INDEX uq_idem_events_lost_claim
        ON public.idempotency_events (scope_user_id, key_id) WHERE event = 'lost_claim';

    PERFORM create_distributed_table('public.idempotency_keys', 'scope_user_id', colocate_with => 'public.users');
    PERFORM create_distributed_table('public.idempotency_events', 'scope_user_id', colocate_with => 'public.users');
    RAISE NOTICE 'idem: idempotency_keys and idempotency_events distributed by scope_user_id, colocated with users';
END
$idem_distribute$;
