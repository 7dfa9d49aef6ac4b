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
# pg_autoctl refuses root: every service runs as the postgres user, each under `setsid` so that
# `kill NODE` can SIGKILL the node's whole process group (keeper, postmaster, backends) at once,
# the way a machine is lost. pg_autoctl's config, state and pid files go under $IDEM_HADIR too
# (XDG_*), never into the postgres user's home.
#
# The monitor's health checks are shortened (a failover in seconds, not a minute) so the tests
# stay short; production keeps pg_auto_failover's defaults (docs/operations.md "Failover").
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
DB=${IDEM_PGDATABASE:-idem}
HADIR=${IDEM_HADIR:-$here/.ha}
MPORT=${IDEM_HA_PORT:-$(( ${IDEM_PGPORT:-54329} + 1 ))}
SYNC=${IDEM_HA_SYNC:-1}
export PATH="$PG_BIN:$PATH"
FALLBACK="/tmp/idem-ha-$(echo "$here" | md5sum | cut -c1-8)"
# a cluster built in the fallback directory (see pick_dir) is found there by every later command
if [ -z "${IDEM_HADIR:-}" ] && [ ! -d "$HADIR/monitor" ] && [ -d "$FALLBACK/monitor" ]; then HADIR=$FALLBACK; fi

node_port() { case "$1" in monitor) echo "$MPORT" ;; node1) echo $((MPORT + 1)) ;; node2) echo $((MPORT + 2)) ;;
  *) echo "ha.sh: unknown node $1 (monitor, node1, node2)" >&2; exit 2 ;; esac; }

as_pg() {
  local env=(env "XDG_CONFIG_HOME=$HADIR/xdg/config" "XDG_DATA_HOME=$HADIR/xdg/share"
             "XDG_RUNTIME_DIR=$HADIR/xdg/run" "PATH=$PATH" "HOME=$HADIR")
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "${env[@]}" "$@"; else "${env[@]}" "$@"; fi
}

autoctl() { as_pg pg_autoctl "$@"; }

monitor_url() { echo "postgres://autoctl_node@127.0.0.1:${MPORT}/pg_auto_failover?sslmode=disable"; }

url() {  # the libpq multi-host URL the app and `idem migrate` use
  echo "postgresql://postgres@127.0.0.1:$(node_port node1),127.0.0.1:$(node_port node2)/${DB}?target_session_attrs=read-write"
}

mpsql() { psql -X -q -At -h 127.0.0.1 -p "$MPORT" -U postgres -d pg_auto_failover "$@"; }

pick_dir() {  # the postgres user must reach it; a checkout under a private home falls back to /tmp
  mkdir -p "$HADIR"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$HADIR"
    if ! runuser -u postgres -- test -w "$HADIR"; then
      HADIR=$FALLBACK
      mkdir -p "$HADIR" && chown postgres: "$HADIR"
    fi
  fi
  as_pg mkdir -p "$HADIR/xdg/config" "$HADIR/xdg/share" "$HADIR/xdg/run"
  as_pg chmod 700 "$HADIR/xdg/run"
}

run_service() {  # `pg_autoctl run` for one data directory, in a session of its own
  local name=$1
  if service_pid "$name" >/dev/null; then return 0; fi
  if [ "$(id -u)" -eq 0 ]; then
    setsid runuser -u postgres -- env "XDG_CONFIG_HOME=$HADIR/xdg/config" "XDG_DATA_HOME=$HADIR/xdg/share" \
      "XDG_RUNTIME_DIR=$HADIR/xdg/run" "PATH=$PATH" "HOME=$HADIR" \
      pg_autoctl run --pgdata "$HADIR/$name" >>"$HADIR/$name.log" 2>&1 </dev/null &
  else
    XDG_CONFIG_HOME=$HADIR/xdg/config XDG_DATA_HOME=$HADIR/xdg/share XDG_RUNTIME_DIR=$HADIR/xdg/run HOME=$HADIR \
      setsid pg_autoctl run --pgdata "$HADIR/$name" >>"$HADIR/$name.log" 2>&1 </dev/null &
  fi
  echo $! >"$HADIR/$name.session"
}

ipv4_ready() { pg_isready -q -h 127.0.0.1 -p "$(node_port "$1")" -t 2; }

