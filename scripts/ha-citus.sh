#!/usr/bin/env bash
# A Citus formation under pg_auto_failover (contract §8): a monitor, a coordinator, and worker groups
# of a primary and its synchronous standby, on 127.0.0.1 (data in $IDEM_HA_CITUS_DIR, default
# .ha-citus/). The monitor promotes a worker's standby when its primary is lost, and the new
# primary's keeper points the coordinator's metadata at itself (citus_update_node).
#
#   ha-citus.sh up | down | state | url | nodes | add-worker [GROUP] | drop-worker GROUP
#             | rebalance | rebalance-status | failed | wait [SECONDS] | primary GROUP | standby GROUP
#             | port NODE | kill NODE | start NODE | stop NODE
#
# Nodes: monitor, coord0a (and coord0b with IDEM_HA_CITUS_COORD_STANDBY=1), worker1a/worker1b,
# worker2a/worker2b, worker3a/worker3b (a group's "a" is its first primary; after a failover the
# roles swap, the names stay). Ports: the monitor on $IDEM_HA_CITUS_PORT (IDEM_PGPORT + 20), the
# coordinator on the next two, group G on +1+2G and +2+2G (the last, group 3, on +8).
#
# Sized for two shared cores: small shared_buffers, 100 connections, 6 shards per table
# (citus.shard_count, so a rebalance moves a handful of shard groups, not 32), the coordinator
# without a standby unless asked. Durable as in production: fsync, full_page_writes and
# synchronous_commit on, every worker's standby in the replication quorum (synchronous); pg_cron on
# the coordinator only (it schedules the cleanup, which runs shard by shard). The monitor's health
# checks and the keepers' citus_update_node lock cooldown are shortened (a failover in seconds):
# test settings, docs/scaling.md says which.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
DB=${IDEM_PGDATABASE:-idem}
HADIR=$(realpath -m "${IDEM_HA_CITUS_DIR:-$here/.ha-citus}")  # absolute: as_pg runs from /
MPORT=${IDEM_HA_CITUS_PORT:-$(( ${IDEM_PGPORT:-54329} + 20 ))}
WORKERS=${IDEM_HA_CITUS_WORKERS:-2}
COORD_STANDBY=${IDEM_HA_CITUS_COORD_STANDBY:-0}
SHARDS=${IDEM_HA_CITUS_SHARDS:-6}
MAX_GROUPS=3
export PATH="$PG_BIN:$PATH"
ME=ha-citus.sh

node_port() {
  case "$1" in
    monitor) echo "$MPORT" ;;
    coord0a) echo $((MPORT + 1)) ;;
    coord0b) echo $((MPORT + 2)) ;;
    worker[1-3][ab])
      local g=${1:6:1} off=1
      [ "${1:7:1}" = b ] && off=2
      echo $((MPORT + 2 * g + off))
      ;;
    *) echo "$ME: unknown node $1 (monitor, coord0a, coord0b, worker1a ... worker${MAX_GROUPS}b)" >&2; exit 2 ;;
  esac
}

# shellcheck source=scripts/autoctl-lib.sh
. "$here/scripts/autoctl-lib.sh"

group_of() { case "$1" in coord0?) echo 0 ;; worker*) echo "${1:6:1}" ;; esac; }

need_monitor() {
  if ! mpsql -c "SELECT 1" >/dev/null 2>&1; then
    echo "$ME: the formation is not up: its monitor does not answer on 127.0.0.1:$MPORT (make ha-citus-up)" >&2
    exit 1
  fi
}

need_up() {  # the verbs that change the formation need its monitor and a coordinator
  need_monitor
  if [ -z "$(primary 0)" ]; then
    echo "$ME: the formation has no coordinator primary now: see make ha-citus-state" >&2
    exit 1
  fi
}

cpsql() {  # psql on the coordinator's primary, in the formation's database
  local port
  port=$(node_port "$(primary 0)")
  psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$DB" "$@"
}

coordinators() { if [ "$COORD_STANDBY" = 1 ]; then echo coord0a coord0b; else echo coord0a; fi; }

url() {  # the coordinator: every node of group 0, the one that takes writes
  local hosts="" n
  for n in $(coordinators); do hosts="${hosts:+$hosts,}127.0.0.1:$(node_port "$n")"; done
  echo "postgresql://postgres@${hosts}/${DB}?target_session_attrs=read-write"
}

