# Shared by scripts/ha.sh (a primary and its standby) and scripts/ha-citus.sh (a Citus formation):
# pg_auto_failover services run as the postgres user, one session each, in a project-local folder.
# Sourced, not run. The sourcing script sets ME (its name, for messages), HADIR (the folder),
# PG_BIN, MPORT (the monitor's port) and defines node_port NAME; sourcing moves HADIR under /tmp
# when the postgres user cannot reach it (reach_dir).
#
# pg_autoctl refuses root: every service runs as the postgres user, each under `setsid` so that
# `kill_node` can SIGKILL the node's whole process group (keeper, postmaster, backends) at once,
# the way a machine is lost. pg_autoctl's config, state and pid files go under $HADIR too
# (XDG_*), never into the postgres user's home.

as_pg() {
  local env=(env "XDG_CONFIG_HOME=$HADIR/xdg/config" "XDG_DATA_HOME=$HADIR/xdg/share"
             "XDG_RUNTIME_DIR=$HADIR/xdg/run" "PATH=$PATH" "HOME=$HADIR")
  # `env -C /`: PostgreSQL's programs print 'could not change directory to "<cwd>"' when they
  # start in a folder the postgres user cannot enter (a checkout under a 0700 home); every path
  # given to them is absolute.
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- env -C / "${env[@]:1}" "$@"; else "${env[@]}" "$@"; fi
}

autoctl() { as_pg pg_autoctl "$@"; }

monitor_url() { echo "postgres://autoctl_node@127.0.0.1:${MPORT}/pg_auto_failover?sslmode=disable"; }

mpsql() { psql -X -q -At -h 127.0.0.1 -p "$MPORT" -U postgres -d pg_auto_failover "$@"; }

reach_dir() {  # every command of the script, not `up` alone, finds the folder the postgres user uses
  # A checkout under a private home (root's 0700, a `mktemp -d`) is out of the postgres user's
  # reach: its folder is then one under /tmp named for HADIR (explicit or default alike).
  [ "$(id -u)" -eq 0 ] || return 0
  local probe=$HADIR
  while [ ! -d "$probe" ]; do probe=$(dirname "$probe"); done
  if ! runuser -u postgres -- test -x "$probe"; then
    HADIR="/tmp/idem-${ME%.sh}-$(echo "$HADIR" | md5sum | cut -c1-8)"
  fi
}
reach_dir

pick_dir() {  # HADIR made, the postgres user's, with pg_autoctl's XDG folders in it
  mkdir -p "$HADIR"
  if [ "$(id -u)" -eq 0 ]; then chown postgres: "$HADIR"; fi
  as_pg mkdir -p "$HADIR/xdg/config" "$HADIR/xdg/share" "$HADIR/xdg/run"
  as_pg chmod 700 "$HADIR/xdg/run"
}

run_service() {  # `pg_autoctl run` for one data directory, in a session of its own
  local name=$1
  if service_pid "$name" >/dev/null; then return 0; fi
  if [ "$(id -u)" -eq 0 ]; then
    setsid runuser -u postgres -- env -C / "XDG_CONFIG_HOME=$HADIR/xdg/config" "XDG_DATA_HOME=$HADIR/xdg/share" \
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
  # Our ports lie in the kernel's ephemeral range: a client's outgoing connection (a keeper's, to
  # the monitor) may hold one, and its socket keeps it for a minute in TIME_WAIT once closed.
  # Postgres then starts with its IPv6 socket alone: it answers on ::1 and refuses on 127.0.0.1,
  # and the monitor marks the node unhealthy for ever. Wait until no IPv4 socket holds the port,
  # and restart it. A rejoin may take a while first (pg_rewind, or a new pg_basebackup).
  local name=$1 port tries=0 deadline=$((SECONDS + 300))
  port=$(node_port "$name")
  while [ $SECONDS -lt $deadline ]; do
    ipv4_ready "$name" && return 0
    if [ -r "$HADIR/$name/postmaster.pid" ] && grep -qs "could not bind IPv4" "$(newest_log "$name")"; then
      tries=$((tries + 1))
      [ $tries -gt 5 ] && break
      local until=$((SECONDS + 75))
      while [ $SECONDS -lt $until ] && [ -n "$(ss -H -4 -tan "( sport = :$port )" 2>/dev/null | grep -v LISTEN)" ]; do
        sleep 1
      done
      as_pg "$PG_BIN/pg_ctl" -D "$HADIR/$name" -m fast -w -t 60 restart >/dev/null 2>&1 || true
    fi
    sleep 1
  done
  ipv4_ready "$name" || { echo "$ME: $name does not answer on 127.0.0.1:$port" >&2; return 1; }
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
      echo "$ME: timed out after ${secs}s waiting for $what (logs in $HADIR/*.log)" >&2
      return 1
    fi
    sleep 0.5
  done
}

node_state() {  # reported state of one node, from the monitor
  mpsql -c "SELECT reportedstate FROM pgautofailover.node WHERE nodename = '$1'" 2>/dev/null
}

is_state() { [ "$(node_state "$1")" = "$2" ]; }

monitor_up() {  # create (once) and start the monitor, with failure detection in seconds
  if [ ! -f "$HADIR/monitor/PG_VERSION" ]; then
    autoctl create monitor --pgdata "$HADIR/monitor" --pgport "$MPORT" --hostname 127.0.0.1 \
      --auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" >>"$HADIR/monitor.log" 2>&1
  fi
  run_service monitor
  ensure_ipv4 monitor  # restarted right after its creation: its port may still be held a moment
  wait_for 60 "the monitor" pg_isready -q -h 127.0.0.1 -p "$MPORT" -d pg_auto_failover
  wait_for 30 "the monitor's extension" mpsql -c "SELECT 1 FROM pgautofailover.formation"
  # Health check every 1 s, a node unhealthy after 3 s, and an unreachable primary given 3 s to
  # demote itself before its standby is promoted. Test settings: production keeps the defaults.
  mpsql -c "ALTER SYSTEM SET pgautofailover.health_check_period = 1000" \
        -c "ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000" \
        -c "ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1" \
        -c "ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500" \
        -c "ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000" \
        -c "ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 3000" \
        -c "SELECT pg_reload_conf()" >/dev/null
}

kill_node() {  # SIGKILL every process of the node (keeper, postmaster, backends): a lost machine
  local pid
  pid=$(service_pid "$1") || { echo "$ME: $1 is not running" >&2; return 1; }
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

state() { autoctl show state --pgdata "$HADIR/monitor"; }

node_verb() {  # kill|start|stop NODE, the verbs of every set-up
  case "$1" in
    kill) kill_node "${2:?node}" ;;
    start) pick_dir; run_service "${2:?node}"; [ "$2" = monitor ] || ensure_ipv4 "$2" ;;
    stop) stop_node "${2:?node}" ;;
  esac
}

walreceiver() {  # the pid of a standby's walreceiver
  psql -X -q -At -h 127.0.0.1 -p "$(node_port "$1")" -U postgres -d postgres \
    -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver'"
}
