#!/usr/bin/env bash
# A throwaway, project-local PostgreSQL cluster: `db.sh up | down | status | url | port`.
# Data and socket live under $IDEM_PGDIR (default .pg/ in the checkout, ignored by git);
# it listens on 127.0.0.1:$IDEM_PGPORT (default 54329) with pg_cron preloaded and trust auth:
# any local user may connect as any role, the superuser included, without a password, so it is
# for a developer's own machine only, never a shared host (README.md, docs/security.md).
# The port is fixed in the cluster's postgresql.conf when it is created: `db.sh port` reads it
# back (the Makefile uses it when IDEM_PGPORT is unset, so any shell finds the cluster), and
# `up` refuses an IDEM_PGPORT that is not the cluster's, saying which port it is on.
# With DATABASE_URL set, every command leaves the local cluster alone.
# IDEM_PG_DURABLE=1 builds the cluster the way production runs (fsync, synchronous_commit and
# full_page_writes on): the benchmark's own cluster (`make bench`, data in .pg-bench/).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PORT=${IDEM_PGPORT:-54329}
DB=${IDEM_PGDATABASE:-idem}
PGDIR=$(realpath -m "${IDEM_PGDIR:-$here/.pg}")  # absolute: as_pg runs from /

as_pg() {  # initdb refuses to run as root: run the cluster as the postgres user there.
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- env -C / "$@"; else "$@"; fi
}

local_url() { echo "postgresql://postgres@127.0.0.1:${PORT}/${DB}"; }

fallback_pgdir() {  # one per checkout and cluster (.pg, .pg-bench)
  local suffix=""
  [ "$PGDIR" != "$here/.pg" ] && suffix="-$(basename "$PGDIR")"
  echo "/tmp/idem-pg-$(echo "$here" | md5sum | cut -c1-8)${suffix}"
}

data_dirs() {  # where a cluster of this checkout may live (see pick_pgdir)
  echo "$PGDIR/data"
  echo "$(fallback_pgdir)/data"
}

cluster_port() {  # the port of this checkout's cluster: the running one's, else the configured one
  local d
  for d in $(data_dirs); do
    if [ -r "$d/postmaster.pid" ]; then sed -n 4p "$d/postmaster.pid"; return 0; fi
  done
  for d in $(data_dirs); do
    if [ -r "$d/postgresql.conf" ]; then
      sed -nE 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p' "$d/postgresql.conf" | tail -1
      return 0
    fi
  done
  return 1
}

pick_pgdir() {
  # The postgres user must be able to reach the data directory; a checkout under a
  # private home may not allow that, so fall back to a directory under /tmp.
  mkdir -p "$PGDIR"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$PGDIR"
    if ! runuser -u postgres -- test -w "$PGDIR"; then
      PGDIR=$(fallback_pgdir)
      mkdir -p "$PGDIR" && chown postgres: "$PGDIR"
    fi
  fi
}

up() {
  if [ -n "${DATABASE_URL:-}" ]; then
    echo "db.sh: DATABASE_URL is set; using that server" >&2; return 0
  fi
  local existing
  if existing=$(cluster_port 2>/dev/null) && [ -n "$existing" ] && [ "$existing" != "$PORT" ]; then
    echo "db.sh: the project's cluster is on port $existing, not $PORT (IDEM_PGPORT):" \
         "unset IDEM_PGPORT (make finds the port itself) or export IDEM_PGPORT=$existing" >&2
    exit 1
  fi
  pick_pgdir
  local data=$PGDIR/data run=$PGDIR/run
  if [ ! -f "$data/PG_VERSION" ]; then
    as_pg mkdir -p "$data" "$run"
    as_pg "$PG_BIN/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    if [ "${IDEM_PG_DURABLE:-0}" = 1 ]; then
      durability="fsync = on                       # production shape: every commit waits for the WAL
synchronous_commit = on
full_page_writes = on
max_wal_size = 4GB                # the 10 M-row load must not checkpoint every few seconds
checkpoint_timeout = 15min"
    else
      durability="fsync = off                      # throwaway cluster: speed over durability
synchronous_commit = off
full_page_writes = off"
    fi
    cat <<CONF | as_pg tee -a "$data/postgresql.conf" >/dev/null
# --- idem: project-local settings ---
listen_addresses = '127.0.0.1'
port = ${PORT}
unix_socket_directories = '${run}'
shared_preload_libraries = 'pg_cron'
cron.database_name = '${DB}'
cron.timezone = 'UTC'
timezone = 'UTC'
max_connections = 200
max_prepared_transactions = 10     # tests: a prepared transaction holding DDL across idem migrate
${durability}
track_functions = 'pl'
log_min_messages = warning
log_line_prefix = '%m [%p] %qdb=%d '  # tests read their own database's lines of a shared log
CONF
  fi
  if ! as_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$PGDIR/server.log" -w -t 60 start >/dev/null; then
      # pg_ctl only says "examine the log": show why (e.g. another server already on the port).
      echo "db.sh: the cluster in $data did not start; the end of $PGDIR/server.log:" >&2
      tail -n 4 "$PGDIR/server.log" >&2
      return 1
    fi
  fi
  local psql=(psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres)
  if ! "${psql[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '${DB}'" | grep -q 1; then
    "${psql[@]}" -d postgres -c "CREATE DATABASE ${DB}"
  fi
  # pg_cron lives in cron.database_name only; a superuser creates it, never a migration.
  "${psql[@]}" -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS pg_cron" 2>/dev/null || true
  echo "db.sh: up at $(local_url) (data in $data)" >&2
}

down() {
  [ -n "${DATABASE_URL:-}" ] && { echo "db.sh: DATABASE_URL is set; nothing to stop" >&2; return 0; }
  for d in "$PGDIR/data" "$(fallback_pgdir)/data"; do
    if [ -f "$d/postmaster.pid" ]; then as_pg "$PG_BIN/pg_ctl" -D "$d" -m fast -w stop >/dev/null; fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  url) echo "${DATABASE_URL:-$(local_url)}" ;;
  status) pg_isready -h 127.0.0.1 -p "$PORT" ;;
  port) cluster_port ;;   # fails when this checkout has no cluster yet
  *) echo "usage: $0 up|down|status|url|port" >&2; exit 2 ;;
esac