node_conf() {  # the settings of a primary (its standby is a pg_basebackup of it and inherits them)
  local kind=$1 preload=citus cron=""
  if [ "$kind" = coordinator ]; then
    preload="citus,pg_cron,pg_stat_statements"
    # pg_cron in background workers, not over libpq (cron.job keeps the scheduling node's port)
    cron="cron.database_name = '${DB}'
cron.timezone = 'UTC'
cron.use_background_workers = on
citus.shard_count = ${SHARDS}
citus.background_task_queue_interval = 1000   # a rebalance's moves start within a second"
  fi
  cat <<CONF
# --- idem: a node of the Citus formation (after pg_auto_failover's include, so these win) ---
shared_preload_libraries = '${preload}'
${cron}
max_worker_processes = 24         # Citus's maintenance and background task workers, pg_cron's jobs
max_connections = 100
max_prepared_transactions = 50    # Citus's two-phase commit; pg_autoctl's citus_update_node
shared_buffers = '32MB'           # pg_autoctl sizes it for the whole machine; many servers share it
wal_level = logical               # shard moves copy by logical replication (force_logical)
max_wal_senders = 16
max_replication_slots = 16
wal_keep_size = '256MB'
fsync = on
full_page_writes = on
synchronous_commit = on
timezone = 'UTC'
track_functions = 'pl'
log_min_messages = warning
CONF
}

init_primary() {  # initdb here, so that our settings follow pg_autoctl's include and win
  local name=$1 kind=$2
  as_pg "$PG_BIN/initdb" -D "$HADIR/$name" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  node_conf "$kind" | as_pg tee -a "$HADIR/$name/postgresql.conf" >/dev/null
}

create_node() {  # create_node NAME: pg_autoctl create coordinator|worker, registered with the monitor
  local name=$1 group kind
  group=$(group_of "$name")
  if [ "$group" = 0 ]; then kind=coordinator; else kind=worker; fi
  local args=(--pgdata "$HADIR/$name" --pgport "$(node_port "$name")" --hostname 127.0.0.1 --name "$name"
              --dbname "$DB" --auth trust --no-ssl --pgctl "$PG_BIN/pg_ctl" --monitor "$(monitor_url)")
  [ "$kind" = worker ] && args+=(--group "$group")
  if ! autoctl create "$kind" "${args[@]}" >>"$HADIR/$name.log" 2>&1; then
    echo "$ME: the formation refused $name: $(refusal "$name")" >&2
    return 1
  fi
  if [ "$kind" = worker ]; then  # a promotion waits this long for the shards' locks, then cancels
    autoctl config set --pgdata "$HADIR/$name" timeout.citus_master_update_node_lock_cooldown 2000 >/dev/null
  fi
}

refusal() {  # the first line of a node's log that says why pg_autoctl gave up
  grep -E " (ERROR|FATAL) " "$HADIR/$1.log" | grep -v -i -E "see above|sub-process supervision" | head -1 \
    | sed -E 's/^.* (ERROR|FATAL) +//'
}

primary() {  # the node of group $1 that the monitor has made primary and that says it is
  mpsql -c "SELECT nodename FROM pgautofailover.node
             WHERE groupid = $1 AND reportedstate IN ('primary', 'wait_primary', 'single')
               AND goalstate IN ('primary', 'wait_primary', 'single') ORDER BY nodeid LIMIT 1"
}

has_primary() { test -n "$(primary "$1")"; }

standby() {
  mpsql -c "SELECT nodename FROM pgautofailover.node WHERE groupid = $1 AND reportedstate = 'secondary'
             ORDER BY nodeid LIMIT 1"
}

group_states() {  # the reported states of a group's nodes, sorted: "primary,secondary" when whole
  mpsql -c "SELECT string_agg(reportedstate::text, ',' ORDER BY reportedstate::text)
              FROM pgautofailover.node WHERE groupid = $1"
}

group_whole() {
  local want=primary,secondary
  [ "$1" = 0 ] && [ "$COORD_STANDBY" != 1 ] && want=single
  [ "$(group_states "$1")" = "$want" ]
}

synced() {  # every node with Citus metadata has the coordinator's current copy (moves need it)
  [ "$(cpsql -c "SELECT bool_and(metadatasynced) FROM pg_dist_node WHERE hasmetadata")" = t ]
}

active_in_citus() {  # group $1's primary is an active worker in the coordinator's metadata
  local p
  p=$(primary "$1")
  [ -n "$p" ] && [ "$(cpsql -c "SELECT count(*) FROM pg_dist_node WHERE nodeport = $(node_port "$p")
                                  AND isactive AND noderole = 'primary' AND groupid = $1")" = 1 ]
}

