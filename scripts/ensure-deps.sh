#!/usr/bin/env bash
# Installs what the project needs from Debian's archive, or says exactly what to install.
# Idempotent: each package is checked first, so a warm machine pays nothing.
#
#   ensure-deps.sh [demo] [--list]
#
# demo: only what `make demo` needs (a local cluster with pg_cron preloaded); without it, what
# every target needs (`make test`). --list prints the packages, one a line, and installs nothing.
set -euo pipefail

PG_MAJOR=${PG_MAJOR:-15}
demo_packages=(
  "postgresql-${PG_MAJOR}"                    # server binaries (initdb, pg_ctl, pgbench)
  "postgresql-${PG_MAJOR}-cron"               # pg_cron, preloaded by the local cluster (scripts/db.sh)
)
packages=(
  "${demo_packages[@]}"
  "postgresql-${PG_MAJOR}-pgtap"              # pgTAP
  "postgresql-${PG_MAJOR}-plpgsql-check"      # the PL/pgSQL linter
  "libtap-parser-sourcehandler-pgtap-perl"    # pg_prove
  "pgbouncer"                                 # the e2e tests' transaction pooler
  "postgresql-${PG_MAJOR}-auto-failover"      # pg_auto_failover's monitor extension (make ha-up, failover e2e)
  "pg-auto-failover-cli"                      # pg_autoctl, the keeper that runs each node
  "wrk"                                       # the HTTP load generator of make bench
  "prometheus"                                # promtool: make test-rules checks and unit-tests the alert rules
  "iproute2"                                  # ss: scripts/autoctl-lib.sh waits until a restarting node's port is free
  # Building Citus from its source (make citus, scripts/citus-build.sh). Installing the server
  # headers upgrades postgresql-15 to their minor version: done here, before any cluster starts.
  "postgresql-server-dev-${PG_MAJOR}"
  "build-essential" "patch"
  "libkrb5-dev" "liblz4-dev" "libzstd-dev" "libcurl4-openssl-dev"
)

group=all list=0
for arg in "$@"; do
  case $arg in
    demo) group=demo ;;
    --list) list=1 ;;
    *) echo "ensure-deps: unknown argument $arg (usage: ensure-deps.sh [demo] [--list])" >&2; exit 2 ;;
  esac
done
[ "$group" = demo ] && packages=("${demo_packages[@]}")
if [ "$list" = 1 ]; then printf '%s\n' "${packages[@]}"; exit 0; fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  echo "ensure-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's postgresql package starts a cluster on 5432; the project runs its own.
  if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters -h 2>/dev/null | awk '$4=="online"{print $1, $2}' | while read -r v c; do
      pg_ctlcluster "$v" "$c" stop || true
    done
  fi
else
  echo "ensure-deps: missing Debian packages. Run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
