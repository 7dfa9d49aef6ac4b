"""The store on Citus (contract §8, docs/scaling.md): what ``idem migrate`` checks and says there.

On a database with the ``citus`` extension, ``idem migrate`` applies ``sql/citus/*.sql`` after
``sql/functions/``: ``000_distribute.sql`` distributes ``idempotency_keys`` and
``idempotency_events`` by ``scope_user_id``, colocated with ``users``; ``001``-``004`` replace the
four routing helpers (``idem_scope``, ``idem_key_scope``, ``idem_new_key_id``,
``idem_anonymous_scope``) with their distributed versions; the others replace the hooks through
which a routine's one body takes the step that differs (the cleanup's per-shard deletion, the
inspection's join on the scope, the re-encryption's row-by-row rewrite) and add
``idem_complete_in_scope``, the completion delegated to the claim's worker. Before anything is
written, :data:`PROBLEMS` lists what the host must do itself, each with the statement to run;
``idem migrate`` refuses while it lists anything.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg

#: Whether the citus extension exists in this database (then the store is distributed).
HAS_CITUS: LiteralString = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')"

#: A worker that does not answer must not hold a migrate for Citus's default 30 s.
PROBE_TIMEOUT: LiteralString = "SET citus.node_connection_timeout = 5000"

#: The one line that refuses a Citus older than 13, read before anything else: the installed
#: extension's version from the catalog only (no Citus function is called, so an older or
#: mismatched Citus cannot fail first with an error of its own), e.g. '12.1-1'.
TOO_OLD: LiteralString = """\
SELECT pg_catalog.format('Citus %s is older than 13: idem needs Citus 13 or later '
                         '(install it, then ALTER EXTENSION citus UPDATE)', extversion) AS line
  FROM pg_catalog.pg_extension
 WHERE extname = 'citus' AND COALESCE(NULLIF(pg_catalog.substring(extversion, '^[0-9]+'), ''), '0')::integer < 13"""

#: One line per thing the host must fix before the store can be distributed, with the
#: statement to run; no rows when the database is ready. Needs the citus extension. Tables that
#: idem created itself (migration 0001's marker comment) are distributed by 000_distribute.sql.
PROBLEMS: LiteralString = """\
WITH marker(text) AS (VALUES ('idem: minimal host table')),
workers AS (SELECT nodename, nodeport FROM pg_catalog.pg_dist_node
             WHERE noderole = 'primary' AND groupid <> 0 AND isactive),
probe AS (SELECT nodename, nodeport, success, result FROM run_command_on_workers(  -- a worker's session: its
             -- database's defaults there, its owner's path among them: the operator named, never looked up
             $probe$SELECT COALESCE((SELECT extversion FROM pg_catalog.pg_extension
                                      WHERE extname OPERATOR(pg_catalog.=) 'citus'), 'absent')$probe$)),
dist AS (SELECT logicalrelid, partmethod, repmodel, colocationid,
                CASE WHEN partmethod = 'h' THEN column_to_column_name(logicalrelid, partkey) END AS col
           FROM pg_catalog.pg_dist_partition),
host(name, col, colocate) AS (VALUES ('users', 'id', NULL), ('audit_log', 'user_id', 'public.users')),
host_state AS (
    SELECT h.name, h.col, h.colocate, pg_catalog.to_regclass('public.' || h.name) AS rel,
           COALESCE(pg_catalog.obj_description(pg_catalog.to_regclass('public.' || h.name), 'pg_class')
                    = (SELECT text FROM marker), false) AS ours
      FROM host h),
stmt AS (
    SELECT s.*, pg_catalog.format('SELECT create_distributed_table(%L, %L%s);', 'public.' || s.name, s.col,
                                  CASE WHEN s.colocate IS NULL THEN ''
                                       ELSE pg_catalog.format(', colocate_with => %L', s.colocate) END) AS create_stmt
      FROM host_state s WHERE s.rel IS NOT NULL AND NOT s.ours)
