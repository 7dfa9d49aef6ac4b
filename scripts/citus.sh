#!/usr/bin/env bash
# A local Citus cluster for development and `make test-citus`: a coordinator and two workers,
# `citus.sh up | down | status | url | createdb NAME | dropdb NAME | stop NODE`.
# Data under .citus/cluster/{coordinator,worker1,worker2} (gitignored), run as the postgres
# user, on 127.0.0.1:$CITUS_PORT (coordinator, default IDEM_PGPORT+1) and the two next ports
# (workers), trust auth (any local user connects as any role, the superuser included, without a
# password: a developer's own machine only). pg_cron is preloaded on the coordinator only: it schedules the cleanup,
# which then runs shard by shard (docs/scaling.md).
# Each database of the cluster needs the extension on every node and the workers registered in
# it (pg_dist_node is per database): `createdb` does both, `up` does it for database idem.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
BASE=${CITUS_PORT:-$(( ${IDEM_PGPORT:-54329} + 1 ))}
PORTS=("$BASE" "$((BASE + 1))" "$((BASE + 2))")
NAMES=(coordinator worker1 worker2)
DIR=$(realpath -m "${CITUS_DIR:-$here/.citus/cluster}")  # absolute: as_pg runs from /
DB=${IDEM_PGDATABASE:-idem}

as_pg() {  # initdb refuses to run as root: run the cluster as the postgres user there.
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- env -C / "$@"; else "$@"; fi
}
psql_at() { local port=$1; shift; psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }

pick_dir() {
  # The postgres user must reach the data directory; a checkout under a private home may not
  # allow that, so fall back to a directory under /tmp (one per checkout).
  mkdir -p "$DIR"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$DIR"
    if ! runuser -u postgres -- test -w "$DIR"; then
      DIR=/tmp/idem-citus-$(echo "$here" | md5sum | cut -c1-8)
      mkdir -p "$DIR" && chown postgres: "$DIR"
    fi
  fi
}

node_conf() {  # $1 = index
  local i=$1 preload="citus"
  [ "$i" -eq 0 ] && preload="citus,pg_cron"
  cat <<CONF
# --- idem: project-local Citus node (${NAMES[$i]}) ---
listen_addresses = '127.0.0.1'
port = ${PORTS[$i]}
unix_socket_directories = '$DIR/${NAMES[$i]}.run'
shared_preload_libraries = '${preload}'
cron.database_name = '${DB}'
cron.timezone = 'UTC'
timezone = 'UTC'
max_connections = 200
max_worker_processes = 64          # Citus runs a maintenance worker per database with the extension
max_prepared_transactions = 100   # Citus's two-phase commit (a transaction across nodes)
fsync = off                       # throwaway cluster: speed over durability
synchronous_commit = off
full_page_writes = off
wal_level = logical               # citus_move_shard_placement copies a shard by logical replication
max_wal_senders = 10
max_replication_slots = 10
shared_buffers = 64MB
track_functions = 'pl'
log_min_messages = warning
CONF
}

createdb_on() {  # $1 = node index, $2 = database
  if ! psql_at "${PORTS[$1]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$2'" | grep -q 1; then
    psql_at "${PORTS[$1]}" -d postgres -c "CREATE DATABASE \"$2\""
  fi
  psql_at "${PORTS[$1]}" -d "$2" -c "SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS citus"
}

createdb() {  # the database on every node, the extension in each, the workers registered
  local name=$1 i pids=()
  # The three nodes at once: CREATE EXTENSION citus takes seconds on a busy machine.
  for i in 0 1 2; do createdb_on "$i" "$name" & pids+=($!); done
  for i in "${pids[@]}"; do wait "$i"; done
  # Under the lock idem migrate takes (docs/scaling.md): adding a node copies every role to it (an
  # ALTER ROLE each), and beside another database's install or node one of the two failed.
  psql_at "${PORTS[0]}" -d "$name" -tA >/dev/null <<SQL
SET client_min_messages = warning;
BEGIN;
SELECT 1 FROM pg_catalog.pg_authid WHERE oid = 10 FOR UPDATE;
SELECT citus_set_coordinator_host('127.0.0.1', ${PORTS[0]});
SELECT citus_add_node('127.0.0.1', ${PORTS[1]});
SELECT citus_add_node('127.0.0.1', ${PORTS[2]});
COMMIT;
SQL
}

