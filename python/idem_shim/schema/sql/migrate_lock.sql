-- Run by `idem migrate` and the `idem sql` script first in each of their transactions: idem's
-- advisory lock (idem.lock_key), one migration at a time, until COMMIT. Any role may take an
-- advisory lock under any key and hold it, idle, for as long as its session lives, so the wait for
-- it is bounded as the wait for older transactions is (idem.guard_wait_timeout, seconds): on the
-- timeout it raises naming the sessions that hold it. Then every lock the transaction waits for is
-- bounded by the same timeout (lock_timeout, for the transaction): the database's owner may hold,
-- uncommitted, a schema, table or routine under a name the install makes (CREATE … IF NOT EXISTS
-- waits for that transaction to end), or a lock on its own object that a statement of the install
-- needs; on the timeout the statement fails (55P03) and with it the transaction. Both settings are
-- the transaction's own (SET LOCAL), never a default the database's owner set. The session's path
-- is pinned.
DO $idem_migrate_lock$
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
END
$idem_migrate_lock$;
