-- The install's roles (idem.roles, a comma-separated list: schema/preflight.py's ROLES), each
-- made NOLOGIN where missing, cluster-wide: idem_app (the request path), idem_admin (DBAs,
-- pg_cron, the CLI's admin verbs), idem_dsr (the GDPR job's), idem_monitor (a metrics
-- exporter's). A role that may not make them is told every missing one in one line (one at a
-- time, a DBA ran the install four times); one another install made meanwhile is kept.
DO $idem_roles$
DECLARE
    v_missing constant pg_catalog.text[] := ARRAY(
        SELECT u.r FROM pg_catalog.unnest(pg_catalog.string_to_array(pg_catalog.current_setting('idem.roles'), ','))
               WITH ORDINALITY AS u(r, o)
         WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles x WHERE x.rolname OPERATOR(pg_catalog.=) u.r)
         ORDER BY u.o);
    v_left    pg_catalog.text[];
    v_role    pg_catalog.text;
    v_many    boolean;
BEGIN
    FOREACH v_role IN ARRAY v_missing LOOP
        BEGIN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;  -- another install made it meanwhile
            WHEN insufficient_privilege THEN
                v_left := v_missing[pg_catalog.array_position(v_missing, v_role):];
                EXIT;
        END;
    END LOOP;
    IF v_left IS NOT NULL THEN
        v_many := pg_catalog.cardinality(v_left) OPERATOR(pg_catalog.>) 1;
        RAISE EXCEPTION '% % % not exist and this role may not create %: a superuser runs % then run idem '
            'migrate again; %',
            CASE WHEN v_many THEN 'roles' ELSE 'role' END, pg_catalog.array_to_string(v_left, ', '),
            CASE WHEN v_many THEN 'do' ELSE 'does' END, CASE WHEN v_many THEN 'them' ELSE 'it' END,
            (SELECT pg_catalog.string_agg(pg_catalog.format('CREATE ROLE %I NOLOGIN;', l.r), ' ' ORDER BY l.o)
               FROM pg_catalog.unnest(v_left) WITH ORDINALITY AS l(r, o)),
            pg_catalog.current_setting('idem.unchanged');
    END IF;
END
$idem_roles$;