ensure_ipv4() {  # the node's postgres answers on 127.0.0.1, where everything connects
  # A port that was in use moments before (a killed node's sockets, a client's ephemeral port)
  # can make postgres start with its IPv6 socket alone: it then answers on ::1 and refuses on
  # 127.0.0.1, and the monitor marks the node unhealthy for ever. Restart it until it binds both.
  # A rejoin may take a while first (pg_rewind, or a new pg_basebackup when that fails).
  local name=$1 tries=0 deadline=$((SECONDS + 240))
  while [ $SECONDS -lt $deadline ]; do
    ipv4_ready "$name" && return 0
    if [ -r "$HADIR/$name/postmaster.pid" ] && grep -qs "could not bind IPv4" "$(newest_log "$name")"; then
      tries=$((tries + 1))
      [ $tries -gt 5 ] && break
      sleep 2
      as_pg "$PG_BIN/pg_ctl" -D "$HADIR/$name" -m fast -w -t 60 restart >/dev/null 2>&1 || true
    fi
    sleep 1
  done
  ipv4_ready "$name" || { echo "ha.sh: $name does not answer on 127.0.0.1:$(node_port "$name")" >&2; return 1; }
}

newest_log() { ls -t "$HADIR/$1"/log/*.log 2>/dev/null | head -1; }

service_pid() {  # the session leader of a running node (setsid's child: runuser or pg_autoctl)
  local f=$HADIR/$1.session pid
  [ -r "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "ha.sh: timed out after ${secs}s waiting for $what (logs in $HADIR/*.log)" >&2
      return 1
    fi
    sleep 0.5
  done
}

node_state() {  # reported state of one node, from the monitor
  mpsql -c "SELECT reportedstate FROM pgautofailover.node WHERE nodename = '$1'" 2>/dev/null
}

has_primary() { test -n "$(primary)"; }
is_state() { [ "$(node_state "$1")" = "$2" ]; }
pair_ready() {
  { is_state node1 primary && is_state node2 secondary; } || { is_state node2 primary && is_state node1 secondary; }
}

up() {
  pick_dir
  if [ ! -f "$HADIR/monitor/PG_VERSION" ]; then
    autoctl create monitor --pgdata "$HADIR/monitor" --pgport "$MPORT" --hostname 127.0.0.1 \
      --auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" >>"$HADIR/monitor.log" 2>&1
  fi
  run_service monitor
  wait_for 60 "the monitor" pg_isready -q -h 127.0.0.1 -p "$MPORT" -d pg_auto_failover
  wait_for 30 "the monitor's extension" mpsql -c "SELECT 1 FROM pgautofailover.formation"
  # Failure detection in seconds: health check every 1 s, a node unhealthy after 3 s, and an
  # unreachable primary given 3 s to demote itself before its standby is promoted.
  mpsql -c "ALTER SYSTEM SET pgautofailover.health_check_period = 1000" \
        -c "ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000" \
        -c "ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1" \
        -c "ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500" \
        -c "ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000" \
        -c "ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 3000" \
        -c "SELECT pg_reload_conf()" >/dev/null
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

kill_node() {  # SIGKILL every process of the node (keeper, postmaster, backends): a lost machine
  local pid
  pid=$(service_pid "$1") || { echo "ha.sh: $1 is not running" >&2; return 1; }
  kill -KILL -- "-$pid" 2>/dev/null || true
  # a backend outside the group (none expected) would keep the port: kill the postmaster too
  if [ -r "$HADIR/$1/postmaster.pid" ]; then kill -KILL "$(head -1 "$HADIR/$1/postmaster.pid")" 2>/dev/null || true; fi
  rm -f "$HADIR/$1.session"
}

stop_node() {  # a clean stop (pg_autoctl stops its postgres), waiting for the session to end
  local pid
  pid=$(service_pid "$1") || return 0
  autoctl stop --pgdata "$HADIR/$1" >/dev/null 2>&1 || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill_node "$1" 2>/dev/null || true
}

down() {
  [ -d "$HADIR" ] || return 0
  for n in node2 node1 monitor; do stop_node "$n"; done
}

state() { autoctl show state --pgdata "$HADIR/monitor"; }

walreceiver() {  # the pid of a standby's walreceiver (the negative control pauses it)
  psql -X -q -At -h 127.0.0.1 -p "$(node_port "$1")" -U postgres -d postgres \
    -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver'"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  state) state ;;
  url) url ;;
  primary) primary ;;
  kill) kill_node "${2:?node}" ;;
  start) pick_dir; run_service "${2:?node}"; [ "$2" = monitor ] || ensure_ipv4 "$2" ;;
  stop) stop_node "${2:?node}" ;;
  walreceiver) walreceiver "${2:?node}" ;;
  quorum) autoctl set node replication-quorum "${3:?true|false}" --pgdata "$HADIR/${2:?node}" >/dev/null ;;
  *) echo "usage: $0 up|down|state|url|primary|kill NODE|start NODE|stop NODE|walreceiver NODE" >&2; exit 2 ;;
esac