SELECT line FROM (
    SELECT 2 AS o, 'no Citus worker is registered in this database: SELECT citus_add_node(''<host>'', <port>);' AS line
     WHERE NOT EXISTS (SELECT 1 FROM workers)
    UNION ALL
    SELECT 3, pg_catalog.format('Citus worker %s:%s is unreachable (%s): start it, or remove it with '
                                'SELECT citus_remove_node(%L, %s);', p.nodename, p.nodeport,
                                pg_catalog.regexp_replace(p.result, '\\s+', ' ', 'g'), p.nodename, p.nodeport)
      FROM probe p WHERE NOT p.success
    UNION ALL
    SELECT 4, pg_catalog.format('Citus worker %s:%s has no citus extension in database %s: run CREATE '
                                'EXTENSION citus; there', p.nodename, p.nodeport, pg_catalog.current_database())
      FROM probe p WHERE p.success AND p.result = 'absent'
    UNION ALL
    -- a view (or any relation that is not a table) would run its owner's functions as whoever
    -- reads it: idem's preflight and 000_distribute read these as the migrating role
    SELECT 1, pg_catalog.format('public.%s is a %s, not a table: idem reads and writes it as the migrating role, '
                                'and a view runs the functions of its definition as that role; make it a table',
                                s.name, CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                                       WHEN 'f' THEN 'foreign table'
                                                       ELSE pg_catalog.format('relation of kind %s', c.relkind) END)
      FROM host_state s JOIN pg_catalog.pg_class c ON c.oid = s.rel WHERE c.relkind NOT IN ('r', 'p')
    UNION ALL
    SELECT 5, pg_catalog.format('public.%s is not distributed; the store is colocated with it by %s: %s',
                                s.name, s.col, s.create_stmt)
      FROM stmt s WHERE NOT EXISTS (SELECT 1 FROM dist d WHERE d.logicalrelid = s.rel)
    UNION ALL
    SELECT 6, pg_catalog.format('public.%s is distributed %s; the store needs it distributed by %s%s: '
                                'SELECT undistribute_table(%L); %s', s.name,
                                CASE WHEN d.partmethod = 'n' AND d.repmodel = 't' THEN 'as a reference table'
                                     WHEN d.partmethod = 'n' THEN 'as a Citus local table'
                                     ELSE 'by ' || COALESCE(d.col, d.partmethod::text) END,
                                s.col, CASE WHEN s.colocate IS NULL THEN '' ELSE ', colocated with users' END,
                                'public.' || s.name, s.create_stmt)
      FROM stmt s JOIN dist d ON d.logicalrelid = s.rel
     WHERE d.col IS DISTINCT FROM s.col
        OR (s.colocate IS NOT NULL AND d.colocationid IS DISTINCT FROM
            (SELECT u.colocationid FROM dist u WHERE u.logicalrelid = pg_catalog.to_regclass('public.users')))
) problems ORDER BY o, line"""

#: The reserved user of service calls in a host's own users table (idem's own gets it from
#: 000_distribute.sql). Run only where public.users exists and is the host's.
RESERVED_USER: LiteralString = """\
SELECT 'public.users has no row 0, the reserved user of service calls (no user) on a distributed store '
       '(Citus refuses a NULL distribution value): INSERT INTO public.users (id) VALUES (0);'
 WHERE NOT EXISTS (SELECT 1 FROM public.users WHERE id = 0)"""

#: Whether public.users is the host's own (exists, without migration 0001's marker) and a plain
#: table, so reading it runs nothing of its owner's (a view is refused by PROBLEMS, never read).
HOST_USERS: LiteralString = """\
SELECT pg_catalog.to_regclass('public.users') IS NOT NULL
       AND pg_catalog.obj_description(pg_catalog.to_regclass('public.users'), 'pg_class')
           IS DISTINCT FROM 'idem: minimal host table'
       AND (SELECT c.relkind FROM pg_catalog.pg_class c
             WHERE c.oid = pg_catalog.to_regclass('public.users')) IN ('r', 'p')"""

#: How the store is laid out, for `idem status`: Citus's version, the workers, the shards.
LAYOUT: LiteralString = """\
SELECT (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'citus'),
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_node
         WHERE noderole = 'primary' AND groupid <> 0 AND isactive),
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_shard
         WHERE logicalrelid = 'public.idempotency_keys'::regclass),
       (SELECT pg_catalog.string_agg(logicalrelid::text || ' by '
                                     || column_to_column_name(logicalrelid, partkey), ', ' ORDER BY logicalrelid::text)
          FROM pg_catalog.pg_dist_partition
         WHERE logicalrelid IN ('public.idempotency_keys'::regclass, 'public.idempotency_events'::regclass))"""


#: The newest rebalance (Citus's background job) and the state of each move, for `idem status`.
REBALANCE: LiteralString = """\
SELECT j.job_id, j.state::text, j.started_at, j.finished_at,
       pg_catalog.count(*) FILTER (WHERE t.status = 'done'), pg_catalog.count(t.task_id),
       pg_catalog.string_agg(DISTINCT pg_catalog.regexp_replace(t.message, '\\s+', ' ', 'g'), '; ')
           FILTER (WHERE t.status IN ('error', 'cancelled') AND t.message <> '')
  FROM pg_catalog.pg_dist_background_job j LEFT JOIN pg_catalog.pg_dist_background_task t USING (job_id)
 WHERE j.job_type = 'rebalance'
 GROUP BY j.job_id ORDER BY j.job_id DESC LIMIT 1"""

#: Workers whose copy of the metadata is stale (after citus_update_node: a worker's promotion).
STALE_METADATA: LiteralString = """\
SELECT pg_catalog.string_agg(nodename || ':' || nodeport, ', ' ORDER BY nodeid)
  FROM pg_catalog.pg_dist_node WHERE hasmetadata AND NOT metadatasynced"""


#: idem's DDL guard on every worker (contract §3a): the database's owner owns public on each node and
#: connects to a worker's copy of the database directly, where, with no guard, it dropped idem's
#: routines and shards (a schema's owner may drop anything in it) and made its own under their
#: names, which the delegated completion (idem_complete, a definer) and the coordinator's routed
#: statements then ran as the superuser. The guard's file (sql/functions/985) in a session of
#: each worker, after the coordinator's guard has committed (its CREATE SCHEMA and CREATE FUNCTION
#: reach the workers in the coordinator's transaction: a worker's session beside it would wait
#: for them, unseen by any deadlock detector); its path pinned first, and its DDL kept on the
#: worker. The rows: the workers that refused it.
WORKER_GUARD: LiteralString = """\
SELECT nodename || ':' || nodeport AS node, result
  FROM pg_catalog.run_command_on_workers(%s) WHERE NOT success ORDER BY nodename, nodeport"""

#: Where the worker's guard command ends: never in the guard's text.
_WORKER_GUARD_TAG = "$idem_worker_guard$"


def worker_guard_command(guard: str) -> str:
    """The command WORKER_GUARD sends each worker: the pinned path, DDL kept there, the guard."""
    if _WORKER_GUARD_TAG in guard:
        raise ValueError(f"the DDL guard's text holds {_WORKER_GUARD_TAG}")
    return "SET search_path = pg_catalog, pg_temp; SET citus.enable_ddl_propagation = off;\n" + guard


def worker_guard_statement(guard: str) -> str:
    """WORKER_GUARD as one statement for the idem sql script (the command dollar-quoted)."""
    return WORKER_GUARD.replace("%s", _WORKER_GUARD_TAG + worker_guard_command(guard) + _WORKER_GUARD_TAG)


def has_citus(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(HAS_CITUS).fetchone()
    return bool(row and row[0])


def problems(conn: psycopg.Connection[Any]) -> list[str]:
    """What the host must fix before the store distributes (empty: ready). Needs citus."""
    old = conn.execute(TOO_OLD).fetchone()
    if old:  # nothing below is asked of a Citus that idem does not support
        return [str(old[0])]
    with conn.transaction():
        conn.execute(PROBE_TIMEOUT.replace("SET ", "SET LOCAL "))
        found = [str(r[0]) for r in conn.execute(PROBLEMS).fetchall()]
        row = conn.execute(HOST_USERS).fetchone()
        if row and row[0]:
            found += [str(r[0]) for r in conn.execute(RESERVED_USER).fetchall()]
        return found


def status_lines(conn: psycopg.Connection[Any], has_store: bool) -> list[str]:
    """`idem status`'s lines on the store's layout; on a distributed store also what stands in
    the way of its calls (a worker unreachable or without the extension, stale metadata) and its
    newest rebalance."""
    if not has_citus(conn):
        return ["store: single node (no citus extension in this database)"]
    if not has_store:
        return ["store: not installed; idem migrate distributes it (citus extension found)"]
    row = conn.execute(LAYOUT).fetchone()
    assert row is not None
    version, workers, shards, tables = row
    if not tables:
        return [f"store: NOT distributed although Citus {version} is installed: run idem migrate"]
    lines = [
        f"store: distributed on Citus {version} ({tables}, colocated with users; {shards} shards on {workers} workers)"
    ]
    lines += [f"store: {line}" for line in problems(conn)]
    try:
        with conn.transaction():
            stale = conn.execute(STALE_METADATA).fetchone()
            rebalance = conn.execute(REBALANCE).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return [*lines, "store: this role may not read Citus's catalog of nodes and jobs"]
    if stale and stale[0]:
        lines.append(
            f"store: the Citus metadata on {stale[0]} is being sent again (after a change of nodes): until it"
            " is, completions after a handler's own writes answer 503 (57P03) and are retried"
        )
    return lines + _rebalance(rebalance)


def _rebalance(row: tuple[Any, ...] | None) -> list[str]:
    if row is None:
        return []
    job, state, started, finished, done, total, errors = row
    progress = f"{done} of {total} moves done"
    if state in ("scheduled", "running", "cancelling", "failing"):
        return [f"store: rebalance job {job} {state} since {started:%Y-%m-%d %H:%M:%S}: {progress}"]
    if state in ("failed", "cancelled"):
        return [
            f"store: the last rebalance (job {job}) {state}: {progress}; {errors or 'no message'}. Nothing is lost"
            " (Citus drops what a failed move copied): start it again with"
            " SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical');"
        ]
    when = f" at {finished:%Y-%m-%d %H:%M:%S}" if finished is not None else ""
    return [f"store: the last rebalance (job {job}) {state}{when}: {progress}"]
