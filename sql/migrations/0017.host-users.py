"""
The host's own users table (issue 40, contract §4d): the user scope names it, fixed at install.

- ``public.idem_user_id``, a domain over the users table's ``id`` type (integer, bigint or uuid):
  idempotency_keys.scope_user_id, idempotency_events.scope_user_id and every routine's p_user_id
  take it, so one set of function files serves every store.
- The foreign key to that table, ON DELETE CASCADE (a deleted user's keys go with it). A store an
  earlier idem built keeps its key to public.users and its integer column; a new store gets the
  key here (migration 0002 no longer makes it), to the table ``idem migrate --users-table`` or
  IDEM_USERS_TABLE named (``idem.users_table``, set by the tool in this transaction), else
  public.users.
- ``public.idem_host_users``, one row: that table by OID (a rename keeps it; a look-alike made
  later under its name is not it) and its id type. Every later migrate checks the foreign key
  still points there and refuses another name (schema/sql/host_users.sql).
- The DROP FUNCTION that the signature change needs; sql/functions/ re-creates them right after.

A Python step only to keep the dollar-quoted body out of yoyo's SQL splitter (STYLE.md); the
step runs the module's SQL, which ``idem sql`` prints as it is.
"""
from yoyo import step

__depends__ = {"0016.short-opaque-keys"}

#: The routines whose signature names the user's type (integer until now), dropped here.
OLD_SIGNATURES = [
    "public.idem_claim(text, integer, text, jsonb, interval, interval, integer, text, timestamptz, text, text, text)",
    "public.idem_downstream_key(text, integer, text, text, text)",
    "public.idem_erase_user(integer)",
    "public.idem_export_user(integer, text, text)",
    "public.idem_inspect(text, integer, text, boolean, text)",
    "public.idem_scope_join(integer, integer)",
    "public.idem_anonymous_scope(integer)",
    "public.idem_new_key_id(integer)",
    "public.idem_key_scope(bigint)",
    "public.idem_scope(integer)",
]
#: What the rollback drops (by name: there are no overloads); the previous version's function
#: files re-create them with integer signatures.
NEW_ROUTINES = [name.split("(")[0] for name in OLD_SIGNATURES] + ["public.idem_user_id_type"]