groups() {  # the worker groups the monitor knows
  mpsql -c "SELECT DISTINCT groupid FROM pgautofailover.node WHERE groupid > 0 ORDER BY 1" 2>/dev/null | tr '\n' ' '
}

node_names() {  # every node of this formation with a data directory, the monitor first
  local n
  echo monitor
  for n in coord0a coord0b worker1a worker1b worker2a worker2b worker3a worker3b; do
    [ -f "$HADIR/$n/PG_VERSION" ] && echo "$n"
  done
  return 0
}

start_group() {  # create (once) and start a group's primary, then its standby
  # (explicit returns: add_worker calls this where errexit does not apply)
  local g=$1 a b kind=worker
  if [ "$g" = 0 ]; then a=coord0a; b=coord0b; kind=coordinator; else a=worker${g}a; b=worker${g}b; fi
  if [ ! -f "$HADIR/$a/PG_VERSION" ]; then
    init_primary "$a" "$kind" || return 1
    create_node "$a" || return 1
  fi
  run_service "$a"
  ensure_ipv4 "$a" || return 1
  wait_for 180 "a primary in group $g" has_primary "$g" || return 1
  if [ "$g" = 0 ] && [ "$COORD_STANDBY" != 1 ]; then return 0; fi
  if [ ! -f "$HADIR/$b/PG_VERSION" ]; then create_node "$b" || return 1; fi
  run_service "$b"
  ensure_ipv4 "$b"
}

up() {
  if [ ! -f "$("$PG_BIN/pg_config" --pkglibdir)/citus.so" ]; then
    echo "$ME: Citus is not installed: run make citus" >&2; exit 2
  fi
  pick_dir
  monitor_up
  start_group 0
  wait_for 180 "the coordinator" group_whole 0
  wait_for 60 "the coordinator's database" cpsql -c "SELECT 1 FROM pg_extension WHERE extname = 'citus'"
  # pg_cron lives on the coordinator only: its CREATE EXTENSION must not propagate to the workers
  cpsql -c "SET client_min_messages = warning; SET citus.enable_ddl_propagation = off;
            CREATE EXTENSION IF NOT EXISTS pg_cron" >/dev/null
  local g pids=()
  # the groups side by side: each waits for a basebackup and its first checkpoint
  for g in $(seq 1 "$WORKERS"); do start_group "$g" & pids+=($!); done
  for g in "${pids[@]}"; do wait "$g"; done
  for g in $(seq 1 "$WORKERS"); do
    wait_for 240 "worker group $g (a primary and its standby)" group_whole "$g"
    wait_for 120 "worker group $g active in the coordinator's metadata" active_in_citus "$g"
  done
  wait_for 120 "the workers' copy of the metadata" synced
  echo "$ME: up: monitor on $MPORT, coordinator $(primary 0); workers: $(workers_line); $(url)" >&2
}

workers_line() {
  local g out=""
  for g in $(groups); do out="${out:+$out, }group $g $(primary "$g") + $(standby "$g")"; done
  echo "${out:-none}"
}

add_worker() {  # a new worker group, primary and standby, active in the coordinator's metadata
  local g=${1:-}
  if [ -z "$g" ]; then
    for g in $(seq 1 "$MAX_GROUPS"); do case " $(groups) " in *" $g "*) ;; *) break ;; esac; done
  fi
  case " $(groups) " in *" $g "*)
    echo "$ME: worker group $g is already in the formation ($(group_states "$g")): add another group, or" \
         "drop it first (make ha-citus-drop-worker GROUP=$g)" >&2; exit 1 ;;
  esac
  if ! [[ "$g" =~ ^[1-9]$ ]] || [ "$g" -gt "$MAX_GROUPS" ]; then
    echo "$ME: this formation has room for worker groups 1 to $MAX_GROUPS (ports $((MPORT + 3))..$((MPORT + 2 + 2 * MAX_GROUPS))); got '$g'" >&2
    exit 1
  fi
  local n
  for n in "worker${g}a" "worker${g}b"; do
    if ! service_pid "$n" >/dev/null && ! port_free "$(node_port "$n")"; then
      echo "$ME: port $(node_port "$n") for $n is in use by another program: free it first" >&2; exit 1
    fi
    kill_node "$n" 2>/dev/null || true  # not in the formation: what a dropped or failed group left
    forget_node "$n"
  done
  if ! { start_group "$g" && wait_for 240 "worker group $g (a primary and its standby)" group_whole "$g" \
          && wait_for 120 "worker group $g active in the coordinator's metadata" active_in_citus "$g" \
          && wait_for 120 "the workers' copy of the metadata" synced; }; then
    echo "$ME: worker group $g was not added; what was created of it is removed again (logs kept in $HADIR/failed-*.log)" >&2
    for n in "worker${g}b" "worker${g}a"; do
      [ -f "$HADIR/$n.log" ] && cp "$HADIR/$n.log" "$HADIR/failed-$n.log"
      kill_node "$n" 2>/dev/null || true
      cpsql -c "SELECT citus_remove_node('127.0.0.1', $(node_port "$n")) FROM pg_dist_node
                 WHERE nodeport = $(node_port "$n")" >/dev/null 2>&1 || true
      forget_node "$n"
    done
    exit 1
  fi
  echo "$ME: worker group $g added ($(primary "$g") primary, $(standby "$g") standby): $(placements "$g") shard" \
       "placements there; move shards with make ha-citus-rebalance" >&2
}

