#!/usr/bin/env bash
# A replicated store under pg_auto_failover: a monitor and two PostgreSQL 15 nodes on 127.0.0.1,
# the standby synchronous, pg_cron preloaded on both nodes (data in $IDEM_HADIR, default .ha/).
#
#   ha.sh up | down | state | url | primary | kill NODE | start NODE | stop NODE | walreceiver NODE
#         | quorum NODE true|false
#
# Ports: the monitor on $IDEM_HA_PORT (default IDEM_PGPORT + 1), node1 and node2 on the next two.
# Every server trusts every connection from 127.0.0.1 (any role, the superuser included, without a
# password): a developer's own machine only, never a shared host (docs/security.md).
# IDEM_HA_SYNC=0 makes the standby asynchronous (replication-quorum false): the negative control of
# the failover test, where a promotion can lose acknowledged writes.
#
# How the services run (as postgres, one session each, state under $IDEM_HADIR) and the shortened
# health checks (a failover in seconds, not a minute, so the tests stay short; production keeps
# pg_auto_failover's defaults, docs/operations.md "Failover"): scripts/autoctl-lib.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
DB=${IDEM_PGDATABASE:-idem}
HADIR=$(realpath -m "${IDEM_HADIR:-$here/.ha}")  # absolute: as_pg runs from /
MPORT=${IDEM_HA_PORT:-$(( ${IDEM_PGPORT:-54329} + 1 ))}
SYNC=${IDEM_HA_SYNC:-1}
export PATH="$PG_BIN:$PATH"
ME=ha.sh

node_port() { case "$1" in monitor) echo "$MPORT" ;; node1) echo $((MPORT + 1)) ;; node2) echo $((MPORT + 2)) ;;
  *) echo "ha.sh: unknown node $1 (monitor, node1, node2)" >&2; exit 2 ;; esac; }

url() {  # the libpq multi-host URL the app and `idem migrate` use
  echo "postgresql://postgres@127.0.0.1:$(node_port node1),127.0.0.1:$(node_port node2)/${DB}?target_session_attrs=read-write"
}

# shellcheck source=scripts/autoctl-lib.sh
. "$here/scripts/autoctl-lib.sh"

has_primary() { test -n "$(primary)"; }
pair_ready() {
  { is_state node1 primary && is_state node2 secondary; } || { is_state node2 primary && is_state node1 secondary; }
}

up() {
  pick_dir
  monitor_up
  if [ ! -f "$HADIR/node1/PG_VERSION" ]; then
    # node1 is initialised here so that our settings follow pg_autoctl's include (line 1 of
    # postgresql.conf) and win; node2 is a pg_basebackup of node1 and inherits them.
    as_pg "$PG_BIN/initdb" -D "$HADIR/node1" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat <<CONF | as_pg tee -a "$HADIR/node1/postgresql.conf" >/dev/null
# --- idem: settings for the replicated store (after pg_auto_failover's include, so they win) ---
shared_preload_libraries = 'pg_cron,pg_stat_statements'
cron.database_name = '${DB}'
cron.timezone = 'UTC'
# pg_cron jobs in background workers, not over libpq: cron.job keeps the host and port of the node
# that scheduled a job (the old primary's port, here where each node has its own), and a job run
# over libpq after a failover would go there, to a standby or to nothing
cron.use_background_workers = on
max_worker_processes = 16
timezone = 'UTC'
max_connections = 200
shared_buffers = '128MB'          # pg_autoctl sizes it for the whole machine; six of us share it
wal_keep_size = '512MB'           # pg_autoctl's 8 GB would fill the disk of a long soak
track_functions = 'pl'
log_min_messages = warning
CONF
    create_node node1
  fi
  run_service node1
  ensure_ipv4 node1
  wait_for 90 "a primary" has_primary
  wait_for 120 "the primary's postgres" pg_isready -q -h 127.0.0.1 -p "$(node_port "$(primary)")" -d "$DB"
  # pg_cron's catalog is created once, on the primary; the standby gets it by replication
  psql -X -q -h 127.0.0.1 -p "$(node_port "$(primary)")" -U postgres -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS pg_cron"
  if [ ! -f "$HADIR/node2/PG_VERSION" ]; then create_node node2; fi
  run_service node2
  ensure_ipv4 node2
  wait_for 120 "a primary and its standby" pair_ready
  standby=$(mpsql -c "SELECT nodename FROM pgautofailover.node WHERE reportedstate = 'secondary'")
  if [ "$SYNC" = 0 ]; then
    autoctl set node replication-quorum false --pgdata "$HADIR/$standby" >/dev/null
    wait_for 30 "an asynchronous standby" test -z "$(primary_setting synchronous_standby_names)"
  fi
  echo "ha.sh: up: monitor on $MPORT, $(primary) primary; $(url)" \
       "(synchronous_standby_names = '$(primary_setting synchronous_standby_names)')" >&2
}

create_node() {
  autoctl create postgres --pgdata "$HADIR/$1" --pgport "$(node_port "$1")" --hostname 127.0.0.1 \
    --name "$1" --dbname "$DB" --auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" \
    --monitor "$(monitor_url)" >>"$HADIR/$1.log" 2>&1
}

primary() {  # the node the monitor has made primary (wait_primary, single) and that says it is
  # (a lost primary keeps "primary" as its last reported state: the assigned one is what counts)
  mpsql -c "SELECT nodename FROM pgautofailover.node
             WHERE reportedstate IN ('primary', 'wait_primary', 'single')
               AND goalstate IN ('primary', 'wait_primary', 'single') ORDER BY nodeid LIMIT 1"
}

primary_setting() {
  psql -X -q -At -h 127.0.0.1 -p "$(node_port "$(primary)")" -U postgres -d "$DB" -c "SHOW $1"
}

down() {
  [ -d "$HADIR" ] || return 0
  for n in node2 node1 monitor; do stop_node "$n"; done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  state) state ;;
  url) url ;;
  dir) echo "$HADIR" ;;
  primary) primary ;;
  kill|start|stop) node_verb "$@" ;;
  walreceiver) walreceiver "${2:?node}" ;;
  quorum) autoctl set node replication-quorum "${3:?true|false}" --pgdata "$HADIR/${2:?node}" >/dev/null ;;
  *) echo "usage: $0 up|down|state|url|dir|primary|kill NODE|start NODE|stop NODE|walreceiver NODE" >&2; exit 2 ;;
esac
