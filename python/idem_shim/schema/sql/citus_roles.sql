-- Run by `idem migrate` and the `idem sql` script right after they make idem's roles: on Citus,
-- the roles on every worker too, before anything grants to them (idem.roles, comma-separated).
DO $idem_citus_roles$
-- Citus copies a role to its workers only if the role was made where the citus extension was (or
-- as a dependency of an object it distributes). Roles made before it, by a single-node store
-- converted in place or an install into a database without the extension, were on the coordinator
-- alone, and the first grant to one on a distributed table or function failed on a worker: role
-- "idem_app" does not exist. Made there as here, NOLOGIN, through the workers' own sessions
-- (run_command_on_workers), which commit whatever the install does next: a role without grants
-- gives nothing. That session starts with the worker's defaults for the database, which its owner
-- sets (a path with its own operators first): the block pins its path before it reads anything,
-- and names pg_catalog's operator. There the worker's Citus must not send the CREATE ROLE on to the other nodes (to
-- this one too, which then waited for the install: a distributed deadlock). The cluster's install
-- lock (migrate_lock.sql) is held: one install at a time.
DECLARE
    -- Citus's function, run only where Citus is: a constant, read through a variable so that a
    -- single node's plpgsql_check (make lint) does not look for it; the command is its parameter
    v_workers constant text := 'SELECT pg_catalog.string_agg(pg_catalog.format(''%s:%s: %s'', w.nodename, '
        'w.nodeport, w.result), ''; '') FROM pg_catalog.run_command_on_workers($1) w WHERE NOT w.success';
    v_role    text;
    v_failed  text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
        RETURN;
    END IF;
    FOREACH v_role IN ARRAY pg_catalog.string_to_array(pg_catalog.current_setting('idem.roles'), ',') LOOP
        EXECUTE v_workers
           INTO v_failed
          USING pg_catalog.format(
                 'DO $r$ BEGIN PERFORM pg_catalog.set_config(''search_path'', ''pg_catalog, pg_temp'', true); '
                 'IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) %L) THEN '
                 'PERFORM pg_catalog.set_config(''citus.enable_ddl_propagation'', ''off'', true); '
                 'CREATE ROLE %I NOLOGIN; END IF; END $r$', v_role, v_role);
        IF v_failed IS NOT NULL THEN
            RAISE EXCEPTION 'role % could not be made on every Citus worker: %', v_role, v_failed;
        END IF;
    END LOOP;
END
$idem_citus_roles$;