forget_node() {  # a node's data, its pg_autoctl state and config, and its entry in the monitor
  # (a node created again at the same path would otherwise read the old node's state)
  mpsql -c "SELECT pgautofailover.remove_node(nodeid, true) FROM pgautofailover.node WHERE nodename = '$1'" \
    >/dev/null 2>&1 || true
  rm -rf "${HADIR:?}/$1" "$HADIR/$1.log" "$HADIR/$1.session" \
         "$HADIR/xdg/config/pg_autoctl$HADIR/$1" "$HADIR/xdg/share/pg_autoctl$HADIR/$1"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

placements() {  # shard placements of the store's colocation group on group $1
  cpsql -c "SELECT count(*) FROM pg_dist_placement p JOIN pg_dist_shard s USING (shardid)
             WHERE p.groupid = $1 AND s.logicalrelid = 'public.idempotency_keys'::regclass" 2>/dev/null || echo '?'
}

rebalance() {  # citus_rebalance_start without blocking writes, then follow it to its end
  local mode=${1:-} job
  local drain=false
  [ "$mode" = drain ] && drain=true
  if ! job=$(cpsql -c "SET client_min_messages = warning;
                       SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical', drain_only => $drain)" 2>&1); then
    local running
    running=$(cpsql -c "SELECT job_id FROM pg_dist_background_job WHERE job_type = 'rebalance'
                         AND state IN ('scheduled', 'running', 'cancelling', 'failing') ORDER BY job_id LIMIT 1" 2>/dev/null || true)
    if [ -n "$running" ]; then
      echo "$ME: a rebalance is already running (job $running, $(job_progress "$running")): nothing started;" \
           "wait for it (make ha-citus-rebalance-status) or stop it (SELECT citus_rebalance_stop();)" >&2
    else
      echo "$ME: the rebalance did not start: ${job#ERROR:  }" >&2
    fi
    exit 1
  fi
  if [ -z "$job" ]; then
    echo "$ME: nothing to move: the shards are balanced over $(cpsql -c "SELECT count(*) FROM pg_dist_node
          WHERE groupid > 0 AND isactive AND shouldhaveshards AND noderole = 'primary'") workers" >&2
    return 0
  fi
  echo "$ME: rebalance job $job started (shard_transfer_mode force_logical: writes continue)" >&2
  follow_job "$job"
}

job_progress() {  # "N of M moves done" for background job $1
  cpsql -c "SELECT count(*) FILTER (WHERE status = 'done') || ' of ' || count(*) || ' moves done'
              FROM pg_dist_background_task WHERE job_id = $1"
}

follow_job() {  # print the job's progress until it ends; exit 1 with the failed move's message
  local job=$1 state last=""
  while :; do
    state=$(cpsql -c "SELECT state FROM pg_dist_background_job WHERE job_id = $job")
    case "$state" in
      finished) echo "$ME: rebalance job $job finished: $(job_progress "$job"); $(spread)" >&2; return 0 ;;
      failed|cancelled)
        echo "$ME: rebalance job $job $state: $(job_progress "$job"); $(job_error "$job")." \
             "Citus dropped what the failed move had copied (pg_dist_cleanup); nothing is lost: run" \
             "make ha-citus-rebalance again" >&2
        return 1 ;;
    esac
    local now
    now=$(job_progress "$job")
    if [ "$now" != "$last" ]; then echo "$ME: rebalance job $job $state: $now" >&2; last=$now; fi
    sleep 1
  done
}

job_error() {
  cpsql -c "SELECT COALESCE(string_agg(DISTINCT regexp_replace(message, '\s+', ' ', 'g'), '; '), 'no message')
              FROM pg_dist_background_task WHERE job_id = $1 AND status IN ('error', 'cancelled')
               AND message IS NOT NULL AND message <> ''"
}

spread() {  # the store's shards per worker
  cpsql -c "SELECT 'shards per worker: ' || string_agg(n.nodename || ':' || n.nodeport || ' ' || c, ', ' ORDER BY n.groupid)
              FROM (SELECT p.groupid, count(*) c FROM pg_dist_placement p JOIN pg_dist_shard s USING (shardid)
                     WHERE s.logicalrelid = 'public.idempotency_keys'::regclass GROUP BY p.groupid) x
              JOIN pg_dist_node n ON n.groupid = x.groupid AND n.noderole = 'primary'"
}

rebalance_status() {
  local job
  job=$(cpsql -c "SELECT job_id FROM pg_dist_background_job WHERE job_type = 'rebalance' ORDER BY job_id DESC LIMIT 1")
  if [ -z "$job" ]; then echo "$ME: no rebalance has run; $(spread)"; return 0; fi
  echo "$ME: rebalance job $job: $(cpsql -c "SELECT state FROM pg_dist_background_job WHERE job_id = $job"):" \
       "$(job_progress "$job"); $(spread)"
}

drop_worker() {  # move a group's shards away, then remove its nodes from the formation
  local g=${1:?drop-worker GROUP} p n
  case " $(groups) " in *" $g "*) ;; *) echo "$ME: worker group $g is not in the formation" >&2; exit 1 ;; esac
  p=$(primary "$g")
  [ -n "$p" ] || { echo "$ME: worker group $g has no primary now: wait for its failover, then retry" >&2; exit 1; }
  cpsql -c "SELECT citus_set_node_property('127.0.0.1', $(node_port "$p"), 'shouldhaveshards', false)" >/dev/null
  rebalance drain
  # out of the coordinator's metadata while it still answers (Citus drops its metadata there), then
  # out of the formation
  cpsql -c "SELECT citus_remove_node('127.0.0.1', $(node_port "$p"))" >/dev/null 2>&1 \
    || cpsql -c "SELECT citus_disable_node('127.0.0.1', $(node_port "$p"), synchronous => true);
                 SELECT citus_remove_node('127.0.0.1', $(node_port "$p"))" >/dev/null
  for n in "worker${g}b" "worker${g}a"; do
    [ -f "$HADIR/$n/PG_VERSION" ] || continue
    autoctl drop node --pgdata "$HADIR/$n" >>"$HADIR/$n.log" 2>&1 || true
    stop_node "$n"
    forget_node "$n"
  done
  echo "$ME: worker group $g dropped; $(spread)" >&2
}

