-- Run by `idem migrate` and the `idem sql` script right after idem's DDL guard (sql/functions/985)
-- is committed in a transaction of its own: wait until every transaction of this database that
-- began before that commit has ended. (Short: see migrate_lock.sql.)
DO $idem_guard_wait$
-- It runs before the preflight and the migrations. DDL such a transaction made before the commit
-- was judged by no guard, and owners.sql cannot see it until it commits (a routine planted there,
-- committed after the migration, would overload idem's: 42725 on every claim). A session checks
-- which event triggers exist only when it next takes a lock, so even its first DDL after the commit
-- may go unjudged; the wait covers transactions by when they began, not by whether they hold a
-- transaction id yet: it takes the virtual transaction ids held in this database once the guard is
-- committed (pg_locks: every transaction holds its own from its first moment, before it reads the
-- invalidations the guard's commit sent) and waits until none of them is held. Never by
-- pg_stat_activity's xact_start alone, which is NULL in a session whose track_activities is off (a
-- DBA may set it so for a role or a database, or for the server), whatever transaction it is in.
-- Prepared transactions have no session: those left once no such session remains (one may have been
-- prepared by such a session) are waited for too. Whoever's they are, superusers' included: a
-- superuser's session (an autovacuum worker's, a DBA's maintenance job) runs the index expressions
-- of the database owner's table as that owner, DDL included, when it analyzes, vacuums, reindexes
-- or indexes it, and nothing another session can read tells such a transaction apart (the owner's
-- code may take idem's migration lock in it, and let it go before it ends; an application's name is
-- anyone's). Another idem migrate's or idem sql's transactions are waited for too: each ends by
-- itself, and this wait, in a transaction of its own, holds nothing they wait for. Not waited for:
-- other databases' (their DDL cannot reach this one's catalogs). Only a superuser makes the guard
-- (985), so only a superuser waits. Reads idem.guard_wait_timeout (seconds); on the timeout it
-- raises naming each transaction it waited for, a control character of a name its owner picked (a
-- gid, an application's name) shown as '?' (a newline would end the error's line and start one of
-- theirs). The session's path is pinned (pg_catalog, pg_temp).
DECLARE
    v_since    constant timestamptz := pg_catalog.clock_timestamp();
    v_until    constant timestamptz := v_since
        + pg_catalog.make_interval(secs => pg_catalog.current_setting('idem.guard_wait_timeout')::float8);
    v_db       constant oid := (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
    v_vxids    text[];  -- the virtual transaction ids of this database's transactions under way at the start
    v_prepared xid[];  -- those left once no session blocks (NULL until then: every one blocks)
    v_sessions text;
    v_held     text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        RETURN;
    END IF;
    -- each backend's lock on its own virtual transaction id, in this database (datid is shown
    -- whatever track_activities is), read anew
    PERFORM pg_catalog.pg_stat_clear_snapshot();
    SELECT COALESCE(pg_catalog.array_agg(l.virtualxid), '{}') INTO v_vxids
      FROM pg_catalog.pg_locks l
      JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'virtualxid' AND l.granted AND l.virtualxid = l.virtualtransaction
       AND a.datid = v_db AND l.pid <> pg_catalog.pg_backend_pid();
    LOOP
        PERFORM pg_catalog.pg_stat_clear_snapshot();  -- pg_stat_activity is read once per transaction otherwise
        SELECT pg_catalog.string_agg(pg_catalog.format('pid %s (user %s, application %L, %s, %s%s)',
                                                       l.pid, COALESCE(a.usename, '-'),
                                                       pg_catalog.regexp_replace(a.application_name, '[[:cntrl:]]', '?', 'g'),
                                                       CASE WHEN a.xact_start IS NULL
                                                            THEN 'in a transaction its track_activities does not show'
                                                            ELSE pg_catalog.format('in a transaction since %s', a.xact_start) END,
                                                       a.state, ', ' OPERATOR(pg_catalog.||) NULLIF(a.backend_type, 'client backend')),
                                     ', ' ORDER BY a.xact_start NULLS FIRST, l.pid)
          INTO v_sessions
          FROM pg_catalog.pg_locks l
          LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'virtualxid' AND l.granted AND l.virtualxid = l.virtualtransaction
           AND l.virtualxid = ANY (v_vxids);
        IF v_sessions IS NULL AND v_prepared IS NULL THEN
            SELECT COALESCE(pg_catalog.array_agg(p.transaction), '{}') INTO v_prepared
              FROM pg_catalog.pg_prepared_xacts p
             WHERE p.database = pg_catalog.current_database();
        END IF;
        SELECT pg_catalog.string_agg(pg_catalog.format('prepared transaction %L (owner %s, prepared at %s)',
                                                       pg_catalog.regexp_replace(p.gid, '[[:cntrl:]]', '?', 'g'), p.owner, p.prepared),
                                     ', ' ORDER BY p.prepared)
          INTO v_held
          FROM pg_catalog.pg_prepared_xacts p
         WHERE p.database = pg_catalog.current_database()
           AND (v_prepared IS NULL OR p.transaction = ANY (v_prepared));
        EXIT WHEN v_sessions IS NULL AND v_held IS NULL;
        IF pg_catalog.clock_timestamp() >= v_until THEN
            RAISE EXCEPTION 'database %: idem''s DDL guard is committed and nothing else was changed: after % s these '
                'transactions, begun before the guard existed, are still open: %; DDL they made was judged by no '
                'guard (a routine planted there would overload idem''s once committed); end them (COMMIT or ROLLBACK '
                'in their sessions, COMMIT PREPARED or ROLLBACK PREPARED ''gid'' for a prepared one, or '
                'SELECT pg_terminate_backend(pid)), then run idem migrate or the idem sql script again (their '
                '--wait-timeout waits longer; docs/operations.md#transactions-idem-migrate-waits-for)',
                pg_catalog.current_database(), pg_catalog.current_setting('idem.guard_wait_timeout'),
                pg_catalog.concat_ws(', ', v_sessions, v_held);
        END IF;
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
END
$idem_guard_wait$;
