-- Run by `idem migrate` and the `idem sql` script first in each of their transactions: idem's
-- advisory lock, one migration at a time, until COMMIT; on Citus the whole cluster's too. (Short,
-- so that pg_stat_activity's first 1 kB of a waiting install shows the DO block's name.)
DO $idem_migrate_lock$
-- Any role may take an advisory lock under any key (idem.lock_key) and hold it, idle, for as long
-- as its session lives, so the wait for it is bounded as the wait for older transactions is
-- (idem.guard_wait_timeout, seconds): on the timeout it raises naming the sessions that hold it.
-- Then every lock the transaction waits for is bounded by the same timeout (lock_timeout, for the
-- transaction): the database's owner may hold, uncommitted, a schema, table or routine under a name
-- the install makes (CREATE … IF NOT EXISTS waits for that transaction to end), or a lock on its
-- own object that a statement of the install needs; on the timeout the statement fails (55P03) and
-- with it the transaction (on Citus, on the workers as well). Both settings are the transaction's
-- own (SET LOCAL), never a default the database's owner set. The session's path is pinned.
DECLARE
    v_key     constant bigint := pg_catalog.current_setting('idem.lock_key')::bigint;
    v_until   constant timestamptz := pg_catalog.clock_timestamp()
        + pg_catalog.make_interval(secs => pg_catalog.current_setting('idem.guard_wait_timeout')::float8);
    v_holders text;