failed() {  # nodes the monitor finds unreachable, or not (yet) in the state it assigned them
  mpsql -F ': ' -c "SELECT nodename, 'reported ' || reportedstate || ', assigned ' || goalstate
                       || CASE WHEN health = 0 THEN ' (unreachable)' ELSE '' END
                  FROM pgautofailover.node WHERE health = 0 OR reportedstate <> goalstate ORDER BY nodeid"
}

formation_whole() {
  local g
  for g in 0 $(groups); do group_whole "$g" || return 1; done
  synced
}

wait_whole() {  # until every group has its primary and synchronous standby, and the metadata is current
  wait_for "${1:-300}" "every group whole and the workers' metadata current" formation_whole
  echo "$ME: whole: every worker group has its primary and synchronous standby; the workers' metadata is current" >&2
}

down() {
  [ -d "$HADIR" ] || return 0
  local n
  for n in worker3b worker3a worker2b worker2a worker1b worker1a coord0b coord0a monitor; do stop_node "$n"; done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  state) state ;;
  url) url ;;
  dir) echo "$HADIR" ;;
  nodes) node_names ;;
  add-worker) need_up; add_worker "${2:-}" ;;
  drop-worker) need_up; drop_worker "${2:-}" ;;
  rebalance) need_up; rebalance ;;
  rebalance-status) need_up; rebalance_status ;;
  failed) need_monitor; failed ;;
  wait) need_monitor; wait_whole "${2:-}" ;;
  primary) primary "${2:?group}" ;;
  standby) standby "${2:?group}" ;;
  port) node_port "${2:?node}" ;;
  kill|start|stop) node_verb "$@" ;;
  *) echo "usage: $0 up|down|state|url|dir|nodes|add-worker [GROUP]|drop-worker GROUP|rebalance|rebalance-status" \
          "|failed|wait [SECONDS]|primary GROUP|standby GROUP|port NODE|kill NODE|start NODE|stop NODE" >&2; exit 2 ;;
esac