dropdb() {
  local name=$1 i
  for i in 2 1 0; do
    psql_at "${PORTS[$i]}" -d postgres -c "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" 2>/dev/null || true
  done
  psql_at "${PORTS[0]}" -d "$DB" -c "SELECT cron.unschedule(jobid) FROM cron.job WHERE database = '$name'" \
    >/dev/null 2>&1 || true
}

up() {
  if [ ! -f "$(${PG_BIN}/pg_config --pkglibdir)/citus.so" ]; then
    echo "citus.sh: Citus is not installed: run make citus" >&2; exit 2
  fi
  pick_dir
  local i data
  for i in 0 1 2; do
    data=$DIR/${NAMES[$i]}
    if [ ! -f "$data/PG_VERSION" ]; then
      as_pg mkdir -p "$data" "$DIR/${NAMES[$i]}.run"
      as_pg "$PG_BIN/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
      node_conf "$i" | as_pg tee -a "$data/postgresql.conf" >/dev/null
    fi
    if ! as_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$DIR/${NAMES[$i]}.log" -w -t 60 start >/dev/null; then
        echo "citus.sh: ${NAMES[$i]} in $data did not start; the end of $DIR/${NAMES[$i]}.log:" >&2
        tail -n 4 "$DIR/${NAMES[$i]}.log" >&2
        return 1
      fi
    fi
  done
  createdb "$DB"
  # pg_cron lives on the coordinator only: its CREATE EXTENSION must not propagate to the workers.
  psql_at "${PORTS[0]}" -d "$DB" -c "SET client_min_messages = warning; SET citus.enable_ddl_propagation = off; CREATE EXTENSION IF NOT EXISTS pg_cron"
  echo "citus.sh: up: coordinator $(url) (workers on ${PORTS[1]}, ${PORTS[2]}; data in $DIR)" >&2
}

down() {
  local i d
  for i in 2 1 0; do
    for d in "$DIR/${NAMES[$i]}" "/tmp/idem-citus-$(echo "$here" | md5sum | cut -c1-8)/${NAMES[$i]}"; do
      if [ -f "$d/postmaster.pid" ]; then as_pg "$PG_BIN/pg_ctl" -D "$d" -m fast -w stop >/dev/null; fi
    done
  done
}

stop_node() {  # one node, for the test of an unreachable worker (`up` starts it again)
  local i
  for i in 0 1 2; do
    if [ "${NAMES[$i]}" = "$1" ]; then
      pick_dir
      as_pg "$PG_BIN/pg_ctl" -D "$DIR/${NAMES[$i]}" -m fast -w stop >/dev/null
      return 0
    fi
  done
  echo "citus.sh: no node $1 (${NAMES[*]})" >&2; return 2
}

url() { echo "postgresql://postgres@127.0.0.1:${PORTS[0]}/${1:-$DB}"; }

case "${1:-}" in
  up) up ;;
  down) down ;;
  url) url "${2:-}" ;;
  createdb) createdb "${2:?createdb NAME}" ;;
  dropdb) dropdb "${2:?dropdb NAME}" ;;
  stop) stop_node "${2:?stop coordinator|worker1|worker2}" ;;
  status) for p in "${PORTS[@]}"; do pg_isready -h 127.0.0.1 -p "$p"; done ;;
  *) echo "usage: $0 up|down|status|url [DB]|createdb NAME|dropdb NAME|stop NODE" >&2; exit 2 ;;
esac