BEGIN
    WHILE NOT pg_catalog.pg_try_advisory_xact_lock(v_key) LOOP
        IF pg_catalog.clock_timestamp() >= v_until THEN
            SELECT pg_catalog.string_agg(pg_catalog.format('pid %s (user %s, application %L, %s)', a.pid,
                                                           COALESCE(a.usename, '-'),
                                                           pg_catalog.regexp_replace(a.application_name, '[[:cntrl:]]', '?', 'g'),
                                                           a.state),
                                         ', ' ORDER BY a.pid)
              INTO v_holders
              FROM pg_catalog.pg_locks l
              JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
               AND l.classid::bigint = v_key >> 32 AND l.objid::bigint = v_key & 4294967295;
            RAISE EXCEPTION 'database %: after % s these sessions still hold idem''s migration lock '
                '(pg_advisory_lock(%), taken by idem migrate and the idem sql script, one at a time): %; '
                'end them (another migration ends by itself; SELECT pg_terminate_backend(pid) otherwise), then run '
                'idem migrate or the idem sql script again (their --wait-timeout waits longer)',
                pg_catalog.current_database(), pg_catalog.current_setting('idem.guard_wait_timeout'), v_key,
                COALESCE(v_holders, 'none left');
        END IF;
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
    -- in whole milliseconds, at least one (0 would be no bound)
    PERFORM pg_catalog.set_config('lock_timeout',
        GREATEST(1::float8, LEAST(2147483647::float8,
            pg_catalog.ceil(pg_catalog.current_setting('idem.guard_wait_timeout')::float8 * 1000::float8)))::bigint::text, true);
    -- On Citus, on the workers too: a statement's part there waits in the workers' sessions, which
    -- a coordinator's lock_timeout never reaches, so a lock the database's owner holds there on its
    -- own table (its users' shards, which the distribution's foreign keys wait for: a session on a
    -- worker, or run_command_on_placements from the coordinator) held the install, and with it the
    -- cluster's install lock below, for as long as the owner liked. Citus sends a SET LOCAL to the
    -- transaction's worker sessions, those opened later included, where citus.propagate_set_commands
    -- is 'local' (set_config is no SET: it is never sent); both the transaction's own.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.propagate_set_commands', 'local', true);
        EXECUTE pg_catalog.format('SET LOCAL lock_timeout = %L', pg_catalog.current_setting('lock_timeout'));
        -- and the pinned path: a worker's session starts with the database's defaults there, which
        -- its owner sets (its own operators first in the path), and Citus's statements on the
        -- workers resolved through it, as the superuser
        SET LOCAL search_path = pg_catalog, pg_temp;
    END IF;
    -- On Citus, one install at a time in the whole cluster, not only in this database: the grants
    -- make Citus re-create idem's roles on every worker (worker_create_or_alter_role, an ALTER
    -- ROLE), and of two installs' at once into two databases one failed, "tuple concurrently
    -- updated". The cluster's lock is a row lock (FOR UPDATE) on one row of the shared catalog
    -- pg_authid (an advisory lock is one database's): the bootstrap superuser's (oid 10, initdb's
    -- role, which cannot be dropped), held until COMMIT, after the workers' commit. Only a
    -- superuser may lock that row or change it, and only a superuser's install alters roles.
    -- Not a lock on the table: any login role may queue for one it may never take (CREATE TRIGGER
    -- ON pg_catalog.pg_authid waits for SHARE ROW EXCLUSIVE before it checks privileges, behind
    -- the ROW EXCLUSIVE of its own ALTER ROLE ... PASSWORD left in an open transaction), and a
    -- queued request refuses every later one it conflicts with: a SHARE UPDATE EXCLUSIVE lock,
    -- so every install of the cluster, for as long as that role liked. A row lock's table lock
    -- (ROW SHARE) conflicts only with EXCLUSIVE and ACCESS EXCLUSIVE, and a request queued for
    -- those (CREATE RULE ... TO pg_catalog.pg_authid) stops every login of the cluster as well:
    -- PostgreSQL's matter, waited for within lock_timeout (above; 55P03). The row waited for
    -- within the same timeout, then refused naming who holds it (the transaction whose id is the
    -- row's xmax).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'citus')
       AND pg_catalog.has_table_privilege('pg_catalog.pg_authid', 'UPDATE') THEN
        LOOP
            -- SKIP LOCKED, not NOWAIT in a block that catches the refusal: a lock taken in such a
            -- block is its subtransaction's, and the row's xmax then names no session's transaction
            PERFORM 1 FROM pg_catalog.pg_authid r WHERE r.oid = 10::pg_catalog.oid FOR UPDATE SKIP LOCKED;
            EXIT WHEN FOUND;
            IF pg_catalog.clock_timestamp() >= v_until THEN
                SELECT pg_catalog.string_agg(COALESCE(
                           pg_catalog.format('pid %s (user %s, database %s, application %L, %s)', a.pid,
                                             COALESCE(a.usename, '-'), COALESCE(a.datname, '-'),
                                             pg_catalog.regexp_replace(a.application_name, '[[:cntrl:]]', '?', 'g'),
                                             a.state),
                           'a prepared transaction (pg_prepared_xacts)'),
                       ', ' ORDER BY l.pid)
                  INTO v_holders
                  FROM pg_catalog.pg_locks l
                  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                 WHERE l.locktype = 'transactionid' AND l.granted AND l.mode = 'ExclusiveLock'
                   AND l.transactionid = (SELECT r.xmax FROM pg_catalog.pg_authid r WHERE r.oid = 10::pg_catalog.oid);
                RAISE EXCEPTION 'database %: after % s these sessions still hold idem''s lock of the Citus cluster '
                    '(a row lock on pg_catalog.pg_authid, taken by idem migrate and the idem sql script, one install '
                    'at a time across its databases: Citus re-creates idem''s roles on every worker): %; end them '
                    '(another install ends by itself; SELECT pg_terminate_backend(pid) otherwise), then run idem '
                    'migrate or the idem sql script again (their --wait-timeout waits longer)',
                    pg_catalog.current_database(), pg_catalog.current_setting('idem.guard_wait_timeout'),
                    COALESCE(v_holders, 'none left');
            END IF;
            PERFORM pg_catalog.pg_sleep(0.05);
        END LOOP;
    END IF;
END
$idem_migrate_lock$;