SQL = """\
DO $host_users$
DECLARE
    v_wanted  constant text := NULLIF(pg_catalog.current_setting('idem.users_table', true), '');
    v_marker  constant text := 'idem: minimal host table';
    v_store   constant regclass := 'public.idempotency_keys'::regclass;
    v_users   oid;
    v_named   oid;
    v_ident   text[];
    v_type    regtype;
    v_audit   regtype;
    v_found   text;
BEGIN
    -- The key an earlier migration 0002 made: the store keeps that table and its integer column.
    SELECT c.confrelid INTO v_users
      FROM pg_catalog.pg_constraint c
     WHERE c.conrelid = v_store AND c.contype = 'f'
       AND c.conkey = ARRAY[(SELECT a.attnum FROM pg_catalog.pg_attribute a
                              WHERE a.attrelid = v_store AND a.attname = 'scope_user_id')];
    IF v_wanted IS NOT NULL THEN
        BEGIN
            v_ident := pg_catalog.parse_ident(v_wanted);
        EXCEPTION WHEN invalid_parameter_value THEN
            v_ident := NULL;
        END;
        IF pg_catalog.array_length(v_ident, 1) IS DISTINCT FROM 2 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = pg_catalog.format('idem: the users table %L is not a name schema.table '
                                            '(quote a name as PostgreSQL does: app."Customers")', v_wanted);
        END IF;
    ELSE
        v_ident := ARRAY['public', 'users'];
    END IF;
    -- Found by schema and name, never through a search path.
    SELECT c.oid INTO v_named
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = v_ident[1] AND c.relname = v_ident[2] AND c.relkind IN ('r', 'p');

    IF v_users IS NOT NULL THEN
        -- GUARD: an installed store's table is not moved (not supported yet: docs/operations.md)
        IF v_wanted IS NOT NULL AND v_named IS DISTINCT FROM v_users THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = pg_catalog.format('idem: this store''s users table is %s (fixed when it was installed); '
                    'moving the user scope to %s is not supported yet', v_users::regclass, v_wanted),
                HINT = 'run idem migrate without --users-table (and IDEM_USERS_TABLE unset), or install a new store';
        END IF;
        v_type := 'integer';
    ELSE
        IF v_named IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '42P01',
                MESSAGE = pg_catalog.format('idem: the users table %I.%I does not exist', v_ident[1], v_ident[2]),
                HINT = 'create it first, or name yours with idem migrate --users-table SCHEMA.TABLE (IDEM_USERS_TABLE)';
        END IF;
        SELECT a.atttypid::regtype, pg_catalog.format_type(a.atttypid, a.atttypmod) INTO v_type, v_found
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = v_named AND a.attname = 'id' AND a.attnum > 0 AND NOT a.attisdropped;
        IF v_type IS NULL OR v_type NOT IN ('integer'::regtype, 'bigint'::regtype, 'uuid'::regtype) THEN
            RAISE EXCEPTION USING ERRCODE = '42804',
                MESSAGE = pg_catalog.format('idem: the users table %s needs a column id of type integer, bigint or '
                    'uuid (found %s)', v_named::regclass, COALESCE(v_found, 'no column id')),
                HINT = 'the user scope (idempotency_keys.scope_user_id) REFERENCES its id';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                        WHERE i.indrelid = v_named AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
                          AND i.indkey::text = (SELECT a.attnum::text FROM pg_catalog.pg_attribute a
                                                 WHERE a.attrelid = v_named AND a.attname = 'id')) THEN
            RAISE EXCEPTION USING ERRCODE = '42830',
                MESSAGE = pg_catalog.format('idem: %s.id is neither the primary key nor UNIQUE', v_named::regclass),
                HINT = 'the user scope (idempotency_keys.scope_user_id) REFERENCES it';
        END IF;
        v_users := v_named;
        -- A distributed store packs the scope into key_ids (sql/citus/): integer, as before 0017.
        IF v_type = 'bigint'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
            v_type := 'integer';
        END IF;
        -- GUARD: a new store, empty (its column changes type without a conversion)
        IF v_type <> 'integer'::regtype
           AND (EXISTS (SELECT 1 FROM public.idempotency_keys) OR EXISTS (SELECT 1 FROM public.idempotency_events)) THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = 'idem: idempotency_keys has rows but no users table: not a store idem can convert';
        END IF;
    END IF;

    DROP FUNCTION IF EXISTS {drops};

    -- Three constant statements: the type comes from the catalog, never from text.
    IF v_type = 'uuid'::regtype THEN
        CREATE DOMAIN public.idem_user_id AS uuid;
    ELSIF v_type = 'bigint'::regtype THEN
        CREATE DOMAIN public.idem_user_id AS bigint;
    ELSE
        CREATE DOMAIN public.idem_user_id AS integer;
    END IF;
    COMMENT ON DOMAIN public.idem_user_id IS
        'idem: the user scope''s type, the id type of the host''s users table (public.idem_host_users), fixed at install';

    -- Citus: the scope is the distribution column, whose type must be the users' id's (colocation)
    -- and which Citus never alters: it stays integer there (the domain is integer too).
    IF v_type = 'integer'::regtype AND EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
        NULL;
    ELSIF v_type = 'integer'::regtype THEN  -- binary-compatible: no rewrite, the indexes kept
        ALTER TABLE public.idempotency_keys ALTER COLUMN scope_user_id TYPE public.idem_user_id;
        ALTER TABLE public.idempotency_events ALTER COLUMN scope_user_id TYPE public.idem_user_id;
    ELSE  -- empty (checked above)
        ALTER TABLE public.idempotency_keys ALTER COLUMN scope_user_id TYPE public.idem_user_id USING NULL;
        ALTER TABLE public.idempotency_events ALTER COLUMN scope_user_id TYPE public.idem_user_id USING NULL;
    END IF;

    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c WHERE c.conrelid = v_store AND c.contype = 'f') THEN
        -- the table's name as the catalog spells it, each part quoted (%I): never the text given
        EXECUTE pg_catalog.format(
            'ALTER TABLE public.idempotency_keys ADD CONSTRAINT idempotency_keys_scope_user_id_fkey '
            'FOREIGN KEY (scope_user_id) REFERENCES %I.%I (id) ON DELETE CASCADE',
            (SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE c.oid = v_users),
            (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid = v_users));
    END IF;

    -- A replay writes the user into audit_log.user_id: idem's own (empty) one follows the type.
    SELECT a.atttypid::regtype INTO v_audit FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = pg_catalog.to_regclass('public.audit_log') AND a.attname = 'user_id' AND NOT a.attisdropped;
    IF v_audit IS NOT NULL AND v_type <> 'integer'::regtype AND v_audit <> v_type THEN
        IF pg_catalog.obj_description('public.audit_log'::regclass, 'pg_class') = v_marker
           AND NOT EXISTS (SELECT 1 FROM public.audit_log) THEN
            IF v_type = 'uuid'::regtype THEN
                ALTER TABLE public.audit_log ALTER COLUMN user_id TYPE uuid USING NULL;
            ELSE
                ALTER TABLE public.audit_log ALTER COLUMN user_id TYPE bigint;
            END IF;
        ELSIF v_type = 'uuid'::regtype THEN
            RAISE EXCEPTION USING ERRCODE = '42804',
                MESSAGE = pg_catalog.format('idem: public.audit_log.user_id is %s, but the users'' ids are uuid: '
                                            'a replay writes the user there', v_audit),
                HINT = 'ALTER TABLE public.audit_log ALTER COLUMN user_id TYPE uuid (or drop it: idem makes one)';
        END IF;
    END IF;

    CREATE TABLE public.idem_host_users (
        one_row      boolean      PRIMARY KEY DEFAULT true CHECK (one_row),
        users_table  regclass     NOT NULL,
        id_type      regtype      NOT NULL,
        recorded_at  timestamptz  NOT NULL DEFAULT pg_catalog.now()
    );
    COMMENT ON TABLE public.idem_host_users IS
        'idem: the host''s users table the user scope references (by OID: a rename keeps it) and its id type, '
        'fixed at install; idem migrate checks the foreign key still points there';
    REVOKE ALL ON public.idem_host_users FROM PUBLIC;
    INSERT INTO public.idem_host_users (users_table, id_type) VALUES (v_users, v_type);
END
$host_users$;
""".replace("{drops}", ",\n        ".join(OLD_SIGNATURES))

ROLLBACK_SQL = """\
DO $host_users_rollback$
BEGIN
    IF (SELECT h.id_type FROM public.idem_host_users h) <> 'integer'::regtype THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'idem: a store of uuid or bigint users cannot go back before migration 0017';
    END IF;
    DROP FUNCTION IF EXISTS {drops};
    -- On Citus the columns never took the domain (and a distribution column is not altered).
    IF (SELECT a.atttypid FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = 'public.idempotency_keys'::regclass AND a.attname = 'scope_user_id')
       <> 'integer'::regtype THEN
        ALTER TABLE public.idempotency_keys ALTER COLUMN scope_user_id TYPE integer;
        ALTER TABLE public.idempotency_events ALTER COLUMN scope_user_id TYPE integer;
    END IF;
    DROP DOMAIN public.idem_user_id;
    DROP TABLE public.idem_host_users;
END
$host_users_rollback$;
""".replace("{drops}", ", ".join(NEW_ROUTINES))


def apply(conn):
    conn.cursor().execute(SQL)  # the module's constant, never input


def rollback(conn):
    conn.cursor().execute(ROLLBACK_SQL)


steps = [step(apply, rollback)]
